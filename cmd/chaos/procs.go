package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// proc is one process of the example, started (and restarted) with the same
// arguments.
type proc struct {
	name string // e.g. "inventory-2"
	kind string // the -service: orders, inventory, payment or shipping
	bin  string
	args []string
	log  string // its output, appended across restarts
	// ready is a line of its output that says it runs.
	ready string

	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{} // closed when the current cmd has exited
	exitErr   error
	starts    int
	killed    bool // the current cmd was killed by the run
	unplanned []string
}

// start starts the process and waits until its output has the ready line.
func (p *proc) start(ctx context.Context) error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("open log of %s: %w", p.name, err)
	}
	before, _ := os.ReadFile(p.log)
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: the terminal's Ctrl-C reaches the run, which
	// stops its processes itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.killed, p.exitErr = cmd, exited, false, nil
	p.starts++
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = f.Close()
		p.mu.Lock()
		p.exitErr = err
		if !p.killed && err != nil {
			p.unplanned = append(p.unplanned, err.Error())
		}
		p.mu.Unlock()
		close(exited)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, _ := os.ReadFile(p.log)
		if bytes.Contains(out[min(len(before), len(out)):], []byte(p.ready)) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready (%w); see %s", p.name, p.exitErr, p.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 2m; see %s", p.name, p.log)
		}
	}
}

// done returns a channel closed when the current process has exited.
func (p *proc) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// exitError returns how the last process ended.
func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// running reports whether the current process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done():
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits until the process has exited.
func (p *proc) kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.killed = true
	p.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-exited
	return nil
}

// stop sends SIGTERM and waits (then kills after a minute).
func (p *proc) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.killed = true
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

// unplannedExits returns the exits of this process the run did not cause.
func (p *proc) unplannedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unplanned...)
}

// build compiles the checkout example into dir.
func build(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "checkout")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/checkout")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the checkout example: %w\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot finds the directory of go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find the module root: no go.mod above the working directory")
		}
		dir = parent
	}
}
