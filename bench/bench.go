// Package bench compares the taskrl GCRA limiter and rule sets of the
// quotas package with github.com/go-redis/redis_rate and with a plain Redis
// INCR, against one real redis-server, at 50 concurrent callers.
//
// It is a separate module so that redis_rate never enters the main module's
// go.mod. Run the benchmarks with "go test -bench . -benchmem" in this
// directory, or print the comparison table with "go run ./cmd/benchtable".
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/quotas"
)

// Callers is the number of concurrent callers every case runs with.
const Callers = 50

// NumKeys is the number of distinct keys the random-keys mode draws from.
const NumKeys = 10000

// Key prefixes: each contender writes under its own.
const (
	TaskrlPrefix = "bench:taskrl:" // taskrl keys: bench:taskrl:gcra:{k…}
	RateKeyBase  = "bench:rr:"     // redis_rate keys: rate:bench:rr:k…
	RatePrefix   = "rate:"         // redis_rate's fixed key prefix (redisPrefix in rate.go)
	IncrPrefix   = "bench:incr:"   // INCR keys: bench:incr:k…
	QuotasPrefix = "bench:q:"      // quotas keys: bench:q:q:{tag}:rule:kind
	hotKey       = "hot"           // the single key of hot-key mode
	keyFormat    = "k%05d"         // random-mode key names
)

// TaskrlLimit and RateLimit are the same limit for both limiters: 100,000
// per second with a burst of 100,000. It is far above what 50 callers on a
// small machine reach, so nearly every call is allowed and both limiters do
// the same work (read the state, write it back with a TTL).
var (
	TaskrlLimit = gcra.Limit{Rate: 100000, Period: time.Second, Burst: 100000}
	RateLimit   = redis_rate.Limit{Rate: 100000, Period: time.Second, Burst: 100000}
)

// Contenders and modes, in table order.
//
// taskrl is gcra.Limiter.AllowN, where concurrent decisions share script
// calls (the default, Config.MaxBatch 32); taskrl-single the same with
// MaxBatch 1, every decision its own call, as redis_rate's.
//
// The quotas contenders decide rule sets with quotas.Limiter.Allow:
//
//   - quotas-1rule: one GCRA rule with TaskrlLimit; its key is the global
//     key in hot-key mode and one of NumKeys entities in random-keys mode.
//   - quotas-4rule: FourRules (global GCRA, global 10s fixed window, global
//     daily calendar window, per-business GCRA); the business is one of
//     NumKeys (random-keys) or a single one (hot-key).
//   - quotas-5rule: FiveRules, the four plus a per-business concurrency
//     rule; one call is one Allow taking a slot for one of HolderPool
//     holders (see Allow5).
//   - quotas-5rule-single: the same on a Limiter with MaxBatch 1, where
//     every decision is its own script call. The other quotas cases use the
//     default, where concurrent decisions share calls.
//   - quotas-reserve: Reserve (horizon 1h) of TwoRules, a global GCRA and a
//     per-business GCRA of 1/s burst 1, which binds after a business's
//     first call: every later call books its business's next second, ahead
//     of the global rule's other bookings (in random-keys mode each of
//     NumKeys businesses books about one a second; in hot-key mode the one
//     business books up to the horizon, then is refused).
//
// fair.go adds the cases of fair rules.
var (
	Contenders = []string{"taskrl", "taskrl-single", "redis_rate", "incr", "quotas-1rule", "quotas-4rule", "quotas-5rule", "quotas-5rule-single", "quotas-reserve"}
	Modes      = []string{"random-keys", "hot-key"}
	// moreOps holds the operations of contenders added by other files.
	moreOps = map[string]func(e *Env) op{}
)

// Rule sets of the quotas cases. Every limit is far above what the machine
// reaches, so nearly every call is allowed and each rule is charged.
var (
	// OneRule is one GCRA rule with the same limit as the gcra and
	// redis_rate cases.
	OneRule = mustSet(quotas.Rule{Name: "peak", Limit: quotas.GCRA(TaskrlLimit)})
	// FourRules: peak GCRA (global), 10s fixed window (global), daily
	// calendar window (global), business GCRA (per business).
	FourRules = mustSet(fourRules()...)
	// FiveRules is FourRules plus a per-business concurrency rule.
	FiveRules = mustSet(append(fourRules(),
		quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 1000000, Lease: 30 * time.Second}})...)
	// TwoRules: a global GCRA of TaskrlLimit's rate with a burst of 100 (a
	// burst of 100,000 would make each decision's status count the free
	// intervals among a second's worth of bookings), named apart so that
	// its bookings never reach the other cases, and a per-business GCRA of
	// 1/s.
	TwoRules = mustSet(
		quotas.Rule{Name: "peak2", Limit: quotas.GCRA(gcra.Limit{Rate: TaskrlLimit.Rate, Period: TaskrlLimit.Period, Burst: 100})},
		quotas.Rule{Name: "slow", Limit: quotas.GCRA(gcra.Limit{Rate: 1, Period: time.Second, Burst: 1})},
	)
)

