package history

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
)

// sample is a step's state of the limits, as stored: short names keep it
// small (a few dozen bytes per key).
type sample struct {
	Rules []sampleRule `json:"r"`
}

type sampleRule struct {
	Name  string      `json:"n"`
	Kind  string      `json:"k"`
	Limit string      `json:"l"`
	Keys  []keySample `json:"s,omitempty"` // the rule's one key, or its busiest
}

type keySample struct {
	Key       string  `json:"k,omitempty"`
	Used      int     `json:"u"`
	Remaining int     `json:"r"`
	Rate      float64 `json:"t,omitempty"`
	Slots     int     `json:"c,omitempty"`
	Waiting   int     `json:"w,omitempty"`
}

// compact keeps of rep what the charts show: each rule's one key, or its
// KeysPerRule busiest.
func compact(rep status.Report) sample {
	var s sample
	for _, r := range rep.Rules {
		sr := sampleRule{Name: r.Name, Kind: r.Kind, Limit: r.Limit}
		add := func(k status.KeyState) {
			sr.Keys = append(sr.Keys, keySample{Key: k.Key, Used: k.Used, Remaining: k.Remaining, Rate: k.Rate, Slots: k.Slots, Waiting: k.Waiting})
		}
		if r.KeyState != nil {
			add(*r.KeyState)
		}
		for _, k := range r.Busiest[:min(KeysPerRule, len(r.Busiest))] {
			add(k)
		}
		s.Rules = append(s.Rules, sr)
	}
	return s
}

// History is the recent past of a policy's rules, one value per Step from
// Start on.
type History struct {
	// At is the Redis server's time of the reading; Start the start of the
	// first step; Step the seconds per step; Steps how many there are
	// (the step under way is not one: its counts are not all in).
	At    time.Time `json:"at"`
	Start time.Time `json:"start"`
	Step  float64   `json:"step"`
	Steps int       `json:"steps"`
	Rules []Rule    `json:"rules"`
}

// Rule is one rule's history.
type Rule struct {
	Name string `json:"name"`
	// Kind and Limit are as the last sample had them (status.Rule).
	Kind  string `json:"kind"`
	Limit string `json:"limit"`
	// Unit says what the series' Level and Limit count: "tasks/s" for
	// gcra and adaptive rules (the level is then Admitted), "units" used
	// in the window for quota and sliding rules, "slots" held for
	// concurrency rules.
	Unit string `json:"unit"`
	// Series are the rule's one key, or, for a keyed rule, all its keys
	// together (All: counts only) then its busiest keys, at most
	// KeysPerRule.
	Series []Series `json:"series"`
}

// Series is the history of one key of a rule. Values are per step; nil
// where no worker took a sample.
type Series struct {
	Key string `json:"key"`
	All bool   `json:"all,omitempty"`
	// Admitted and Throttled are the tasks admitted and the upstream
	// 429s, per second.
	Admitted  []float64 `json:"admitted"`
	Throttled []float64 `json:"throttled"`
	// Level is the units in use (windows: used in the window; concurrency:
	// slots held), Limit the limit in force (in Unit: an adaptive rule's
	// learned rate, a window's units, the slots) and Waiting the tasks
	// waiting under the key, sampled once a step. Absent for All.
	Level   []*float64 `json:"level,omitempty"`
	Limit   []*float64 `json:"limit,omitempty"`
	Waiting []*int     `json:"waiting,omitempty"`
}

// stepData is what Redis holds of one step: the counts by rule, key
// (encoded; "" for the rule's total) and kind ('a' admitted, 't'
// throttled), and the sample.
type stepData struct {
	counts map[string]map[string]*[2]int64
	rules  map[string]*sampleRule // the sample's, by name
}

// count returns the step's count of kind of rule's key (encoded).
func (d stepData) count(rule, enc string, kind int) int64 {
	if c := d.counts[rule][enc]; c != nil {
		return c[kind]
	}
	return 0
}

// parseCounts files a step's hash fields (totalField, keyField) by rule
// and key.
func parseCounts(fields map[string]string) map[string]map[string]*[2]int64 {
	out := map[string]map[string]*[2]int64{}
	for f, v := range fields {
		n, err := strconv.ParseInt(v, 10, 64)
		parts := strings.SplitN(f, "\x1f", 3)
		if err != nil || len(parts) < 2 || len(parts[0]) != 1 {
			continue
		}
		kind, enc := 0, ""
		switch parts[0] {
		case "A", "T":
		case "a", "t":
			if len(parts) != 3 {
				continue
			}
			enc = parts[2]
		default:
			continue
		}
		if parts[0] == "T" || parts[0] == "t" {
			kind = 1
		}
		keys := out[parts[1]]
		if keys == nil {
			keys = map[string]*[2]int64{}
			out[parts[1]] = keys
		}
		c := keys[enc]
		if c == nil {
			c = new([2]int64)
			keys[enc] = c
		}
		c[kind] += n
	}
	return out
}

// Reader reads the history, keeping the steps that can no longer change.
// Its methods are safe for concurrent use.
type Reader struct {
	client redis.UniversalClient
	prefix string

	mu    sync.Mutex
	steps map[int64]stepData // ended at least two steps ago
}

// NewReader returns a Reader of the history in client under prefix.
func NewReader(client redis.UniversalClient, prefix string) *Reader {
	return &Reader{client: client, prefix: prefix, steps: map[int64]stepData{}}
}

