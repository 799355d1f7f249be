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

// readCPUOf reads the CPU times (readCPUProcs) with PostgreSQL's share
// limited to the server behind pool (its postmaster and the postmaster's
// children), when it runs on this machine: other servers' work does not
// count.
func readCPUOf(ctx context.Context, pool *pgxpool.Pool) (cpuTimes, error) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return cpuTimes{}, fmt.Errorf("find the server's processes: %w", err)
	}
	postmaster, err := procPPID(fmt.Sprintf("/proc/%d/stat", backend))
	if err != nil {
		postmaster = 0 // not on this machine: count every postgres process
	}
	return readCPUProcs(postmaster, nil)
}

// readCPUProcs sums utime+stime of every process whose comm is "postgres"
// (the postmaster, its backends and background workers; when postmaster is
// not 0, only that server's), of the RabbitMQ processes (rabbitComms), and
// of this process and the processes goPIDs (the bench's own children, e.g.
// orchestrator replicas), from /proc. The times of exited children that a
// process has reaped (cutime+cstime) are added too: a backend that exits
// during a measurement moves its time into the postmaster's cutime, so the
// sum stays monotonic and the difference of two readings is the CPU spent
// in between. Every process of those names on the machine is counted,
// whoever caused its work. A child in goPIDs that is gone fails the
// reading: its time would be lost.
func readCPUProcs(postmaster int, goPIDs []int) (cpuTimes, error) {
	var t cpuTimes
	_, self, err := procStat("/proc/self/stat")
	if err != nil {
		return t, fmt.Errorf("read CPU time of this process: %w", err)
	}
	t.Go = self
	for _, pid := range goPIDs {
		_, used, err := procStat(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return t, fmt.Errorf("read CPU time of child process %d: %w", pid, err)
		}
		t.Go += used
	}
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

// hostTicks are the host's CPU times from the "cpu" line of /proc/stat, in
// clock ticks summed over every CPU: all of them, and the part stolen by
// the hypervisor for other guests.
type hostTicks struct {
	total, steal uint64
}

// readHostTicks reads the host's CPU times.
func readHostTicks() (hostTicks, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTicks{}, fmt.Errorf("read host CPU times: %w", err)
	}
	return parseProcStat(string(b))
}

// parseProcStat reads the "cpu" line of /proc/stat: user, nice, system,
// idle, iowait, irq, softirq and steal make the total (guest and
// guest_nice, which follow, are already counted in user and nice). A
// kernel without the steal column (before 2.6.11) reports none.
func parseProcStat(stat string) (hostTicks, error) {
	for line := range strings.Lines(stat) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "cpu" {
			continue
		}
		if len(fields) < 5 {
			return hostTicks{}, fmt.Errorf("parse /proc/stat: cpu line has %d columns, want at least 4", len(fields)-1)
		}
		var h hostTicks
		for i, f := range fields[1:min(len(fields), 9)] {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return hostTicks{}, fmt.Errorf("parse /proc/stat: cpu column %d %q: %w", i+1, f, err)
			}
			h.total += n
			if i == 7 {
				h.steal = n
			}
		}
		return h, nil
	}
	return hostTicks{}, fmt.Errorf("parse /proc/stat: no cpu line")
}

// stealPercent is the share of the host's CPU time stolen between the
// readings since and h, in percent: steal ticks ÷ all ticks. Zero when no
// tick passed.
func (h hostTicks) stealPercent(since hostTicks) float64 {
	if h.total <= since.total || h.steal < since.steal {
		return 0
	}
	return round(100*float64(h.steal-since.steal)/float64(h.total-since.total), 1)
}

// usage is a reading of everything a measurement charges: the CPU time of
// PostgreSQL, RabbitMQ and the bench's processes, and the host's ticks.
type usage struct {
	cpu  cpuTimes
	host hostTicks
}

// readUsage reads the usage of the processes a measurement of p counts:
// every PostgreSQL and RabbitMQ process, this process and p's children.
func readUsage(p *pipeline) (usage, error) {
	cpu, err := readCPUProcs(0, p.children)
	if err != nil {
		return usage{}, err
	}
	host, err := readHostTicks()
	if err != nil {
		return usage{}, err
	}
	return usage{cpu: cpu, host: host}, nil
}

// spent is what n sagas cost between the readings u0 and u: CPU time per
// saga, in microseconds, of PostgreSQL, RabbitMQ and the bench's processes,
// and the host's steal in percent.
func (u usage) spent(u0 usage, n int) (pg, rmq, goCPU, steal float64) {
	pg, rmq, goCPU = perSaga(u.cpu.sub(u0.cpu), n)
	return pg, rmq, goCPU, u.host.stealPercent(u0.host)
}