func fourRules() []quotas.Rule {
	return []quotas.Rule{
		{Name: "peak", Limit: quotas.GCRA(TaskrlLimit)},
		{Name: "window", Limit: quotas.FixedWindow{Limit: 1 << 30, Every: 10 * time.Second}},
		{Name: "daily", Limit: quotas.CalendarWindow{Limit: 1 << 30, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		{Name: "business", Limit: quotas.GCRA(TaskrlLimit)},
	}
}

func mustSet(rules ...quotas.Rule) *quotas.Set {
	s, err := quotas.NewSet(rules...)
	if err != nil {
		panic(err)
	}
	return s
}

// Server is the redis-server the benchmarks run against.
type Server struct {
	Addr string
	stop func()
}

// Stop kills the server. It is safe to call more than once.
func (s *Server) Stop() {
	if s.stop != nil {
		s.stop()
	}
}

// StartServer starts a fresh standalone redis-server (no persistence) on a
// free loopback port through internal/testkit/redistest. The harness also starts a
// small Redis Cluster alongside it, which the benchmarks leave idle.
func StartServer() (*Server, error) {
	env, stop, err := redistest.StartShared()
	if err != nil {
		return nil, err
	}
	var e struct {
		Standalone struct {
			Addr string `json:"addr"`
		} `json:"standalone"`
	}
	if err := json.Unmarshal([]byte(env), &e); err != nil || e.Standalone.Addr == "" {
		stop()
		return nil, fmt.Errorf("bench: cannot read standalone address from %s=%s: %v", redistest.EnvVar, env, err)
	}
	return &Server{Addr: e.Standalone.Addr, stop: stop}, nil
}

// Env holds the client and the limiters, shared by every case.
type Env struct {
	Client *redis.Client
	Taskrl *gcra.Limiter
	// TaskrlSingle sends every decision in its own script call
	// (Config.MaxBatch 1), for the taskrl-single case.
	TaskrlSingle *gcra.Limiter
	Rate         *redis_rate.Limiter
	Quotas       *quotas.Limiter
	// QuotasSingle sends every decision in its own script call
	// (Config.MaxBatch 1), for the quotas-5rule-single case.
	QuotasSingle *quotas.Limiter
	holder       atomic.Uint64 // numbers the concurrency holders of quotas-5rule
}

// NewEnv connects to addr. The pool has one connection per caller, so the
// cases measure the limiters, not waiting for a pooled connection.
func NewEnv(addr string) (*Env, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: Callers, MinIdleConns: Callers})
	if err := c.Ping(context.Background()).Err(); err != nil {
		_ = c.Close()
		return nil, err
	}
	l, err := gcra.New(gcra.Config{Client: c, Prefix: TaskrlPrefix})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	l1, err := gcra.New(gcra.Config{Client: c, Prefix: TaskrlPrefix, MaxBatch: 1})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	q, err := quotas.New(quotas.Config{Client: c, Prefix: QuotasPrefix})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	q1, err := quotas.New(quotas.Config{Client: c, Prefix: QuotasPrefix, MaxBatch: 1})
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return &Env{Client: c, Taskrl: l, TaskrlSingle: l1, Rate: redis_rate.NewLimiter(c), Quotas: q, QuotasSingle: q1}, nil
}

// Allow5 makes one quotas-5rule decision for business biz, one Allow: the
// holder comes from a pool of HolderPool ids, so a holder that takes a slot
// again replaces its own lease (as a redelivered task does) and the slots
// held per business stay bounded without a Release round trip.
func (e *Env) Allow5(ctx context.Context, biz string) (bool, error) {
	return e.allow5(ctx, e.Quotas, biz)
}

func (e *Env) allow5(ctx context.Context, l *quotas.Limiter, biz string) (bool, error) {
	d, err := l.Allow(ctx, FiveRules, quotas.Request{Keys: []string{"", "", "", biz, biz}, Holder: e.nextHolder()})
	if err != nil {
		return false, err
	}
	return d.Allowed, nil
}

// nextHolder returns the next of HolderPool concurrency holders.
func (e *Env) nextHolder() string {
	return "task-" + strconv.FormatUint(e.holder.Add(1)%HolderPool, 10)
}

// HolderPool is how many distinct concurrency holders quotas-5rule uses.
const HolderPool = 64

// Close closes the client.
func (e *Env) Close() error { return e.Client.Close() }

// op performs one call on key and reports whether it was allowed.
type op func(ctx context.Context, key string) (bool, error)

// Case is one benchmark: a contender in a key mode.
type Case struct {
	Contender string // taskrl, redis_rate or incr
	Mode      string // random-keys or hot-key
	keys      []string
	op        op
	calls     *atomic.Int64 // every call made by Bench, warm-up and ramp-up runs included
}

// Calls returns how many calls Bench has made for c so far, including the
// calibration runs of the testing package.
func (c Case) Calls() int64 { return c.calls.Load() }

// Name is "contender/mode", the sub-benchmark name under BenchmarkAllow.
func (c Case) Name() string { return c.Contender + "/" + c.Mode }