// Read returns the history of p's rules over the last Span, on Redis's
// clock, up to the last step that ended settle ago or more (every worker's
// counts are in).
func (r *Reader) Read(ctx context.Context, p *policy.Policy) (History, error) {
	now, err := r.client.Time(ctx).Result()
	if err != nil {
		return History{}, err
	}
	last := step(now.Add(-settle)) - 1 // every worker's counts are in
	first := last - int64(Span/Step) + 1
	r.mu.Lock()
	defer r.mu.Unlock()
	for b := range r.steps {
		if b < first {
			delete(r.steps, b)
		}
	}
	data := make([]stepData, last-first+1)
	pipe := r.client.Pipeline()
	type pending struct {
		i      int
		counts *redis.MapStringStringCmd
		sample *redis.StringCmd
	}
	var reads []pending
	for b := first; b <= last; b++ {
		if d, ok := r.steps[b]; ok {
			data[b-first] = d
			continue
		}
		reads = append(reads, pending{int(b - first), pipe.HGetAll(ctx, countsKey(r.prefix, b)), pipe.Get(ctx, sampleKey(r.prefix, b))})
	}
	if len(reads) > 0 {
		pipe.Exec(ctx) // each command's error is looked at: a missing sample is not one
	}
	for _, rd := range reads {
		if err := rd.counts.Err(); err != nil {
			return History{}, err
		}
		if err := rd.sample.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return History{}, err
		}
		d := stepData{counts: parseCounts(rd.counts.Val())}
		if v := rd.sample.Val(); v != "" {
			var s sample
			if json.Unmarshal([]byte(v), &s) == nil {
				d.rules = map[string]*sampleRule{}
				for i := range s.Rules {
					d.rules[s.Rules[i].Name] = &s.Rules[i]
				}
			}
		}
		data[rd.i] = d
		if b := first + int64(rd.i); b < last-1 {
			r.steps[b] = d
		}
	}
	h := History{At: now, Start: time.UnixMilli(first * Step.Milliseconds()), Step: Step.Seconds(), Steps: len(data)}
	for _, pr := range p.Rules() {
		h.Rules = append(h.Rules, build(pr, data))
	}
	return h, nil
}

// build makes rule pr's history from the steps' data.
func build(pr policy.Rule, data []stepData) Rule {
	out := Rule{Name: pr.Name, Kind: status.Kind(pr.Limit), Limit: pr.Limit.String()}
	for _, d := range data {
		if sr := d.rule(pr.Name); sr != nil {
			out.Kind, out.Limit = sr.Kind, sr.Limit
		}
	}
	switch out.Kind {
	case "gcra", "adaptive":
		out.Unit = "tasks/s"
	case "concurrency":
		out.Unit = "slots"
	default:
		out.Unit = "units"
	}
	per := Step.Seconds()
	rate := func(enc string, kind int) []float64 {
		v := make([]float64, len(data))
		for i, d := range data {
			v[i] = float64(d.count(pr.Name, enc, kind)) / per
		}
		return v
	}
	if pr.Key == "" {
		s := Series{Admitted: rate("", 0), Throttled: rate("", 1)}
		sampled(&s, out.Unit, pr.Name, "", data)
		out.Series = []Series{s}
		return out
	}
	out.Series = []Series{{All: true, Admitted: rate("", 0), Throttled: rate("", 1)}}
	// The keys with the most tasks over the span, then those the last
	// samples found busiest.
	tasks := map[string]int64{}
	for _, d := range data {
		for enc, c := range d.counts[pr.Name] {
			if enc != "" {
				tasks[enc] += c[0] + c[1]
			}
		}
	}
	enc := slices.SortedFunc(maps.Keys(tasks), func(a, b string) int {
		return cmp.Or(cmp.Compare(tasks[b], tasks[a]), cmp.Compare(a, b))
	})
	for i := len(data) - 1; i >= 0 && len(enc) < KeysPerRule; i-- {
		if sr := data[i].rule(pr.Name); sr != nil {
			for _, k := range sr.Keys {
				if e := keys.Encode(k.Key); len(enc) < KeysPerRule && !slices.Contains(enc, e) {
					enc = append(enc, e)
				}
			}
		}
	}
	for _, e := range enc[:min(KeysPerRule, len(enc))] {
		key, ok := keys.Decode(e)
		if !ok {
			key = e // a hashed key shows as its hash, as in worker status
		}
		s := Series{Key: key, Admitted: rate(e, 0), Throttled: rate(e, 1)}
		sampled(&s, out.Unit, pr.Name, key, data)
		out.Series = append(out.Series, s)
	}
	return out
}

// sampled fills s's Level, Limit and Waiting from the samples of rule's
// key.
func sampled(s *Series, unit, rule, key string, data []stepData) {
	s.Level, s.Limit, s.Waiting = make([]*float64, len(data)), make([]*float64, len(data)), make([]*int, len(data))
	for i, d := range data {
		sr := d.rule(rule)
		if sr == nil {
			continue
		}
		for _, k := range sr.Keys {
			if k.Key != key {
				continue
			}
			used, limit := float64(k.Used), float64(k.Used+k.Remaining)
			switch {
			case unit == "tasks/s":
				limit = k.Rate
			case k.Slots > 0:
				limit = float64(k.Slots)
			}
			waiting := k.Waiting
			if unit != "tasks/s" {
				s.Level[i] = &used
			}
			s.Limit[i], s.Waiting[i] = &limit, &waiting
		}
	}
}

// rule is the sample's rule of that name, nil if none (or no sample).
func (d stepData) rule(name string) *sampleRule { return d.rules[name] }
