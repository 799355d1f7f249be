package servers

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// RabbitMQOptions configures StartRabbitMQ.
type RabbitMQOptions struct {
	// Dir holds the node's data and logs; it is created and removed by
	// Close. Its parent directories must be traversable by the rabbitmq
	// user (t.TempDir's are not). Defaults to a new directory under the
	// system's temporary directory.
	Dir string
	// Name is the node's name before "@localhost". Defaults to a unique
	// "sagabox-<id>".
	Name string
	// Port is the AMQP port on 127.0.0.1. Defaults to a free port.
	Port int
	// TLS, when set, adds a TLS listener (amqps) on another port, beside
	// the plain one. Defaults to none.
	TLS *RabbitMQTLS
}

// RabbitMQTLS configures the TLS listener of StartRabbitMQ. The node
// verifies the certificate of every client that presents one
// (ssl_options.verify = verify_peer).
type RabbitMQTLS struct {
	// Certs are the CA and the server certificate. The node gets copies
	// of its certificate, key and CA in its own directory.
	Certs *Certs
	// Port is the TLS listener's port on 127.0.0.1. Defaults to a free
	// port.
	Port int
	// FailIfNoPeerCert makes the node refuse a client without a
	// certificate (ssl_options.fail_if_no_peer_cert = true).
	FailIfNoPeerCert bool
}

// RabbitMQ is a private RabbitMQ node: its own node name, AMQP and
// distribution ports and data directory, no plugins.
type RabbitMQ struct {
	dir, node string
	port      int
	distPort  int
	tlsPort   int // 0 without TLS
	cmd       *exec.Cmd
}

