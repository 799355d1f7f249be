package servers

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
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
	// TLS, when set, turns TLS on with the server certificate of TLS.Certs
	// and makes the server refuse every TCP connection that is not
	// encrypted (pg_hba.conf has hostssl lines only). Defaults to none:
	// plain TCP.
	TLS *PostgresTLS
	// Password, when set, is user postgres's password, which connections
	// over TCP must then give (scram-sha-256); the Unix socket stays
	// trusted. Defaults to none: TCP connections are trusted.
	Password string
}

// PostgresTLS configures TLS for StartPostgres.
type PostgresTLS struct {
	// Certs are the CA and the server certificate. The server gets copies
	// of its certificate, key and CA in its own directory.
	Certs *Certs
	// ClientCert makes the server ask every TCP client for a certificate
	// signed by the CA whose common name is the user's name
	// (clientcert=verify-full).
	ClientCert bool
}

// Postgres is a private PostgreSQL cluster.
type Postgres struct {
	dir, data, log string
	port           int
	bin            string
	tls            *PostgresTLS
	password       string
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
	p := &Postgres{dir: o.Dir, data: filepath.Join(o.Dir, "data"), log: filepath.Join(o.Dir, "postgres.log"), port: o.Port, bin: bin,
		tls: o.TLS, password: o.Password}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	initdb := []string{"-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"}
	if o.Password != "" {
		pwfile := filepath.Join(o.Dir, "pwfile")
		if err := os.WriteFile(pwfile, []byte(o.Password+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("servers: %w", err)
		}
		defer func() { _ = os.Remove(pwfile) }()
		initdb = append(initdb, "--pwfile="+pwfile)
	}
	tlsSettings, err := p.installTLS()
	if err != nil {
		return nil, err
	}
	if err := chown(o.Dir, "postgres"); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(bin, "initdb"), initdb...), "postgres")
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
	for k, v := range tlsSettings {
		settings[k] = v
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
	if err := p.writeHBA(); err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// installTLS copies the server's certificate, key and CA into its
// directory and returns the settings that turn TLS on; none without TLS.
func (p *Postgres) installTLS() (map[string]string, error) {
	if p.tls == nil {
		return nil, nil
	}
	if p.tls.Certs == nil {
		return nil, fmt.Errorf("servers: PostgresOptions.TLS.Certs is required")
	}
	files := map[string]struct {
		src  string
		mode os.FileMode
	}{
		"server.pem": {p.tls.Certs.ServerCertFile, 0o644},
		"server.key": {p.tls.Certs.ServerKeyFile, 0o600}, // PostgreSQL refuses a key others can read
		"ca.pem":     {p.tls.Certs.CAFile, 0o644},
	}
	for name, f := range files {
		if err := copyFile(f.src, filepath.Join(p.dir, name), f.mode); err != nil {
			return nil, err
		}
	}
	return map[string]string{
		"ssl":           "on",
		"ssl_cert_file": "'" + filepath.Join(p.dir, "server.pem") + "'",
		"ssl_key_file":  "'" + filepath.Join(p.dir, "server.key") + "'",
		"ssl_ca_file":   "'" + filepath.Join(p.dir, "ca.pem") + "'",
	}, nil
}

// writeHBA writes pg_hba.conf when the server has TLS or a password:
// the Unix socket trusted, TCP connections from 127.0.0.1 (ordinary and
// replication) encrypted only with TLS, with a password when one is set
// and a client certificate when TLS.ClientCert is.
func (p *Postgres) writeHBA() error {
	if p.tls == nil && p.password == "" {
		return nil // initdb's: everything trusted
	}
	kind, method, opts := "host", "trust", ""
	if p.tls != nil {
		kind = "hostssl"
		if p.tls.ClientCert {
			opts = " clientcert=verify-full"
		}
	}
	if p.password != "" {
		method = "scram-sha-256"
	}
	hba := "# servers.StartPostgres\nlocal all all trust\nlocal replication all trust\n" +
		fmt.Sprintf("%s all all 127.0.0.1/32 %s%s\n%s replication all 127.0.0.1/32 %s%s\n", kind, method, opts, kind, method, opts)
	file := filepath.Join(p.data, "pg_hba.conf")
	if err := os.WriteFile(file, []byte(hba), 0o600); err != nil {
		return fmt.Errorf("servers: write pg_hba.conf: %w", err)
	}
	return chown(file, "postgres")
}

// URL returns the connection URL of database postgres as user postgres,
// with its password when the server has one. With TLS it asks for
// sslmode=verify-full against the CA of the server's Certs, and gives the
// client certificate when the server asks for one; without, for
// sslmode=disable.
func (p *Postgres) URL() string {
	u := url.URL{Scheme: "postgres", Host: fmt.Sprintf("127.0.0.1:%d", p.port), Path: "/postgres", User: url.User("postgres")}
	if p.password != "" {
		u.User = url.UserPassword("postgres", p.password)
	}
	q := url.Values{"sslmode": {"disable"}}
	if p.tls != nil {
		q = url.Values{"sslmode": {"verify-full"}, "sslrootcert": {p.tls.Certs.CAFile}}
		if p.tls.ClientCert {
			q.Set("sslcert", p.tls.Certs.ClientCertFile)
			q.Set("sslkey", p.tls.Certs.ClientKeyFile)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
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

// StandbyOptions configures StartStandby.
type StandbyOptions struct {
	// Dir and Port are as PostgresOptions's. Defaults: a new directory, a
	// free port.
	Dir  string
	Port int
	// Name is the standby's application_name, by which the primary's
	// synchronous_standby_names names it. Defaults to "standby".
	Name string
	// Settings are more server settings of the standby. Its own
	// synchronous_standby_names is empty unless set here (the base backup
	// copies the primary's): once promoted, it commits without waiting for
	// a standby of its own, as Patroni sets it when no other standby runs.
	Settings map[string]string
}

// StartStandby makes a streaming standby of p with pg_basebackup -R (a base
// backup, standby.signal and primary_conninfo naming o.Name), starts it and
// waits until it accepts connections and streams from p. A primary with
// synchronous_standby_names naming o.Name waits for it at every commit.
func (p *Postgres) StartStandby(ctx context.Context, o StandbyOptions) (*Postgres, error) {
	var err error
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	if o.Name == "" {
		o.Name = "standby"
	}
	if o.Dir, err = serverDir(o.Dir, "sagabox-postgres-standby-"); err != nil {
		return nil, err
	}
	s := &Postgres{dir: o.Dir, data: filepath.Join(o.Dir, "data"), log: filepath.Join(o.Dir, "postgres.log"), port: o.Port, bin: p.bin}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	if err := chown(o.Dir, "postgres"); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", p.port, o.Name)
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(p.bin, "pg_basebackup"),
		"-D", s.data, "-d", conninfo, "-X", "stream", "-R", "--no-sync"), "postgres")
	if err != nil {
		return nil, err
	}
	if err := run(cmd); err != nil {
		return nil, fmt.Errorf("servers: pg_basebackup from port %d: %w", p.port, err)
	}
	settings := map[string]string{
		"port": fmt.Sprint(o.Port), "unix_socket_directories": "'" + o.Dir + "'",
		"primary_conninfo": "'" + conninfo + "'", "hot_standby": "on", "synchronous_standby_names": "''",
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
	conf.WriteString("\n# servers.StartStandby\n")
	for _, k := range keys {
		fmt.Fprintf(&conf, "%s = %s\n", k, settings[k])
	}
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	_, err = f.WriteString(conf.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("servers: write the standby's postgresql.conf: %w", err)
	}
	if err := s.Start(ctx); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

// Promote promotes a standby to a primary (pg_ctl promote) and waits until
// it accepts writes.
func (p *Postgres) Promote(ctx context.Context) error {
	cmd, err := asUser(exec.CommandContext(ctx, filepath.Join(p.bin, "pg_ctl"), "promote", "-D", p.data, "-w", "-t", "60"), "postgres")
	if err != nil {
		return err
	}
	if err := run(cmd); err != nil {
		return fmt.Errorf("servers: promote PostgreSQL on port %d: %w", p.port, err)
	}
	return nil
}

// Kill kills the postmaster with SIGKILL, as a machine that dies would;
// its server processes notice their postmaster's death and exit. Start
// runs crash recovery.
func (p *Postgres) Kill() error {
	pid := p.PID()
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("servers: kill PostgreSQL %d: %w", pid, err)
	}
	return waitGone(pid, time.Minute)
}
