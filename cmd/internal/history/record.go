// Package history keeps the last minutes of the limits for the live page's
// charts (the worker's / and /history): per rule, and per busiest key of a
// keyed rule, the tasks admitted and the upstream 429s per second, the
// limit in force, the units in use and the tasks waiting.
//
// The history lives in the limits' Redis, merged across the fleet and
// bounded, in one hash and one string per Step:
//
//	PREFIX hist:B    hash: the tasks admitted ("A\x1fRULE", and for a key
//	                 "a\x1fRULE\x1fKEY") and throttled ("T...", "t...") in
//	                 step B (Unix time / Step, on Redis's clock), summed
//	                 by HINCRBY
//	PREFIX hist:B:s  string: a JSON sample of the limits' state (the
//	                 status report, each rule's busiest KeysPerRule keys)
//	                 taken by the sampler, settle into step B (SET NX:
//	                 one per step)
//	PREFIX hist:sampler  string: the id of the worker that samples, for
//	                 samplerTTL unless it renews it
//
// the steps' keys living Span plus two steps. Each worker counts its own
// tasks in memory (a rule's keys beyond maxLocalKeys in a step count in its
// total only) and adds them to Redis once a step ends, its KeysPerRule
// busiest keys per rule: one pipeline per worker per step with tasks,
// however many; an idle worker makes one call per 15 s (trying to become
// the sampler). The key is stored encoded (internal/keys), so a long or
// odd key takes at most keys.MaxEncoded bytes.
//
// Application code of the binaries, imported by cmd/worker.
package history

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/taskrl"
)

// Step is the history's resolution; Span how far back it goes; KeysPerRule
// how many keys of a keyed rule each worker reports per step, and the
// history shows.
const (
	Step        = 5 * time.Second
	Span        = 15 * time.Minute
	KeysPerRule = 5
)

// maxLocalKeys bounds the keys of a rule a worker counts apart in a step.
const maxLocalKeys = 1000

// ttl is how long a step's keys live in Redis.
const ttl = Span + 2*Step

// step is the number of the step t falls in.
func step(t time.Time) int64 { return t.UnixMilli() / Step.Milliseconds() }

func countsKey(prefix string, b int64) string { c, _ := keys.History(prefix, b); return c }
func sampleKey(prefix string, b int64) string { _, s := keys.History(prefix, b); return s }

// Field names of a step's counts hash.
func totalField(kind byte, rule string) string { return string(kind) + "\x1f" + rule }
func keyField(kind byte, rule, key string) string {
	return string(kind) + "\x1f" + rule + "\x1f" + keys.Encode(key)
}

// Config configures a Recorder.
type Config struct {
	// Client is the limits' Redis, where the history is kept. Required.
	Client redis.UniversalClient
	// Prefix is the workers' key prefix (--prefix).
	Prefix string
	// Sample reads the limits' state for a step's sample: of each keyed
	// rule, the keys busiest names (those with the most tasks in the step
	// before, as the fleet counted them), so that no SCAN is needed. Nil:
	// this recorder counts but takes no samples.
	Sample func(ctx context.Context, busiest map[string][]string) (status.Report, error)
	// Now is the worker's clock; default time.Now. Steps are numbered on
	// Redis's clock: the offset is learned from TIME with each write.
	Now func() time.Time
	// Logger reports failed writes (at most one a minute); default
	// slog.Default().
	Logger *slog.Logger
}

// settle is how long after a step's end its counts are taken as all in:
// every worker adds its own within a second (Run ticks every second).
const settle = 2 * time.Second

// samplerTTL is how long the sampler's role (PREFIX hist:sampler) lasts
// unless its holder renews it, as it does with each sample; a worker
// without it tries to take it every samplerTTL/2, so an idle fleet makes
// one call per worker per 15 s.
const samplerTTL = 30 * time.Second

// Recorder counts a worker's tasks per rule and key for the history, as a
// taskrl.Observer, and adds them to Redis (Run). Its methods are safe for
// concurrent use.
type Recorder struct {
	cfg Config
	id  string // this recorder's, as the sampler

	mu      sync.Mutex
	steps   map[int64]map[string]*ruleCounts // by step, by rule
	offset  time.Duration                    // Redis's clock minus the worker's
	holder  bool                             // this recorder holds the sampler's role (last it knew)
	tried   time.Time                        // when it last tried to take the role
	sampled int64                            // the last step it sampled
	logged  time.Time                        // the last failure logged

	sampling sync.WaitGroup // a sample being taken (one at a time)
	busy     bool           // under mu: a sample is being taken
}

