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
//	                 step B (Unix seconds / 5), summed by HINCRBY
//	PREFIX hist:B:s  string: a JSON sample of the limits' state (the
//	                 status report, each rule's busiest KeysPerRule keys)
//	                 taken by the one worker whose SET NX won step B
//
// both living Span plus two steps. Each worker counts its own tasks in
// memory (a rule's keys beyond maxLocalKeys in a step count in its total
// only) and adds them to Redis once a step ends, its KeysPerRule busiest
// keys per rule: one pipeline per worker per step, and one SET NX, however
// many tasks ran. The key is stored encoded (internal/keys), so a long or
// odd key takes at most keys.MaxEncoded bytes.
//
// Application code of the binaries, imported by cmd/worker.
package history

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strconv"
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

func countsKey(prefix string, b int64) string { return prefix + "hist:" + strconv.FormatInt(b, 10) }
func sampleKey(prefix string, b int64) string { return countsKey(prefix, b) + ":s" }

// Field names of a step's counts hash.
func totalField(kind byte, rule string) string    { return string(kind) + "\x1f" + rule }
func keyField(kind byte, rule, key string) string { return encField(kind, rule, keys.Encode(key)) }
func encField(kind byte, rule, enc string) string { return string(kind) + "\x1f" + rule + "\x1f" + enc }

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
	// Redis's clock: the offset is learned from TIME at each flush.
	Now func() time.Time
	// Logger reports failed writes (at most one a minute); default
	// slog.Default().
	Logger *slog.Logger
}

// Recorder counts a worker's tasks per rule and key for the history, as a
// taskrl.Observer, and adds them to Redis (Run). Its methods are safe for
// concurrent use.
type Recorder struct {
	cfg Config

	mu      sync.Mutex
	steps   map[int64]map[string]*ruleCounts // by step, by rule
	offset  time.Duration                    // Redis's clock minus the worker's
	claimed int64                            // the last step this recorder tried to sample
	logged  time.Time                        // the last failure logged
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
	return &Recorder{cfg: cfg, steps: map[int64]map[string]*ruleCounts{}}
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

// Run adds the counts of each ended step to Redis and takes the samples
// this recorder wins, every second until ctx ends; then it adds what is
// left, the current step's too.
func (r *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			r.tick(fctx, true)
			cancel()
			return
		case <-t.C:
			r.tick(ctx, false)
		}
	}
}

// tick adds the ended steps' counts (all of them if final) and, once per
// step, tries to take the step's sample.
func (r *Recorder) tick(ctx context.Context, final bool) {
	r.mu.Lock()
	now := step(r.cfg.Now().Add(r.offset))
	var ended map[int64]map[string]*ruleCounts
	for b, rules := range r.steps {
		if b < now || final {
			if ended == nil {
				ended = map[int64]map[string]*ruleCounts{}
			}
			ended[b] = rules
			delete(r.steps, b)
		}
	}
	claim := !final && now != r.claimed && r.cfg.Sample != nil
	r.claimed = now
	r.mu.Unlock()

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
			for _, k := range busiestKeys(rc.keys, KeysPerRule) {
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
	var won *redis.BoolCmd
	if claim {
		won = pipe.SetNX(ctx, sampleKey(r.cfg.Prefix, now), "", ttl)
	}
	_, err := pipe.Exec(ctx)
	if err == nil {
		// The step numbers follow Redis's clock, read halfway.
		got := r.cfg.Now()
		r.mu.Lock()
		r.offset = tm.Val().Sub(sent.Add(got.Sub(sent) / 2))
		r.mu.Unlock()
	}
	if err == nil && won != nil && won.Val() {
		err = r.sample(ctx, now)
	}
	if err != nil {
		r.failed(err)
	}
}

// sample stores the limits' state as step b's sample.
func (r *Recorder) sample(ctx context.Context, b int64) error {
	fields, err := r.cfg.Client.HGetAll(ctx, countsKey(r.cfg.Prefix, b-1)).Result()
	if err != nil {
		return err
	}
	busiest := map[string][]string{}
	for rule, ks := range parseCounts(fields) {
		for _, enc := range busiestEncoded(ks, KeysPerRule) {
			if key, ok := keys.Decode(enc); ok {
				busiest[rule] = append(busiest[rule], key)
			}
		}
	}
	rep, err := r.cfg.Sample(ctx, busiest)
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

// busiestKeys returns at most n keys of counts, those with the most tasks
// first (ties by key); busiestEncoded the same of counts by encoded key,
// the rule's total ("") aside.
func busiestKeys(counts map[string]*[2]int64, n int) []string {
	return top(slices.Collect(maps.Keys(counts)), counts, n)
}

func busiestEncoded(counts map[string]*[2]int64, n int) []string {
	var ks []string
	for k := range counts {
		if k != "" {
			ks = append(ks, k)
		}
	}
	return top(ks, counts, n)
}

func top(ks []string, counts map[string]*[2]int64, n int) []string {
	slices.SortFunc(ks, func(a, b string) int {
		ca, cb := counts[a], counts[b]
		return cmp.Or(cmp.Compare(cb[0]+cb[1], ca[0]+ca[1]), cmp.Compare(a, b))
	})
	return ks[:min(n, len(ks))]
}
