// Package servers starts private PostgreSQL and RabbitMQ servers for tests
// and the chaos run: a cluster of its own (initdb, pg_ctl) on another port,
// a RabbitMQ node with its own name, ports and data directory. Whatever is
// done to them (a stop, an immediate shutdown, a kill -9) never touches the
// shared servers the other tests use. Each server is stopped by the PID it
// started, and its directory is removed by Close.
//
// The processes run as the system users of the Debian packages (postgres,
// rabbitmq) when the caller is root, since neither server runs as root.
package servers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitPort waits until something accepts connections on 127.0.0.1:port.
func waitPort(ctx context.Context, port int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nothing accepts connections on %s after %s: %w", addr, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// asUser returns cmd run as the system user name when this process is
// root, and as itself otherwise.
func asUser(cmd *exec.Cmd, name string) (*exec.Cmd, error) {
	if os.Geteuid() != 0 {
		return cmd, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up system user %s (install the Debian package that creates it): %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	cmd.Env = append(cmd.Environ(), "HOME="+u.HomeDir, "USER="+name, "LOGNAME="+name)
	return cmd, nil
}

// chown gives dir (recursively) to the system user name when this process
// is root.
func chown(dir, name string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return fmt.Errorf("look up system user %s: %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// run runs cmd and returns its error with its output.
func run(cmd *exec.Cmd) error {
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM)
}

// waitGone waits until process pid has exited.
func waitGone(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d still running after %s", pid, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// serverDir returns dir, created with mode 0755, or a new directory under
// the system's temporary directory when dir is empty.
func serverDir(dir, prefix string) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", prefix)
		if err != nil {
			return "", fmt.Errorf("servers: %w", err)
		}
		dir = d
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("servers: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("servers: %w", err)
	}
	return dir, nil
}

// readPID reads a PID from the first line of file.
func readPID(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("pid file %s: %w", file, err)
	}
	return pid, nil
}
