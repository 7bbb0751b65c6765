package quotas

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/batch"
	"github.com/taskrl/taskrl/internal/script"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// batchJob builds the script call of one request, as run does.
func batchJob(t *testing.T, l *Limiter, s *Set, req Request, p params) (*batch.Job, []call) {
	t.Helper()
	calls, err := l.bind(s, req, p.op == opAllow)
	if err != nil {
		t.Fatal(err)
	}
	p.req = req
	tm, err := l.timing()
	if err != nil {
		t.Fatal(err)
	}
	ks, argv, end := l.args(calls, p, tm)
	return &batch.Job{Ctx: context.Background(), Keys: ks, Args: argv, End: end}, calls
}

// sameDecision compares two decisions made under different key prefixes.
func sameDecision(a, b Decision) bool {
	strip := func(d Decision) Decision {
		d.nonce = ""
		d.Leases = append([]Lease(nil), d.Leases...)
		for i := range d.Leases {
			d.Leases[i].zkey, d.Leases[i].hkey, d.Leases[i].lkey = "", "", ""
		}
		return d
	}
	return reflect.DeepEqual(strip(a), strip(b))
}

// TestBatchMatchesOneByOne sends random requests of random sets (every op,
// refunds of earlier decisions included) in script calls of up to 12
// requests, and the same requests one call each under another prefix: every
// decision must be the same. Requests of one set follow each other often, so
// the script's reuse of the previous request's rules is exercised too.
func TestBatchMatchesOneByOne(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	for seed := uint64(1); seed <= 10; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		start := starts[rng.IntN(len(starts))]
		batched := newClocked(t, c, fmt.Sprintf("%sb%d:", prefix, seed), start)
		single := newClocked(t, c, fmt.Sprintf("%ss%d:", prefix, seed), start)
		d := newDiffer(t, c, "unused:", seed)
		if seed > 6 {
			// GCRA-heavy sets whose requests book ahead of each other.
			d = newBookingDiffer(t, c, "unused:", seed)
		}
		type heldPair struct {
			s            *Set
			req          Request
			batchD, oneD Decision
		}
		var helds []heldPair
		for round := 0; round < 60; round++ {
			step := time.Duration(rng.Int64N(int64(d.scale))).Truncate(time.Microsecond)
			batched.now, single.now = batched.now.Add(step), single.now.Add(step)
			type item struct {
				s    *Set
				req  Request
				p    params
				one  Decision // the single-call side's decision
				job  *batch.Job
				call []call
			}
			var items []item
			s := d.sets[rng.IntN(len(d.sets))]
			for range 1 + rng.IntN(12) {
				if rng.IntN(3) == 0 {
					s = d.sets[rng.IntN(len(d.sets))]
				}
				req := Request{Cost: rng.IntN(3), Holder: fmt.Sprintf("task%d", rng.IntN(4)), Critical: rng.IntN(4) == 0}
				if rng.IntN(3) > 0 {
					req.Keys = make([]string, len(s.rules))
					for i := range req.Keys {
						req.Keys[i] = entities[rng.IntN(len(entities))]
					}
				}
				it := item{s: s, req: req}
				var err error
				switch x := rng.IntN(10); {
				case x < 5:
					it.p = params{op: opAllow}
					it.one, err = single.Allow(ctx, s, req)
				case x < 7:
					it.p = params{op: opReserve, horizon: time.Duration(rng.Int64N(int64(d.scale) * 10))}
					it.one, err = single.Reserve(ctx, s, req, it.p.horizon)
				case x < 9 || len(helds) == 0:
					it.p = params{op: opStatus}
					it.one, err = single.Status(ctx, s, req)
				default:
					i := rng.IntN(len(helds))
					h := helds[i]
					helds = append(helds[:i], helds[i+1:]...)
					it.s, it.req = h.s, h.req
					it.p = params{op: opRefund, n: h.batchD.cost, nonce: h.batchD.nonce, ats: h.batchD.ats, undo: h.batchD.undo}
					err = single.Refund(ctx, h.s, h.req, h.oneD)
				}
				if err != nil {
					t.Fatal(err)
				}
				if it.p.op != opRefund {
					it.p.n = max(it.req.Cost, 1)
				}
				if it.s.named && it.p.op != opRefund {
					// As the Limiter names a request: with its fair flow.
					calls, err := batched.bind(it.s, it.req, false)
					if err != nil {
						t.Fatal(err)
					}
					it.p.nonce = requestNonce(it.s, calls)
				}
				it.job, it.call = batchJob(t, batched.Limiter, it.s, it.req, it.p)
				items = append(items, it)
			}
			jobs := make([]*batch.Job, len(items))
			for i := range items {
				jobs[i] = items[i].job
			}
			batched.batch.Call(jobs)
			for i, it := range items {
				if it.job.Err != nil {
					t.Fatalf("seed %d round %d: %v", seed, round, it.job.Err)
				}
				r, err := parseReply(it.job.Reply, len(it.call))
				if err != nil {
					t.Fatal(err)
				}
				if it.p.op == opRefund {
					if r.status != stAdmitted {
						t.Fatalf("seed %d round %d: refund replied %v", seed, round, it.job.Reply)
					}
					continue
				}
				p := it.p
				if p.op == opStatus {
					p = params{req: it.req}
				}
				p.req = it.req
				got := batched.assemble(it.s, [][]call{it.call}, []reply{r}, p)
				if !sameDecision(got, it.one) {
					t.Fatalf("seed %d round %d request %d op %d on %v keys %q:\n batched %+v\n one     %+v",
						seed, round, i, it.p.op, it.s.rules, it.req.Keys, got, it.one)
				}
				if got.Allowed && it.p.op != opStatus {
					helds = append(helds, heldPair{s: it.s, req: it.req, batchD: got, oneD: it.one})
				}
			}
		}
	}
}

