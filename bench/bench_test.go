package bench

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/taskrl/taskrl/quotas"
)

func quotasRequest(keys []string) quotas.Request {
	return quotas.Request{Keys: keys, Holder: "status"}
}

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

// BenchmarkAllow runs BenchmarkAllow/{taskrl,redis_rate,incr,quotas-1rule,
// quotas-4rule,quotas-5rule,quotas-5rule-single}/{random-keys,hot-key},
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

// TestQuotas5RuleSlots checks that a quotas-5rule call charges every rule
// and that the slots held per business stay within the holder pool.
func TestQuotas5RuleSlots(t *testing.T) {
	ctx := context.Background()
	biz := "test-slots"
	keys := []string{"", "", "", biz, biz}
	before, err := env.Quotas.Status(ctx, FiveRules, quotasRequest(keys))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 * HolderPool {
		ok, err := env.Allow5(ctx, biz)
		if err != nil || !ok {
			t.Fatalf("Allow5: allowed=%v err=%v", ok, err)
		}
	}
	after, err := env.Quotas.Status(ctx, FiveRules, quotasRequest(keys))
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Rules[4].Used; got > HolderPool {
		t.Errorf("slots held: %d, want at most %d", got, HolderPool)
	}
	// The fixed and calendar windows count every admitted call.
	for _, i := range []int{1, 2} {
		if d := after.Rules[i].Used - before.Rules[i].Used; d < 3*HolderPool {
			t.Errorf("rule %s counted %d of %d calls", after.Rules[i].Name, d, 3*HolderPool)
		}
	}
}

// TestQuotas5RuleRelease checks that quotas-5rule-release gives every slot
// it takes back.
func TestQuotas5RuleRelease(t *testing.T) {
	ctx := context.Background()
	biz := "test-release"
	op := moreOps["quotas-5rule-release"](env)
	for range 20 {
		if ok, err := op(ctx, biz); err != nil || !ok {
			t.Fatalf("allowed=%v err=%v", ok, err)
		}
	}
	st, err := env.Quotas.Status(ctx, FiveRules, quotasRequest([]string{"", "", "", biz, biz}))
	if err != nil {
		t.Fatal(err)
	}
	if used := st.Rules[4].Used; used != 0 {
		t.Fatalf("%d slots held after 20 ops that release theirs", used)
	}
}