// ruleCounts are one rule's counts in one step.
type ruleCounts struct {
	admitted, throttled int64
	keys                map[string]*[2]int64 // admitted, throttled by key
}

// NewRecorder returns a Recorder writing to cfg.Client.
func NewRecorder(cfg Config) *Recorder {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var id [8]byte
	rand.Read(id[:])
	return &Recorder{cfg: cfg, id: hex.EncodeToString(id[:]), steps: map[int64]map[string]*ruleCounts{}}
}

// Observe counts an Admitted event under each rule and key it names, and
// an UpstreamThrottled one (a 429) under each rule it blocks.
func (r *Recorder) Observe(e taskrl.Event) {
	if (e.Outcome == taskrl.Admitted || e.Outcome == taskrl.UpstreamThrottled) && len(e.Keys) > 0 {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.add(e, step(r.cfg.Now().Add(r.offset)))
	}
}

// add counts e in step b; r.mu is held.
func (r *Recorder) add(e taskrl.Event, b int64) {
	i := 0
	if e.Outcome == taskrl.UpstreamThrottled {
		i = 1
	}
	rules := r.steps[b]
	if rules == nil {
		rules = map[string]*ruleCounts{}
		r.steps[b] = rules
	}
	for _, rk := range e.Keys {
		rc := rules[rk.Rule]
		if rc == nil {
			rc = &ruleCounts{keys: map[string]*[2]int64{}}
			rules[rk.Rule] = rc
		}
		if i == 0 {
			rc.admitted++
		} else {
			rc.throttled++
		}
		if rk.Key == "" {
			continue
		}
		k := rc.keys[rk.Key]
		if k == nil {
			if len(rc.keys) >= maxLocalKeys {
				continue
			}
			k = new([2]int64)
			rc.keys[rk.Key] = k
		}
		k[i]++
	}
}

// Run adds the counts of each ended step to Redis and, while this worker
// is the sampler, takes each step's sample, every second until ctx ends;
// then it adds what is left, the current step's too.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		// A write under way when ctx ends is finished: its counts are
		// already out of memory.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		select {
		case <-ctx.Done():
			r.sampling.Wait()
			r.tick(tctx, true)
			cancel()
			return
		case <-t.C:
			r.tick(tctx, false)
		}
		cancel()
	}
}

// tick adds the ended steps' counts (all of them if final) and, once per
// step, from settle into it, takes the step's sample if this recorder is
// the sampler; a recorder that is not tries to become it every
// samplerTTL/2.
func (r *Recorder) tick(ctx context.Context, final bool) {
	r.mu.Lock()
	local := r.cfg.Now()
	now := local.Add(r.offset)
	cur := step(now)
	var ended map[int64]map[string]*ruleCounts
	for b, rules := range r.steps {
		if b < cur || final {
			if ended == nil {
				ended = map[int64]map[string]*ruleCounts{}
			}
			ended[b] = rules
			delete(r.steps, b)
		}
	}
	sampler := !final && r.cfg.Sample != nil && !r.busy
	try := sampler && !r.holder && local.Sub(r.tried) >= samplerTTL/2
	if try {
		r.tried = local
	}
	due := sampler && (r.holder || try) && cur != r.sampled && now.Sub(time.UnixMilli(cur*Step.Milliseconds())) >= settle
	r.mu.Unlock()

	var err error
	if len(ended) > 0 {
		err = r.flush(ctx, ended)
	}
	if err == nil && try {
		var ok bool
		ok, err = r.cfg.Client.SetNX(ctx, keys.HistorySampler(r.cfg.Prefix), r.id, samplerTTL).Result()
		r.mu.Lock()
		r.holder = ok
		r.mu.Unlock()
	}
	if err == nil && due {
		err = r.claim(ctx, cur)
	}
	if err != nil {
		r.failed(err)
	}
}