// Cases returns the cases in table order: each contender in random-keys
// mode, then each in hot-key mode.
func (e *Env) Cases() []Case {
	ops := map[string]op{
		"taskrl": func(ctx context.Context, key string) (bool, error) {
			r, err := e.Taskrl.AllowN(ctx, key, TaskrlLimit, 1)
			return r.Allowed, err
		},
		"taskrl-single": func(ctx context.Context, key string) (bool, error) {
			r, err := e.TaskrlSingle.AllowN(ctx, key, TaskrlLimit, 1)
			return r.Allowed, err
		},
		"redis_rate": func(ctx context.Context, key string) (bool, error) {
			r, err := e.Rate.AllowN(ctx, key, RateLimit, 1)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		},
		"incr": func(ctx context.Context, key string) (bool, error) {
			return true, e.Client.Incr(ctx, key).Err()
		},
		"quotas-1rule": func(ctx context.Context, key string) (bool, error) {
			d, err := e.Quotas.Allow(ctx, OneRule, quotas.Request{Keys: []string{key}})
			return d.Allowed, err
		},
		"quotas-4rule": func(ctx context.Context, key string) (bool, error) {
			d, err := e.Quotas.Allow(ctx, FourRules, quotas.Request{Keys: []string{"", "", "", key}})
			return d.Allowed, err
		},
		"quotas-5rule": e.Allow5,
		"quotas-5rule-single": func(ctx context.Context, biz string) (bool, error) {
			return e.allow5(ctx, e.QuotasSingle, biz)
		},
		"quotas-reserve": func(ctx context.Context, key string) (bool, error) {
			d, err := e.Quotas.Reserve(ctx, TwoRules, quotas.Request{Keys: []string{"", key}}, time.Hour)
			return d.Allowed, err
		},
	}
	for name, mk := range moreOps {
		ops[name] = mk(e)
	}
	// Key names as each contender is called with them; the contender adds
	// its own prefix (taskrl) or not (redis_rate always adds "rate:").
	base := map[string]string{"taskrl": "", "taskrl-single": "", "redis_rate": RateKeyBase, "incr": IncrPrefix}
	var cs []Case
	for _, mode := range Modes {
		for _, name := range Contenders {
			var keys []string
			if mode == "hot-key" {
				keys = []string{base[name] + hotKey}
				if name == "quotas-1rule" {
					keys = []string{""} // the rule's global key
				}
			} else {
				keys = make([]string, NumKeys)
				for i := range keys {
					keys[i] = base[name] + fmt.Sprintf(keyFormat, i)
				}
			}
			cs = append(cs, Case{Contender: name, Mode: mode, keys: keys, op: ops[name], calls: new(atomic.Int64)})
		}
	}
	return cs
}

// Parallelism returns the b.SetParallelism factor giving Callers goroutines
// at the current GOMAXPROCS (rounded up when GOMAXPROCS does not divide it).
func Parallelism() int {
	p := runtime.GOMAXPROCS(0)
	return (Callers + p - 1) / p
}

// Bench returns the benchmark function of c: b.N calls spread over
// Callers goroutines, each drawing its keys uniformly from c's key set. It
// reports the fraction of calls allowed as the "allowed/op" metric.
func (c Case) Bench() func(*testing.B) {
	return func(b *testing.B) {
		ctx := context.Background()
		c.calls.Add(1)
		if _, err := c.op(ctx, c.keys[0]); err != nil { // warm: load the script, fail fast
			b.Fatal(err)
		}
		var allowed, calls atomic.Int64
		var failed atomic.Pointer[error]
		var seed atomic.Uint64
		b.SetParallelism(Parallelism())
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(seed.Add(1), 0x7461736b726c))
			n, ok := int64(0), int64(0)
			for pb.Next() {
				k := c.keys[0]
				if len(c.keys) > 1 {
					k = c.keys[r.IntN(len(c.keys))]
				}
				a, err := c.op(ctx, k)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					continue
				}
				n++
				if a {
					ok++
				}
			}
			calls.Add(n)
			allowed.Add(ok)
			c.calls.Add(n)
		})
		b.StopTimer()
		if p := failed.Load(); p != nil {
			b.Fatal(*p)
		}
		if c.Contender != "incr" && calls.Load() > 0 {
			b.ReportMetric(float64(allowed.Load())/float64(calls.Load()), "allowed/op")
		}
	}
}

// RunSequential makes n calls of c one after another from a single caller,
// drawing keys as Bench does, and returns how many were allowed. It is used
// to read the server-side cost of a call without 50 callers competing with
// the server for the CPU.
func (c Case) RunSequential(ctx context.Context, n int) (allowed int, err error) {
	r := rand.New(rand.NewPCG(1, 0x7461736b726c))
	for range n {
		k := c.keys[0]
		if len(c.keys) > 1 {
			k = c.keys[r.IntN(len(c.keys))]
		}
		a, err := c.op(ctx, k)
		if err != nil {
			return allowed, err
		}
		if a {
			allowed++
		}
	}
	return allowed, nil
}
