package participant_test

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// proxy forwards TCP connections from a local port to target (a real
// PostgreSQL or RabbitMQ) so that a test can make that server unreachable
// for one client only: Cut closes the listening port and every forwarded
// connection (new connections are refused), Restore listens on the same
// port again.
type proxy struct {
	t      testing.TB
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newProxy starts a proxy to target, stopped when the test ends.
func newProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{t: t, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(func() {
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *proxy) Addr() string { return p.addr }

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.forward(c)
		}
	})
}

func (p *proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil { // cut meanwhile
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
		return
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side or Cut closes
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}
	p.wg.Go(func() { pipe(up, c) })
	p.wg.Go(func() { pipe(c, up) })
}

// Cut makes the target unreachable through the proxy: the port is closed
// (connecting is refused) and every forwarded connection is closed.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore listens on the proxy's port again.
func (p *proxy) Restore() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err, "listen again on %s", p.addr)
	p.serve(ln)
}
