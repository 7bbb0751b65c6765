package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestLimitsRedis: three workers keep the queues on one redis-server of
// the run's own and the limits on another (--limits-redis), then on the
// test's Redis Cluster (--limits-redis-cluster). 60 calls of 6 businesses
// under vendorPolicy: every call once, no 429, within 1.3x of the time the
// limits allow; the queues' server holds no key of the rules, the limits'
// one holds them. A live override set with --limits-redis alone (no
// --redis) is what worker status shows with --limits-redis, and not
// without it.
func TestLimitsRedis(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	t.Run("server", func(t *testing.T) {
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		limitsRun(t, []string{"--limits-redis", "redis://" + srv.Addr()}, func(string) []string {
			return c.Keys(context.Background(), "*").Val()
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.Cluster(t)
		limitsRun(t, []string{"--limits-redis-cluster", strings.Join(redistest.ClusterAddrs(t), ",")}, func(prefix string) []string {
			var mu sync.Mutex // ForEachMaster calls in parallel
			var ks []string
			c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
				got := m.Keys(ctx, prefix+"*").Val()
				mu.Lock()
				defer mu.Unlock()
				ks = append(ks, got...)
				return nil
			})
			return ks
		})
	})
}

// limitsRun runs TestLimitsRedis on the limits' Redis that the flags
// name, whose keys under a prefix limitsKeys lists.
func limitsRun(t *testing.T, flags []string, limitsKeys func(prefix string) []string) {
	r := sixtyCalls(t, own, 1.3, flags...)
	rules := []string{"vendor-peak", "vendor-window", "per-business", "business-concurrency"}
	// The rules' state, that is: the index of waiting tasks is the
	// queues' (taskrl.Waiting), where producers read it.
	named := func(ks []string) (in []string) {
		for _, k := range ks {
			if !strings.Contains(k, ":waiting:{") && slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(k, ":"+r) }) {
				in = append(in, k)
			}
		}
		return in
	}
	if ks := named(r.client.Keys(context.Background(), "*").Val()); len(ks) > 0 {
		t.Errorf("the queues' server holds keys of the rules: %q", ks)
	}
	if ks := named(limitsKeys(r.prefix)); len(ks) == 0 {
		t.Errorf("the limits' Redis holds no key of the rules: %q", limitsKeys(r.prefix))
	}
	worker := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(r.bin, "worker"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("worker %q: %v\n%s", args, err, out)
		}
		return string(out)
	}
	worker(append([]string{"limits", "set", "per-business", "b-lr", "gcra: {rate: 5, per: 1s}", "--prefix", r.prefix}, flags...)...)
	status := []string{"status", "--policy", r.policy, "--key", "b-lr", "--prefix", r.prefix}
	if out := worker(append(append(slices.Clone(status), r.redis...), flags...)...); !strings.Contains(out, "(override)") {
		t.Errorf("worker status with %q does not show the override:\n%s", flags, out)
	}
	if out := worker(append(slices.Clone(status), r.redis...)...); strings.Contains(out, "(override)") {
		t.Errorf("worker status without %q shows an override on the queues' server:\n%s", flags, out)
	}
	worker(append([]string{"limits", "rm", "per-business", "b-lr", "--prefix", r.prefix}, flags...)...)
	r.stop()
}
