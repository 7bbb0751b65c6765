package gcra

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/batch"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestBatchMatchesModel sends random requests (allow, peek, reserve,
// refund; often several on one key) in script calls of up to 12 requests
// on an explicit clock, and applies them one by one, in the same order, to
// the model: every result must be the same.
func TestBatchMatchesModel(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 13))
		l := newClockLimiter(t, c, fmt.Sprintf("%s%d:", prefix, seed))
		var m Model
		keys := []string{"a", "b", "c"}
		limits := map[string]Limit{}
		for _, k := range keys {
			limits[k] = randomLimit(rng)
		}
		for round := 0; round < 200; round++ {
			l.now = l.now.Add(time.Duration(rng.Int64N(int64(time.Second)))).Truncate(time.Microsecond)
			type item struct {
				name, key string
				want      Result
				job       *batch.Job
			}
			var items []item
			for range 1 + rng.IntN(12) {
				key := keys[rng.IntN(len(keys))]
				lim := limits[key]
				n := rng.IntN(2*lim.Burst + 1)
				horizon := time.Duration(rng.Int64N(int64(lim.Interval()) * int64(3*lim.Burst+1)))
				var o op
				var want Result
				var err error
				switch x := rng.IntN(10); {
				case x < 5:
					o = opAllow
					want, err = m.AllowN(l.now, key, lim, n)
				case x < 8:
					o = opReserve
					want, err = m.Reserve(l.now, key, lim, n, horizon)
				default:
					o = opRefund
					want, err = m.Refund(l.now, key, lim, n)
				}
				if err != nil {
					t.Fatal(err)
				}
				args, err := l.args(lim, n, o, horizon)
				if err != nil {
					t.Fatal(err)
				}
				items = append(items, item{name: fmt.Sprintf("op %d n %d", o, n), key: key, want: want,
					job: &batch.Job{Ctx: ctx, Keys: []string{l.Key(key)}, Args: args}})
			}
			jobs := make([]*batch.Job, len(items))
			for i := range items {
				jobs[i] = items[i].job
			}
			l.batch.Call(jobs)
			for i, it := range items {
				if it.job.Err != nil {
					t.Fatal(it.job.Err)
				}
				got, err := parseReply(it.job.Reply, limits[it.key])
				if err != nil {
					t.Fatal(err)
				}
				if got != it.want {
					t.Fatalf("seed %d round %d, request %d of %d (%s on %q under %v):\n batched %+v\n model   %+v",
						seed, round, i+1, len(items), it.name, it.key, limits[it.key], got, it.want)
				}
			}
		}
	}
}

// TestBatchSharesCalls: 200 callers at once on one key with a burst of 50,
// at one explicit instant: exactly 50 are allowed, and the requests went
// in far fewer script calls than requests (each waiting behind the calls
// in flight joins the next); with MaxBatch 1, one call each.
func TestBatchSharesCalls(t *testing.T) {
	c := redistest.StartServer(t).Client(t) // its own: the test counts its calls
	ctx := context.Background()
	for _, maxBatch := range []int{1, 0} {
		l, err := New(Config{Client: c, Prefix: redistest.Prefix(t) + strconv.Itoa(maxBatch) + ":", MaxBatch: maxBatch, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		const n = 200
		before := redistest.CommandCalls(t, c)["evalsha"]
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				r, err := l.Allow(ctx, "hot", Limit{Rate: 1, Period: time.Hour, Burst: 50})
				if err != nil {
					t.Error(err)
				}
				if r.Allowed {
					allowed.Add(1)
				}
			})
		}
		wg.Wait()
		calls := redistest.CommandCalls(t, c)["evalsha"] - before
		t.Logf("MaxBatch %d: %d requests in %d script calls, %d allowed", maxBatch, n, calls, allowed.Load())
		if allowed.Load() != 50 {
			t.Errorf("MaxBatch %d: %d allowed under a burst of 50", maxBatch, allowed.Load())
		}
		if maxBatch == 1 && calls != n {
			t.Errorf("MaxBatch 1: %d requests in %d calls", n, calls)
		}
		if maxBatch == 0 && calls >= n {
			t.Errorf("%d requests in %d calls: none shared a call", n, calls)
		}
	}
	if _, err := New(Config{Client: c, MaxBatch: -1}); err == nil {
		t.Error("MaxBatch -1 accepted")
	}
}