// StartRabbitMQ starts a node and waits until it accepts AMQP connections.
func StartRabbitMQ(ctx context.Context, o RabbitMQOptions) (*RabbitMQ, error) {
	if _, err := exec.LookPath("rabbitmq-server"); err != nil {
		return nil, fmt.Errorf("servers: rabbitmq-server not found: install rabbitmq-server (apt-get install -y rabbitmq-server)")
	}
	var err error
	if o.Port == 0 {
		if o.Port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	dist, err := FreePort()
	if err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "sagabox-" + uuid.NewString()[:8]
	}
	if o.Dir, err = serverDir(o.Dir, "sagabox-rabbitmq-"); err != nil {
		return nil, err
	}
	r := &RabbitMQ{dir: o.Dir, node: o.Name + "@localhost", port: o.Port, distPort: dist}
	for _, d := range []string{o.Dir, filepath.Join(o.Dir, "mnesia"), filepath.Join(o.Dir, "log")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("servers: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	if o.TLS != nil {
		if err := r.installTLS(o.TLS); err != nil {
			return nil, err
		}
	}
	if err := chown(o.Dir, "rabbitmq"); err != nil {
		return nil, fmt.Errorf("servers: %w", err)
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// installTLS copies the node's certificate, key and CA into its directory
// and writes the configuration file of its TLS listener.
func (r *RabbitMQ) installTLS(o *RabbitMQTLS) error {
	if o.Certs == nil {
		return fmt.Errorf("servers: RabbitMQOptions.TLS.Certs is required")
	}
	r.tlsPort = o.Port
	if r.tlsPort == 0 {
		var err error
		if r.tlsPort, err = FreePort(); err != nil {
			return err
		}
	}
	for src, name := range map[string]string{o.Certs.ServerCertFile: "server.pem", o.Certs.ServerKeyFile: "server.key", o.Certs.CAFile: "ca.pem"} {
		if err := copyFile(src, filepath.Join(r.dir, name), 0o600); err != nil {
			return err
		}
	}
	conf := fmt.Sprintf(`listeners.ssl.default = 127.0.0.1:%d
ssl_options.cacertfile = %s
ssl_options.certfile = %s
ssl_options.keyfile = %s
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = %t
`, r.tlsPort, filepath.Join(r.dir, "ca.pem"), filepath.Join(r.dir, "server.pem"), filepath.Join(r.dir, "server.key"), o.FailIfNoPeerCert)
	if err := os.WriteFile(filepath.Join(r.dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	return nil
}

// env is the environment of the node's server and of rabbitmqctl for it.
func (r *RabbitMQ) env() []string {
	config := filepath.Join(r.dir, "none")
	if r.tlsPort != 0 {
		config = filepath.Join(r.dir, "rabbitmq.conf")
	}
	return append(os.Environ(),
		"RABBITMQ_NODENAME="+r.node,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", r.port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", r.distPort),
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_MNESIA_BASE="+filepath.Join(r.dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(r.dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(r.dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE="+filepath.Join(r.dir, "pid"),
		"RABBITMQ_CONFIG_FILE="+config,
		"RABBITMQ_ADVANCED_CONFIG_FILE="+filepath.Join(r.dir, "none-advanced"),
	)
}

// URL returns the node's AMQP URL (guest/guest, which RabbitMQ allows from
// localhost).
func (r *RabbitMQ) URL() string { return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", r.port) }

// TLSURL returns the URL of the node's TLS listener (guest/guest), or ""
// without one. It names no CA nor client certificate: add them as the
// URL's query parameters (cacertfile, certfile, keyfile).
func (r *RabbitMQ) TLSURL() string {
	if r.tlsPort == 0 {
		return ""
	}
	return fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", r.tlsPort)
}

// TLSPort returns the port of the node's TLS listener, or 0 without one.
func (r *RabbitMQ) TLSPort() int { return r.tlsPort }

// Node returns the node's name, e.g. "sagabox-1a2b3c4d@localhost".
func (r *RabbitMQ) Node() string { return r.node }

// Port returns the node's AMQP port.
func (r *RabbitMQ) Port() int { return r.port }

// PID returns the node's Erlang VM PID, or 0 when it is not running.
func (r *RabbitMQ) PID() int {
	pid, err := readPID(filepath.Join(r.dir, "pid"))
	if err != nil || !alive(pid) {
		return 0
	}
	return pid
}

// Start starts the stopped node (with the data it had) and waits until it
// accepts AMQP connections and has booted.
func (r *RabbitMQ) Start(ctx context.Context) error {
	_ = os.Remove(filepath.Join(r.dir, "pid"))
	cmd := exec.Command("rabbitmq-server")
	cmd.Env = r.env()
	out, err := os.OpenFile(filepath.Join(r.dir, "server.out"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group: a signal to the caller's group does not reach
	// it, and it outlives nothing it should not.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("servers: start rabbitmq-server %s: %w", r.node, err)
	}
	r.cmd = cmd
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
	}()
	if err := waitPort(ctx, r.port, 2*time.Minute); err != nil {
		tail, _ := os.ReadFile(filepath.Join(r.dir, "server.out"))
		return fmt.Errorf("servers: RabbitMQ node %s: %w\n%s", r.node, err, lastLines(string(tail), 20))
	}
	return r.ctl(ctx, "await_startup")
}

// ctl runs rabbitmqctl for the node.
func (r *RabbitMQ) ctl(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-n", r.node}, args...)...)
	cmd.Env = r.env()
	if err := run(cmd); err != nil {
		return fmt.Errorf("servers: %w", err)
	}
	return nil
}

// Stop stops the node gracefully (rabbitmqctl stop) and waits until its VM
// has exited.
func (r *RabbitMQ) Stop(ctx context.Context) error {
	pid := r.PID()
	if pid == 0 {
		return nil
	}
	if err := r.ctl(ctx, "stop"); err != nil {
		return err
	}
	return waitGone(pid, time.Minute)
}

// Kill kills the node's VM with SIGKILL, as a crash would.
func (r *RabbitMQ) Kill() error {
	pid := r.PID()
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("servers: kill RabbitMQ node %s (pid %d): %w", r.node, pid, err)
	}
	return waitGone(pid, time.Minute)
}

// Restart stops the node (gracefully, or with kill -9 when kill is set) and
// starts it again.
func (r *RabbitMQ) Restart(ctx context.Context, kill bool) error {
	var err error
	if kill {
		err = r.Kill()
	} else {
		err = r.Stop(ctx)
	}
	if err != nil {
		return err
	}
	return r.Start(ctx)
}

// JoinCluster makes this node a member of the cluster of node other.
func (r *RabbitMQ) JoinCluster(ctx context.Context, other *RabbitMQ) error {
	for _, args := range [][]string{{"stop_app"}, {"join_cluster", other.node}, {"start_app"}, {"await_startup"}} {
		if err := r.ctl(ctx, args...); err != nil {
			return err
		}
	}
	return nil
}

// Close kills the node and removes its directory.
func (r *RabbitMQ) Close() error {
	err := r.Kill()
	if rerr := os.RemoveAll(r.dir); err == nil {
		err = rerr
	}
	return err
}

// Ctl runs rabbitmqctl for the node and returns its output.
func (r *RabbitMQ) Ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-n", r.node, "-q"}, args...)...)
	cmd.Env = r.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("servers: rabbitmqctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
