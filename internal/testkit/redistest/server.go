package redistest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a dedicated redis-server owned by one test, started with
// StartServer. Unlike the shared servers it may be stopped and restarted on
// the same port and directory, e.g. to simulate a Redis restart.
type Server struct {
	mu   sync.Mutex
	port int
	dir  string
	args []string
	p    *proc // nil while stopped
}

// StartServer starts a fresh standalone redis-server on a free loopback port
// for this test only, with args appended to the default arguments (e.g.
// "--appendonly", "yes"). It is stopped when the test ends. It skips the
// test when redis-server is not installed (outside CI).
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	if state.skipMsg != "" {
		t.Skip(state.skipMsg)
	}
	if _, err := lookRedis(); err != nil {
		t.Skip(err.Error())
	}
	dir := t.TempDir() // registered first, so removed after the server stops
	p, err := startOnFreePort(dir, args, false)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{port: p.port, dir: dir, args: append([]string(nil), args...), p: p}
	t.Cleanup(func() { s.stop() })
	return s
}

// Addr returns the server's host:port; it does not change across Stop/Start.
func (s *Server) Addr() string { return addrFor(s.port) }

// Client returns a client to this server, closed when the test ends. The
// client reconnects by itself after Stop/Start.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop stops the server like SHUTDOWN NOSAVE (no RDB snapshot is written;
// an enabled AOF is flushed), killing the process if it does not exit
// promptly, and waits until it has exited. Stopping a stopped server is a
// no-op. The port and directory are kept for Start.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.stop()
}

func (s *Server) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		s.p.shutdown()
		s.p = nil
	}
}

// Start restarts a stopped server on the same port, with the same directory
// and arguments, so data persisted there (e.g. with --appendonly yes) is
// loaded again. It returns once the server answers PING. The port is not
// held while the server is stopped; if another process took it meanwhile,
// Start fails the test.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		t.Fatalf("redistest: Server %s: Start called while running", s.Addr())
	}
	var err error
	for range 5 {
		var p *proc
		if p, err = launch(s.port, s.dir, s.args); err == nil {
			s.p = p
			return
		}
		if !errors.Is(err, errPortInUse) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal(err)
}
