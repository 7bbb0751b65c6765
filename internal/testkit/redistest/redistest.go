// Package redistest is the real-Redis test harness shared by the tests of
// every package in this module.
//
// Each test package wires it up with
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// and then uses Client / Cluster for clients to a shared standalone server
// and a shared 3-master Redis Cluster, Prefix for a per-test key namespace
// that is deleted when the test ends, StartServer for a private
// redis-server that a test may stop and restart, and StartTLSServer for one
// that also takes TLS connections, with a certificate from a throwaway CA.
//
// The shared servers are started once per test binary by Main, or once per
// whole run by the redisharness command (go run
// ./internal/testkit/redistest/cmd/redisharness -- go test ./...), which hands them
// to the test binaries through the EnvVar environment variable. Servers are
// child processes that the kernel kills when their parent dies (Linux), and
// they are stopped explicitly at the end of the run in every other case.
//
// Test support, imported by the tests of every package (and bench/).
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// state is set by Main before any test runs and read-only afterwards.
var state struct {
	mainCalled bool
	env        *sharedEnv // nil when no servers are available
	skipMsg    string     // non-empty when redis-server is missing and tests should skip
	embedded   string     // with -short: the address of an in-process miniredis, for examples
}

// Main is called from each test package's TestMain:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// If EnvVar is set (by the redisharness command or by a parent test process)
// Main uses the servers it names, after checking each one's run_id; a
// mismatch or an unreachable server makes it exit with status 1. Otherwise
// it starts a standalone server and a cluster itself, exports EnvVar so that
// subprocesses re-executing the test binary reuse them, runs the tests and
// stops the servers. If redis-server is not on PATH it exits 1 when CI=true
// and otherwise runs the tests, which then skip wherever they need Redis.
// With -short (make test-short) and no EnvVar it starts no redis-server
// either: tests that need Redis skip, and Example functions, which cannot
// skip, run against an embedded miniredis (SharedAddr).
// Main never returns; it calls os.Exit with the tests' exit code.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit: it returns the tests' exit code, for a
// TestMain with clean-up of its own to do after the tests.
func Run(m *testing.M) int {
	state.mainCalled = true
	if v := os.Getenv(EnvVar); v != "" {
		e, err := parseEnv(v)
		if err == nil {
			err = verifyEnv(e)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		state.env = e
		return m.Run()
	}
	if short() {
		state.skipMsg = "redistest: -short starts no redis-server (make test runs this test against real ones)"
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			fmt.Fprintln(os.Stderr, "redistest: starting the embedded server for -short:", err)
			return 1
		}
		mr.ClockTTL(true)
		defer mr.Close()
		state.embedded = mr.Addr()
		return m.Run()
	}
	if _, err := lookRedis(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if os.Getenv("CI") == "true" {
			return 1
		}
		state.skipMsg = err.Error()
		return m.Run()
	}
	env, stop, err := StartShared()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop() // also on a panic unwinding through here
	e, err := parseEnv(env)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	state.env = e
	if err := os.Setenv(EnvVar, env); err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 1
	}
	code := m.Run()
	stop()
	return code
}

// short reports whether the test binary runs with -short. TestMain runs
// before the testing package parses its flags, so it looks at them itself.
func short() bool {
	if !flag.Parsed() {
		flag.Parse()
	}
	return testing.Short()
}

func lookRedis() (string, error) {
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", ErrRedisNotFound
	}
	return p, nil
}

// shared returns the shared servers or ends the test: Skip when Redis is not
// installed (outside CI), Fatal when Main was not called.
func shared(t testing.TB) *sharedEnv {
	t.Helper()
	if state.skipMsg != "" {
		t.Skip(state.skipMsg)
	}
	if !state.mainCalled || state.env == nil {
		t.Fatal("redistest: Main was not called; add `func TestMain(m *testing.M) { redistest.Main(m) }` to this test package")
	}
	return state.env
}

// Client returns a client to the shared standalone server. It is closed
// when the test ends. Use Prefix for key names.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	e := shared(t)
	c := redis.NewClient(&redis.Options{Addr: e.Standalone.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster returns a client to the shared 3-master Redis Cluster. It is
// closed when the test ends. Use Prefix for key names (put any hash tag
// after the prefix).
func Cluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	e := shared(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.clusterAddrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Addr returns the host:port of the shared standalone server, for handing to
// subprocesses or binaries under test.
func Addr(t testing.TB) string {
	t.Helper()
	return shared(t).Standalone.Addr
}

// ClusterAddrs returns the host:port of each of the 3 cluster masters.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	return shared(t).clusterAddrs()
}

// Prefix returns a key prefix unique to this call, of the form
// "t:<sanitized test name, at most 40 chars>:<8 hex chars>:". It contains no
// '{' or '}' so callers may append hash tags. When the test ends, every key
// starting with the prefix is deleted from the shared standalone server and
// from every cluster master (SCAN + UNLINK; never FLUSHDB). If Redis is not
// available, the prefix is returned without registering any cleanup.
func Prefix(t testing.TB) string {
	t.Helper()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	p := "t:" + sanitize(t.Name(), 40) + ":" + hex.EncodeToString(rnd[:]) + ":"
	e := state.env
	if e == nil {
		return p
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pattern := globEscape(p) + "*"
		if err := deleteMatching(ctx, e.Standalone.Addr, pattern, false); err != nil {
			t.Errorf("redistest: deleting keys with prefix %q on %s: %v", p, e.Standalone.Addr, err)
		}
		for _, n := range e.Cluster {
			if err := deleteMatching(ctx, n.Addr, pattern, true); err != nil {
				t.Errorf("redistest: deleting keys with prefix %q on %s: %v", p, n.Addr, err)
			}
		}
	})
	return p
}

// deleteMatching UNLINKs every key matching pattern on the single server at
// addr. On a cluster node keys are unlinked one per command, because
// multi-key commands must not span hash slots.
func deleteMatching(ctx context.Context, addr, pattern string, clusterNode bool) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if clusterNode {
				_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, k := range keys {
						p.Unlink(ctx, k)
					}
					return nil
				})
			} else {
				err = c.Unlink(ctx, keys...).Err()
			}
			if err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// sanitize keeps letters, digits and "_-./" and replaces everything else
// (including glob metacharacters, ':' and braces) with '_'.
func sanitize(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= max {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9',
			r == '_', r == '-', r == '.', r == '/':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// globEscape escapes the characters that are special in Redis glob patterns.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// SharedAddr returns the host:port of the shared standalone server (with
// -short, of the embedded miniredis), or "" when Main found none. It is for Example functions, which have no
// testing.TB; tests use Addr.
func SharedAddr() string {
	if state.env == nil {
		return state.embedded
	}
	return state.env.Standalone.Addr
}

// NewPrefix returns a fresh key prefix "x:<name>:<8 hex>:" without
// registering a cleanup, for Example functions; the keys they write expire or
// go away with the harness's servers. Tests use Prefix.
func NewPrefix(name string) string {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return "x:" + sanitize(name, 40) + ":" + hex.EncodeToString(rnd[:]) + ":"
}