// counting counts the script calls a client sends, and can hold them.
type counting struct {
	calls atomic.Int64
	gate  chan struct{} // when not nil, each call waits for a receive
}

func (h *counting) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *counting) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *counting) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" || name == "fcall" {
			h.calls.Add(1)
			if h.gate != nil {
				<-h.gate
			}
		}
		return next(ctx, cmd)
	}
}

// drain lets the held calls through one at a time until wg is done.
func (h *counting) drain(wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case h.gate <- struct{}{}:
		case <-done:
			return
		}
	}
}

// newCounted is a Limiter on its own client, whose script calls h counts.
func newCounted(t *testing.T, h *counting, maxBatch int) (*Limiter, string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Client(t).Options().Addr, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(h)
	prefix := redistest.Prefix(t)
	l, err := New(Config{Client: c, Prefix: prefix, MaxBatch: maxBatch})
	if err != nil {
		t.Fatal(err)
	}
	return l, prefix
}

// TestBatchSharesCalls holds the first script calls in flight so that the
// requests behind them queue, then checks that they went in shared calls,
// that each was decided once, and that MaxBatch bounds a call.
func TestBatchSharesCalls(t *testing.T) {
	for _, maxBatch := range []int{1, 5, 32} {
		t.Run(fmt.Sprint(maxBatch), func(t *testing.T) {
			h := &counting{gate: make(chan struct{})}
			l, _ := newCounted(t, h, maxBatch)
			s := mustSet(Rule{Name: "daily", Limit: FixedWindow{Limit: 60, Every: 24 * time.Hour}})
			ctx := context.Background()
			const n = 80
			var wg sync.WaitGroup
			var allowed atomic.Int64
			for range n {
				wg.Go(func() {
					d, err := l.Allow(ctx, s, Request{Keys: []string{"k"}})
					if err != nil {
						t.Error(err)
					}
					if d.Allowed {
						allowed.Add(1)
					}
				})
			}
			// Once every request is in flight or queued, let calls through
			// one at a time until all are done.
			for queued := 0; queued < n-batch.MaxInFlight; {
				time.Sleep(time.Millisecond)
				if maxBatch == 1 {
					queued = int(h.calls.Load()) - batch.MaxInFlight
				} else {
					queued = l.batch.Queued()
				}
			}
			h.drain(&wg)
			calls := h.calls.Load()
			if allowed.Load() != 60 {
				t.Errorf("allowed %d of %d under a limit of 60", allowed.Load(), n)
			}
			minCalls := int64((n + maxBatch - 1) / maxBatch)
			if calls < minCalls {
				t.Errorf("%d requests in %d calls: more than MaxBatch %d in one", n, calls, maxBatch)
			}
			if maxBatch > 1 && calls > n/2 {
				t.Errorf("%d requests in %d calls: queued requests did not share calls", n, calls)
			}
			if maxBatch == 1 && calls != n {
				t.Errorf("MaxBatch 1: %d requests in %d calls", n, calls)
			}
			t.Logf("MaxBatch %d: %d requests in %d script calls", maxBatch, n, calls)
		})
	}
}

