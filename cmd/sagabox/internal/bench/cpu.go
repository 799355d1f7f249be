package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat, which is
// what sysconf(_SC_CLK_TCK) returns: 100 on every Linux architecture. Go has
// no sysconf without cgo, hence the constant.
const clockTicks = 100

// rabbitComms are the processes of a RabbitMQ node: the Erlang VM and its
// helpers.
var rabbitComms = map[string]bool{"beam.smp": true, "erl_child_setup": true, "inet_gethost": true, "epmd": true}

// cpuTimes is the CPU time (user + system) consumed so far by the processes
// of PostgreSQL, of RabbitMQ and of this Go process.
type cpuTimes struct {
	Postgres, RabbitMQ, Go time.Duration
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{Postgres: a.Postgres - b.Postgres, RabbitMQ: a.RabbitMQ - b.RabbitMQ, Go: a.Go - b.Go}
}

// readCPU sums utime+stime of every process whose comm is "postgres" (the
// postmaster, its backends and background workers), of the RabbitMQ
// processes (rabbitComms), and of this process, from /proc. The times of
// exited children that a process has reaped (cutime+cstime) are added too:
// a backend that exits during a measurement moves its time into the
// postmaster's cutime, so the sum stays monotonic and the difference of two
// readings is the CPU spent in between. Every process of those names on the
// machine is counted, whoever caused its work.
func readCPU() (cpuTimes, error) { return readCPUServer(0) }

// readCPUOf is readCPU with PostgreSQL's share limited to the server
// behind pool (its postmaster and the postmaster's children), when it runs
// on this machine: other servers' work does not count.
func readCPUOf(ctx context.Context, pool *pgxpool.Pool) (cpuTimes, error) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return cpuTimes{}, fmt.Errorf("find the server's processes: %w", err)
	}
	postmaster, err := procPPID(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		postmaster = 0 // not on this machine: count every postgres process
	}
	return readCPUServer(postmaster)
}

// readCPUServer is readCPU counting, when postmaster is not 0, only that
// PostgreSQL server's processes.
func readCPUServer(postmaster int) (cpuTimes, error) {
	var t cpuTimes
	_, self, err := procStat("/proc/self/stat")
	if err != nil {
		return t, fmt.Errorf("read CPU time of this process: %w", err)
	}
	t.Go = self
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return t, fmt.Errorf("read CPU times: %w", err)
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, used, err := procStat("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // the process exited meanwhile
		}
		switch {
		case comm == "postgres" && postmaster != 0:
			if pid, _ := strconv.Atoi(e.Name()); pid == postmaster {
				t.Postgres += used
			} else if ppid, err := procPPID("/proc/" + e.Name() + "/stat"); err == nil && ppid == postmaster {
				t.Postgres += used
			}
		case comm == "postgres":
			t.Postgres += used
		case rabbitComms[comm]:
			t.RabbitMQ += used
		}
	}
	return t, nil
}

// procPPID returns the parent PID in the stat file path.
func procPPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := string(b)
	closing := strings.LastIndexByte(s, ')')
	fields := strings.Fields(s[closing+1:])
	if closing < 0 || len(fields) < 2 {
		return 0, fmt.Errorf("parse %s: no ppid", path)
	}
	return strconv.Atoi(fields[1])
}

// procStat returns the comm of the process whose stat file is path and its
// utime+stime+cutime+cstime.
func procStat(path string) (string, time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", 0, err
	}
	s := string(b)
	// comm is in parentheses and may itself contain spaces and parentheses.
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, fmt.Errorf("parse %s: no comm", path)
	}
	// fields[0] is field 3 of proc(5) (state); utime, stime, cutime and
	// cstime are fields 14 to 17.
	fields := strings.Fields(s[closing+1:])
	if len(fields) < 15 {
		return "", 0, fmt.Errorf("parse %s: %d fields", path, len(fields)+2)
	}
	var ticks int64
	for _, f := range fields[11:15] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("parse %s: %w", path, err)
		}
		ticks += n
	}
	return s[open+1 : closing], time.Duration(ticks) * time.Second / clockTicks, nil
}
