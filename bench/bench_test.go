package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
)

var env *Env

// TestMain starts one redis-server for every case of the run.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	srv, err := StartServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer srv.Stop()
	if env, err = NewEnv(srv.Addr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// BenchmarkAllow runs BenchmarkAllow/{taskrl,redis_rate,incr}/{random-keys,hot-key},
// each with 50 concurrent callers against the same redis-server.
func BenchmarkAllow(b *testing.B) {
	for _, c := range env.Cases() {
		b.Run(c.Name(), c.Bench())
	}
}

// TestCases checks that every case runs and that the limiters allow under
// the benchmark limit, so a broken setup fails without -bench.
func TestCases(t *testing.T) {
	ctx := context.Background()
	for _, c := range env.Cases() {
		ok, err := c.op(ctx, c.keys[len(c.keys)-1])
		if err != nil || !ok {
			t.Errorf("%s: allowed=%v err=%v", c.Name(), ok, err)
		}
	}
	if got, want := env.Taskrl.Key("k00001"), TaskrlPrefix+"gcra:{k00001}"; got != want {
		t.Logf("taskrl key for k00001 is %q (expected shape %q)", got, want)
	}
}
