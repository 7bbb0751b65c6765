package quotas

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestRenewAll: on an explicit clock, leases of several keys (several
// slots on the Cluster) renewed in one call are renewed exactly as Renew
// renews them one by one: the held ones outlive their first lease, a
// released one and one taken over by a redelivery are reported lost and
// stay so, and the model agrees on every answer.
func TestRenewAll(t *testing.T) {
	for name, c := range map[string]redis.UniversalClient{"single": redistest.Client(t), "cluster": redistest.Cluster(t)} {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0)
			l, err := New(Config{Client: c, Prefix: redistest.Prefix(t), Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			mod := NewModel()
			ctx := context.Background()
			set := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 1, Lease: 30 * time.Second}})
			var leases, modLeases []Lease
			for i, key := range []string{"a", "b", "c", "d"} {
				req := Request{Keys: []string{key}, Holder: "task-" + key}
				d, err := l.Allow(ctx, set, req)
				md, merr := mod.AllowAt(now, set, req)
				if err != nil || merr != nil || !d.Allowed || !md.Allowed {
					t.Fatalf("slot %d: %+v %v / %+v %v", i, d, err, md, merr)
				}
				leases, modLeases = append(leases, d.Leases...), append(modLeases, md.Leases...)
			}
			// c is released; d's holder acquires again (a redelivery).
			if ok, err := l.Release(ctx, leases[2]); !ok || err != nil {
				t.Fatal(ok, err)
			}
			mod.ReleaseAt(now, modLeases[2])
			req := Request{Keys: []string{"d"}, Holder: "task-d"}
			if d, err := l.Allow(ctx, set, req); err != nil || !d.Allowed {
				t.Fatal(d, err)
			}
			mod.AllowAt(now, set, req)
			now = now.Add(20 * time.Second)
			ok, err := l.RenewAll(ctx, leases)
			if err != nil {
				t.Fatal(err)
			}
			var want []bool
			for _, ls := range modLeases {
				w, err := mod.RenewAt(now, ls)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, w)
			}
			if !slices.Equal(ok, want) || !slices.Equal(ok, []bool{true, true, false, false}) {
				t.Fatalf("RenewAll = %v, model %v; want [true true false false]", ok, want)
			}
			// 40 s after the first lease (30 s), a and b are still held.
			now = now.Add(20 * time.Second)
			for _, key := range []string{"a", "b"} {
				if d, err := l.Allow(ctx, set, Request{Keys: []string{key}, Holder: "other"}); err != nil || d.Allowed {
					t.Errorf("slot %s after its renewal: %+v %v; want still held", key, d, err)
				}
			}
			if _, err := l.RenewAll(ctx, []Lease{{Rule: "x"}}); err == nil {
				t.Error("RenewAll of a lease not from a Decision: no error")
			}
		})
	}
}