// flush adds the counts of the ended steps to Redis, with TIME to learn
// the offset of Redis's clock.
func (r *Recorder) flush(ctx context.Context, ended map[int64]map[string]*ruleCounts) error {
	sent := r.cfg.Now()
	pipe := r.cfg.Client.Pipeline()
	tm := pipe.Time(ctx)
	for b, rules := range ended {
		key := countsKey(r.cfg.Prefix, b)
		for name, rc := range rules {
			if rc.admitted > 0 {
				pipe.HIncrBy(ctx, key, totalField('A', name), rc.admitted)
			}
			if rc.throttled > 0 {
				pipe.HIncrBy(ctx, key, totalField('T', name), rc.throttled)
			}
			for _, k := range busiest(rc.keys, KeysPerRule) {
				c := rc.keys[k]
				if c[0] > 0 {
					pipe.HIncrBy(ctx, key, keyField('a', name, k), c[0])
				}
				if c[1] > 0 {
					pipe.HIncrBy(ctx, key, keyField('t', name, k), c[1])
				}
			}
		}
		pipe.Expire(ctx, key, ttl)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	r.learn(tm.Val(), sent)
	return nil
}

// learn sets the offset of Redis's clock from its time server, read
// between sent and now on the worker's clock (halfway).
func (r *Recorder) learn(server, sent time.Time) {
	got := r.cfg.Now()
	r.mu.Lock()
	r.offset = server.Sub(sent.Add(got.Sub(sent) / 2))
	r.mu.Unlock()
}

// claim checks that this recorder still holds the sampler's role, renews
// it, and takes step b's sample unless another worker did: in a goroutine
// of its own, so the counts go on being added meanwhile.
func (r *Recorder) claim(ctx context.Context, b int64) error {
	sent := r.cfg.Now()
	pipe := r.cfg.Client.Pipeline()
	tm := pipe.Time(ctx)
	holder := pipe.Get(ctx, keys.HistorySampler(r.cfg.Prefix))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	r.learn(tm.Val(), sent)
	if holder.Val() != r.id {
		r.mu.Lock()
		r.holder = false
		r.mu.Unlock()
		return nil
	}
	pipe = r.cfg.Client.Pipeline()
	pipe.Expire(ctx, keys.HistorySampler(r.cfg.Prefix), samplerTTL)
	won := pipe.SetNX(ctx, sampleKey(r.cfg.Prefix, b), "", ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sampled = b
	if !won.Val() {
		return nil
	}
	r.busy = true
	r.sampling.Add(1)
	go func() {
		defer r.sampling.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.sample(ctx, b); err != nil {
			r.failed(err)
		}
		r.mu.Lock()
		r.busy = false
		r.mu.Unlock()
	}()
	return nil
}

// sample stores the limits' state as step b's sample.
func (r *Recorder) sample(ctx context.Context, b int64) error {
	fields, err := r.cfg.Client.HGetAll(ctx, countsKey(r.cfg.Prefix, b-1)).Result()
	if err != nil {
		return err
	}
	named := map[string][]string{}
	for rule, ks := range parseCounts(fields) {
		for _, enc := range busiest(ks, KeysPerRule) {
			if key, ok := keys.Decode(enc); ok {
				named[rule] = append(named[rule], key)
			}
		}
	}
	rep, err := r.cfg.Sample(ctx, named)
	if err != nil {
		return err
	}
	data, err := json.Marshal(compact(rep))
	if err != nil {
		return err
	}
	return r.cfg.Client.SetArgs(ctx, sampleKey(r.cfg.Prefix, b), data, redis.SetArgs{Mode: "XX", KeepTTL: true}).Err()
}

// failed logs err, at most once a minute: the history is a convenience,
// the tasks go on.
func (r *Recorder) failed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.logged) >= time.Minute {
		r.logged = now
		r.cfg.Logger.Warn("history: writing the live page's history to Redis failed", "err", err)
	}
}

// busiest returns at most n keys of counts, those with the most tasks
// first (ties by key); a rule's total ("") is not a key.
func busiest(counts map[string]*[2]int64, n int) []string {
	var ks []string
	for k := range counts {
		if k != "" {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, func(a, b string) int {
		ca, cb := counts[a], counts[b]
		return cmp.Or(cmp.Compare(cb[0]+cb[1], ca[0]+ca[1]), cmp.Compare(a, b))
	})
	return ks[:min(n, len(ks))]
}
