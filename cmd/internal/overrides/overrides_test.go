package overrides

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/quotas"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestStore: set, list, remove and the version, on one server and on a
// Redis Cluster (the hash and its version share a slot); a stored entry
// that cannot be parsed is listed with its error, not dropped.
func TestStore(t *testing.T) {
	for name, c := range map[string]redis.UniversalClient{"single": redistest.Client(t), "cluster": redistest.Cluster(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			prefix := redistest.Prefix(t)
			s := New(c, prefix)
			if v, err := s.Version(ctx); err != nil || v != 0 {
				t.Fatalf("version %d %v before any change", v, err)
			}
			if err := s.Set(ctx, "per-business", "b7", " gcra: {rate: 5, per: 1s} ", nil); err != nil {
				t.Fatal(err)
			}
			if err := s.Set(ctx, "per-business", "b7", "gcra: {rate: 0, per: 1s}", nil); err == nil || !strings.Contains(err.Error(), "gcra.rate") {
				t.Fatalf("a bad limit was stored: %v", err)
			}
			hash, _ := keys.Overrides(prefix)
			c.HSet(ctx, hash, `["per-business","b8"]`, "gcra: nope", "junk", "gcra: {rate: 1, per: 1s}")
			list, err := s.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 3 {
				t.Fatalf("listed %+v", list)
			}
			if e := list[1]; e.Rule != "per-business" || e.Key != "b7" || e.Spec != "gcra: {rate: 5, per: 1s}" || e.Limit != (quotas.GCRA{Rate: 5, Period: time.Second, Burst: 1}) || e.Err != nil {
				t.Errorf("b7: %+v", e)
			}
			if e := list[2]; e.Key != "b8" || e.Err == nil {
				t.Errorf("an unparsable limit: %+v", e)
			}
			if e := list[0]; e.Rule != "junk" || e.Err == nil {
				t.Errorf("an unparsable field: %+v", e)
			}
			had, err := s.Remove(ctx, "per-business", "b7")
			if v, _ := s.Version(ctx); err != nil || !had || v != 2 {
				t.Errorf("remove: %v %v, version %d", had, err, v)
			}
		})
	}
}