// TestBatchCancelledWhileQueued: a request whose context ends while it
// waits behind full calls leaves without being decided or charged.
func TestBatchCancelledWhileQueued(t *testing.T) {
	h := &counting{gate: make(chan struct{})}
	l, _ := newCounted(t, h, 0)
	s := mustSet(Rule{Name: "daily", Limit: FixedWindow{Limit: 100, Every: 24 * time.Hour}})
	req := Request{Keys: []string{"k"}}
	var wg sync.WaitGroup
	for range batch.MaxInFlight {
		wg.Go(func() {
			if _, err := l.Allow(context.Background(), s, req); err != nil {
				t.Error(err)
			}
		})
	}
	for h.calls.Load() < batch.MaxInFlight {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Allow(ctx, s, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued request: err %v, want the context's", err)
	}
	for range batch.MaxInFlight {
		h.gate <- struct{}{}
	}
	wg.Wait()
	h.gate = nil
	d, err := l.Status(context.Background(), s, req)
	if err != nil {
		t.Fatal(err)
	}
	if used := d.Rules[0].Used; used != batch.MaxInFlight {
		t.Fatalf("window used %d, want %d: the cancelled request was charged", used, batch.MaxInFlight)
	}
}

func TestMaxBatchNegative(t *testing.T) {
	if _, err := New(Config{Client: redistest.Client(t), MaxBatch: -1}); err == nil {
		t.Fatal("MaxBatch -1 accepted")
	}
}

// TestBatchSharesPairsAndLeases holds the first script calls in flight so
// that ReserveAndAllow's pairs of requests, single Allows of the same rates
// and then the slots' Releases queue behind them: they must go in shared
// calls (pairs beside single requests, releases together), and every count
// must come out as if each had its own call.
func TestBatchSharesPairsAndLeases(t *testing.T) {
	h := &counting{gate: make(chan struct{})}
	l, _ := newCounted(t, h, 0)
	rates := mustSet(Rule{Name: "daily", Limit: FixedWindow{Limit: 60, Every: 24 * time.Hour}})
	slots := mustSet(Rule{Name: "slots", Limit: Concurrency{Max: 25, Lease: time.Minute}})
	ctx := context.Background()
	for _, p := range []*script.Program{setProgram, leaseProgram} {
		// Loaded first: a call that finds no function is counted twice.
		if err := p.Load(ctx, redistest.Client(t)); err != nil {
			t.Fatal(err)
		}
	}
	req := Request{Keys: []string{"k"}}
	// gated runs n functions at once and lets their script calls through
	// one at a time once all are in flight or queued; it returns the calls.
	gated := func(n int, queued func() int, f func(i int)) int64 {
		before := h.calls.Load()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { f(i) })
		}
		for queued() < n-batch.MaxInFlight {
			time.Sleep(time.Millisecond)
		}
		h.drain(&wg)
		return h.calls.Load() - before
	}
	const n = 80
	var mu sync.Mutex
	var admitted, pairs int
	var leases []Lease
	calls := gated(n, l.batch.Queued, func(i int) {
		if i%2 == 0 {
			d, err := l.Allow(ctx, rates, req)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			admitted += b2i(d.Allowed)
			mu.Unlock()
			return
		}
		rd, sd, decided, err := l.ReserveAndAllow(ctx, rates, req, 0, slots, Request{Keys: []string{"k"}, Holder: fmt.Sprint("h", i)})
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		defer mu.Unlock()
		admitted += b2i(rd.Allowed)
		if decided != (rd.Allowed && rd.Delay == 0) {
			t.Errorf("pair %d: rates %+v, slots decided %v", i, rd, decided)
		}
		if sd.Allowed {
			pairs++
			leases = append(leases, sd.Leases...)
		}
	})
	if admitted != 60 {
		t.Errorf("rates admitted %d of %d under a limit of 60", admitted, n)
	}
	if pairs != 25 || len(leases) != 25 {
		t.Errorf("%d slots taken (%d leases) under a max of 25", pairs, len(leases))
	}
	if calls > n/2 {
		t.Errorf("%d requests in %d calls: queued pairs did not share calls", n, calls)
	}
	t.Logf("%d requests, half of them pairs, in %d script calls", n, calls)
	h.gate = make(chan struct{})
	calls = gated(len(leases), l.leases.Queued, func(i int) {
		if ok, err := l.Release(ctx, leases[i]); err != nil || !ok {
			t.Errorf("release %d: %v, %v", i, ok, err)
		}
	})
	if calls > int64(len(leases))/2 {
		t.Errorf("%d releases in %d calls: queued releases did not share calls", len(leases), calls)
	}
	t.Logf("%d releases in %d script calls", len(leases), calls)
	h.gate = nil
	if d, err := l.Status(ctx, slots, req); err != nil || d.Rules[0].Used != 0 {
		t.Fatalf("slots used after every release: %+v, %v", d.Rules, err)
	}
	if d, err := l.Status(ctx, rates, req); err != nil || d.Rules[0].Used != 60 {
		t.Fatalf("window used: %+v, %v", d.Rules, err)
	}
}
