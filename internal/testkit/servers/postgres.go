package servers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// PostgresOptions configures StartPostgres.
type PostgresOptions struct {
	// Dir holds the cluster's data directory, socket and log; it is created
	// and removed by Close. Its parent directories must be traversable by
	// the postgres user (t.TempDir's are not). Defaults to a new directory
	// under the system's temporary directory.
	Dir string
	// Port is the TCP port on 127.0.0.1. Defaults to a free port.
	Port int
	// Settings are server settings (postgresql.conf), e.g. "wal_level":
	// "logical". fsync is off unless set: the tests crash the server, not
	// the machine.
	Settings map[string]string
}

// Postgres is a private PostgreSQL cluster.
type Postgres struct {
	dir, data, log string
	port           int
	bin            string
}

// pgBin finds the directory of the PostgreSQL server binaries of the Debian
// packages (/usr/lib/postgresql/<version>/bin), the newest when several are
// installed.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Strings(dirs)
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb) found: install postgresql (apt-get install -y postgresql)")
}

// StartPostgres creates a cluster in o.Dir with trust authentication for
// user postgres, starts it and waits until it accepts connections.
func StartPostgres(ctx context.Context, o PostgresOptions) (*Postgres, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if o.Dir, err = serverDir(o.Dir, "sagabox-postgres-"); err != nil {
		return nil, err
	}
	p := &Postgres{dir: o.Dir, data: filepath.Join(o.Dir, "data"), log: filepath.Join(o.Dir, "postgres.log"), port: o.Port, bin: bin}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	if err := chown(o.Dir, "postgres"); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"), "postgres")
	if err != nil {
		return nil, err
	}
	if err := run(cmd); err != nil {
		return nil, fmt.Errorf("servers: initdb: %w", err)
	}
	settings := map[string]string{
		"port": fmt.Sprint(o.Port), "listen_addresses": "'127.0.0.1'", "unix_socket_directories": "'" + o.Dir + "'",
		"fsync": "off", "max_connections": "200", "shared_buffers": "'64MB'",
	}
	for k, v := range o.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var conf strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(p.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	_, err = f.WriteString("\n# servers.StartPostgres\n" + conf.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("servers: write postgresql.conf: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// URL returns the connection URL of database postgres as user postgres.
func (p *Postgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

// Port returns the server's TCP port.
func (p *Postgres) Port() int { return p.port }

// PID returns the postmaster's PID, or 0 when it is not running.
func (p *Postgres) PID() int {
	pid, err := readPID(filepath.Join(p.data, "postmaster.pid"))
	if err != nil || !alive(pid) {
		return 0
	}
	return pid
}

// Start starts the stopped server and waits until it accepts connections
// (after crash recovery, when it was killed).
func (p *Postgres) Start(ctx context.Context) error {
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(p.bin, "pg_ctl"), "start", "-D", p.data, "-l", p.log, "-w", "-t", "120"), "postgres")
	if err != nil {
		return err
	}
	if err := run(cmd); err != nil {
		tail, _ := os.ReadFile(p.log)
		return fmt.Errorf("servers: start PostgreSQL on port %d: %w\n%s", p.port, err, lastLines(string(tail), 20))
	}
	return waitPort(ctx, p.port, 2*time.Minute)
}

// Stop stops the server with pg_ctl's shutdown mode: "fast" (roll back and
// disconnect every session, checkpoint) or "immediate" (no checkpoint: the
// next start runs crash recovery).
func (p *Postgres) Stop(ctx context.Context, mode string) error {
	if p.PID() == 0 {
		return nil
	}
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(p.bin, "pg_ctl"), "stop", "-D", p.data, "-m", mode, "-w", "-t", "60"), "postgres")
	if err != nil {
		return err
	}
	if err := run(cmd); err != nil {
		return fmt.Errorf("servers: stop PostgreSQL on port %d (%s): %w", p.port, mode, err)
	}
	return nil
}

// Restart stops the server with mode and starts it again.
func (p *Postgres) Restart(ctx context.Context, mode string) error {
	if err := p.Stop(ctx, mode); err != nil {
		return err
	}
	return p.Start(ctx)
}

// Close stops the server (immediately) and removes its directory.
func (p *Postgres) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.Stop(ctx, "immediate")
	if pid := p.PID(); pid != 0 {
		err = fmt.Errorf("servers: PostgreSQL %d still running after stop: %w", pid, err)
	}
	if rerr := os.RemoveAll(p.dir); err == nil {
		err = rerr
	}
	return err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
