// Package status reads what the limits of a policy are doing now, for
// "worker status" and the worker's /limits and / pages: per rule its limit
// (after overrides), use, what remains, when it resets, until when an
// upstream throttle blocks it, the rate it decides at (learned, for an
// adaptive rule) and, for a rule keyed by a payload field, its busiest keys.
//
// Application code of the binaries, imported by cmd/worker.
package status

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
	"github.com/taskrl/taskrl/taskrl"
)

// Busiest is how many keys of a keyed rule a Report lists; MaxScan bounds
// the keys looked at to find them, per rule.
const (
	Busiest = 10
	MaxScan = 10000
)

// Report is the state of a policy's rules at one moment.
type Report struct {
	// At is the Redis server's time of the report.
	At    time.Time `json:"at"`
	Rules []Rule    `json:"rules"`
	// Pauses are the operators' pauses in force (worker limits pause).
	Pauses []taskrl.RulePause `json:"pauses,omitempty"`
	// Warnings are the Redis settings that break the limits' promises
	// (redisconf.Report.Warnings), filled by the caller.
	Warnings []string `json:"warnings,omitempty"`
}

// Rule is one rule's state: of its one key (a rule without a key, or the
// key asked for), or, for a keyed rule, of its busiest keys.
type Rule struct {
	Name string `json:"name"`
	// Kind is the policy file's block: gcra, adaptive, quota, sliding,
	// concurrency.
	Kind string `json:"kind"`
	// Limit describes the limit in force for Key (after overrides).
	Limit  string `json:"limit"`
	Shadow bool   `json:"shadow,omitempty"`
	// Keyed says the rule limits each value of a payload field; Template
	// is its key template.
	Keyed    bool   `json:"keyed,omitempty"`
	Template string `json:"template,omitempty"`
	// Fair says the rule is shared among the values of its fair:
	// template, or orders its tasks by priority (KeyState.Flows).
	Fair bool `json:"fair,omitempty"`
	// Priorities says the rule orders its tasks by priority (its flows
	// are listed per level).
	Priorities bool `json:"priorities,omitempty"`
	// Overrides counts the keys with a limit of their own.
	Overrides int `json:"overrides,omitempty"`
	// The state of one key: Key is "" for a rule without a key template.
	// Absent for a keyed rule when no key was asked for: see Busiest.
	*KeyState
	// Busiest are the keys of a keyed rule using most of it, at most
	// Busiest of them, most used first (keys whose id was hashed in Redis
	// show as that hash).
	Busiest []KeyState `json:"busiest,omitempty"`
}

// KeyState is one key of a rule.
type KeyState struct {
	Key string `json:"key"`
	// Override is the limit an override gives this key, or the plan its
	// tasks' payloads put it on (noted by the workers within the last
	// day), "" without either.
	Override  string `json:"override,omitempty"`
	Used      int    `json:"used"`
	Remaining int    `json:"remaining"`
	// ResetsAt is when the used units are all given back (zero: nothing
	// used).
	ResetsAt time.Time `json:"resets_at,omitzero"`
	// BlockedUntil is the end of an upstream throttle on the rule for this
	// key (zero: none).
	BlockedUntil time.Time `json:"blocked_until,omitzero"`
	// Rate is the rate per second a GCRA rule decides at: its limit, or,
	// adaptive, what the fleet learned.
	Rate float64 `json:"rate,omitempty"`
	// Slots is the number of slots an adaptive concurrency rule allows:
	// what the fleet learned.
	Slots int `json:"slots,omitempty"`
	// Waiting is the tasks waiting under the rule for this key
	// (taskrl.Waiting), filled by AddWaiting.
	Waiting int `json:"waiting,omitempty"`
	// Flows are, for a fair rule, its flows (the values of its fair:
	// template) holding slots or waiting for them, or with tasks booked
	// ahead: at most Busiest, busiest first; FlowCount is how many there
	// are.
	Flows     []Flow `json:"flows,omitempty"`
	FlowCount int    `json:"flow_count,omitempty"`
}

// Flow is one flow of a fair rule for a key (quotas.FlowState).
type Flow struct {
	Flow string `json:"flow"`
	// Held is the slots it holds (concurrency).
	Held int `json:"held,omitempty"`
	// Waiting: a concurrency rule refused it a slot within the last
	// second, or a gcra rule has its tasks booked ahead; Weight is the
	// weight it waits with.
	Waiting bool `json:"waiting,omitempty"`
	Weight  int  `json:"weight,omitempty"`
	// Level is, at a rule with priorities, the level these tasks of the
	// flow wait at (one Flow per level); AheadSeconds how far ahead of
	// now its tasks booked take the rule at its share (gcra).
	Level        int     `json:"level,omitempty"`
	AheadSeconds float64 `json:"ahead_seconds,omitempty"`
}

// AddWaiting fills each reported key's Waiting from the waiting index on
// the queues' Redis (queues; with one Redis, the same client Collect
// read), one call per key.
func AddWaiting(ctx context.Context, queues redis.UniversalClient, prefix string, rep *Report) error {
	for i := range rep.Rules {
		r := &rep.Rules[i]
		fill := func(ks *KeyState) (err error) {
			ks.Waiting, err = taskrl.Waiting(ctx, queues, prefix, r.Name, ks.Key)
			return err
		}
		if r.KeyState != nil {
			if err := fill(r.KeyState); err != nil {
				return err
			}
		}
		for j := range r.Busiest {
			if err := fill(&r.Busiest[j]); err != nil {
				return err
			}
		}
	}
	return nil
}

// limitText describes limit l of rule r, with what a soft or borrowing
// rule enforces and a prefetch (own: l is an override of a key, decided
// without).
func limitText(r policy.Rule, l quotas.Limit, own bool) string {
	s := l.String()
	if r.Soft > 0 {
		s += ", soft " + strconv.FormatFloat(100*r.Soft, 'g', -1, 64) + "%"
	}
	if r.Borrow > 1 {
		s += ", borrows " + strconv.FormatFloat(r.Borrow, 'g', 4, 64) + "x"
	}
	if r.Soft > 0 || r.Borrow > 1 {
		s += " (" + r.Raised(l).String() + ")"
	}
	if r.Prefetch > 0 && !own {
		s += ", prefetch " + r.Prefetch.String()
	}
	if a := r.PriorityAging(); a > 0 {
		s += ", priorities aging " + a.String()
	}
	return s
}

// Collect reads the state of every rule of p. key, if not "", is the key
// to report for every keyed rule; otherwise keyed rules report their
// busiest keys, found by scanning Redis (every master of a Cluster).
func Collect(ctx context.Context, c redis.UniversalClient, prefix string, p *policy.Policy, key string) (Report, error) {
	return collect(ctx, c, prefix, p, key, nil)
}

// CollectKeys is Collect reporting, for each keyed rule, the keys
// keysOf(rule) names, at most Busiest and whatever their use (Collect
// shows only keys in use), instead of scanning Redis for them
// (a SCAN visits every key of the database): for callers that know which
// keys are busy.
func CollectKeys(ctx context.Context, c redis.UniversalClient, prefix string, p *policy.Policy, keysOf func(rule string) []string) (Report, error) {
	return collect(ctx, c, prefix, p, "", keysOf)
}

func collect(ctx context.Context, c redis.UniversalClient, prefix string, p *policy.Policy, key string, keysOf func(string) []string) (Report, error) {
	l, err := quotas.New(quotas.Config{Client: c, Prefix: prefix})
	if err != nil {
		return Report{}, err
	}
	over := map[[2]string]quotas.Limit{}
	plan := map[[2]string]string{}
	count := map[string]int{}
	for _, o := range p.Overrides() {
		over[[2]string{o.Rule, o.Key}] = o.Limit
		plan[[2]string{o.Rule, o.Key}] = o.Tier
		count[o.Rule]++
	}
	var rep Report
	for _, r := range p.Rules() {
		prioritized := r.PriorityAging() > 0
		out := Rule{Name: r.Name, Kind: Kind(r.Limit), Limit: limitText(r, r.Limit, false), Shadow: r.Shadow, Keyed: r.Key != "", Template: r.Key, Fair: r.Fair != "" || prioritized, Priorities: prioritized, Overrides: count[r.Name]}
		state := func(k string) (KeyState, error) {
			lim, own := over[[2]string{r.Name, k}]
			if !own || !out.Keyed {
				lim = r.Limit
			}
			own = own && out.Keyed
			if own && lim == nil {
				// Exempt (an unlimited override): the rule keeps no
				// state for the key.
				return KeyState{Key: k, Override: "unlimited: the rule does not apply"}, nil
			}
			// Without an override, the plan the key's tasks' payloads
			// put it on, as the workers noted it (taskrl: keys.Plan).
			paid := ""
			if !own && out.Keyed && r.Tier != "" {
				p, err := c.Get(ctx, keys.Plan(prefix, r.Name, k)).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					return KeyState{}, err
				}
				if r.Tiers[p] != nil {
					lim, own, paid = r.Tiers[p], true, p
				}
			}
			ks, at, err := keyState(ctx, c, l, prefix, r, r.Raised(lim), k, own)
			if own {
				ks.Override = limitText(r, lim, true)
				if t := plan[[2]string{r.Name, k}]; t != "" {
					ks.Override = "plan " + t + ": " + ks.Override
				} else if paid != "" {
					ks.Override = "plan " + paid + payloadPlan + ": " + ks.Override
				}
			}
			if rep.At.IsZero() {
				rep.At = at
			}
			return ks, err
		}
		switch {
		case !out.Keyed || key != "":
			k := ""
			if out.Keyed {
				k = key
			}
			ks, err := state(k)
			if err != nil {
				return Report{}, err
			}
			out.KeyState = &ks
		default:
			var found []string
			if keysOf != nil {
				found = keysOf(r.Name)
				found = found[:min(len(found), Busiest)]
			} else if found, err = scanKeys(ctx, c, prefix, r.Name); err != nil {
				return Report{}, err
			}
			for _, k := range found {
				ks, err := state(k)
				if err != nil {
					return Report{}, err
				}
				// Keys found by scanning are shown when in use; those
				// named, whatever their state.
				if keysOf != nil || ks.Used > 0 || !ks.BlockedUntil.IsZero() {
					out.Busiest = append(out.Busiest, ks)
				}
			}
			slices.SortStableFunc(out.Busiest, func(a, b KeyState) int {
				if a.Used != b.Used {
					return b.Used - a.Used
				}
				return strings.Compare(a.Key, b.Key)
			})
			out.Busiest = out.Busiest[:min(len(out.Busiest), Busiest)]
		}
		rep.Rules = append(rep.Rules, out)
	}
	if rep.At.IsZero() {
		t, err := c.Time(ctx).Result()
		if err != nil {
			return Report{}, err
		}
		rep.At = t
	}
	if rep.Pauses, err = taskrl.RulePauses(ctx, c, prefix); err != nil {
		return Report{}, err
	}
	return rep, nil
}

// Ahead returns, for Options.Ahead of an estimate (enqueue --dry-run),
// what already stands under rule for key: the units used now (Collect's
// KeyState.Used for that key, under the policy's file overrides: a
// window's count, a GCRA rule's burst in use, a concurrency rule's held
// slots) and the tasks waiting (taskrl.Waiting, on the same Redis). A
// waiting task booked within the burst or the current window is in both,
// so the estimate errs long by at most that. An exempt key has neither.
func Ahead(ctx context.Context, c redis.UniversalClient, prefix string, p *policy.Policy, rule, key string) (used, waiting int, err error) {
	l, err := quotas.New(quotas.Config{Client: c, Prefix: prefix})
	if err != nil {
		return 0, 0, err
	}
	i := slices.IndexFunc(p.Rules(), func(r policy.Rule) bool { return r.Name == rule })
	if i < 0 {
		return 0, 0, fmt.Errorf("no rule %q", rule)
	}
	r := p.Rules()[i]
	lim, own := r.Limit, false
	for _, o := range p.Overrides() {
		if o.Rule == rule && o.Key == key && r.Key != "" {
			if o.Unlimited {
				return 0, 0, nil
			}
			lim, own = o.Limit, true
		}
	}
	ks, _, err := keyState(ctx, c, l, prefix, r, r.Raised(lim), key, own)
	if err != nil {
		return 0, 0, err
	}
	// A GCRA rule's Used is at most its burst: the bookings beyond it are
	// the waiting tasks'.
	waiting, err = taskrl.Waiting(ctx, c, prefix, rule, key)
	return ks.Used, waiting, err
}

// keyState reads one key of rule r under limit lim (own: the key's
// override, decided without prefetch), and the server's time.
func keyState(ctx context.Context, c redis.UniversalClient, l *quotas.Limiter, prefix string, r policy.Rule, lim quotas.Limit, key string, own bool) (KeyState, time.Time, error) {
	aging := r.PriorityAging()
	q := quotas.Rule{Name: r.Name, Limit: lim, Fair: r.Fair != "" || aging > 0, Aging: aging, Prefetch: r.Prefetch}
	if own {
		q.Prefetch = 0 // overrides are decided without
	}
	set, err := quotas.NewSet(q)
	if err != nil {
		return KeyState{}, time.Time{}, err
	}
	d, err := l.Status(ctx, set, quotas.Request{Keys: []string{key}, Holder: "~status"})
	if err != nil {
		return KeyState{}, time.Time{}, err
	}
	st := d.Rules[0]
	ks := KeyState{Key: key, Used: st.Used, Remaining: st.Remaining}
	if st.ResetAfter > 0 {
		ks.ResetsAt = d.Now.Add(st.ResetAfter)
	}
	if st.Interval > 0 {
		ks.Rate = float64(time.Second) / float64(st.Interval)
	}
	ks.Slots = st.Slots
	if q.Fair {
		fs, err := l.Flows(ctx, set, quotas.Request{Keys: []string{key}})
		if err != nil {
			return KeyState{}, time.Time{}, err
		}
		ks.FlowCount = len(fs[0])
		for _, f := range fs[0][:min(len(fs[0]), Busiest)] {
			ks.Flows = append(ks.Flows, Flow{Flow: f.Flow, Held: f.Held, Waiting: f.Waiting, Weight: f.Weight, Level: f.Level, AheadSeconds: f.Ahead.Seconds()})
		}
	}
	us, err := c.Get(ctx, keys.Block(prefix, r.Name, key)).Int64()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return KeyState{}, time.Time{}, err
	case time.UnixMicro(us).After(d.Now):
		ks.BlockedUntil = time.UnixMicro(us)
	}
	return ks, d.Now, nil
}

// scanKeys returns the keys (entities) rule name has state for, at most
// MaxScan, decoded where Redis holds them readably.
func scanKeys(ctx context.Context, c redis.UniversalClient, prefix, name string) ([]string, error) {
	match := prefix + keys.Rules + "{*}:" + name + ":*"
	seen := map[string]bool{}
	var out []string
	scan := func(ctx context.Context, n redis.UniversalClient) error {
		it := n.Scan(ctx, 0, match, 1000).Iterator()
		for it.Next(ctx) && len(seen) < MaxScan {
			k := it.Val()
			open, end := strings.IndexByte(k, '{'), strings.IndexByte(k, '}')
			if open < 0 || end < open || !strings.HasPrefix(k[end+1:], ":"+name+":") {
				continue
			}
			tag := k[open+1 : end]
			if seen[tag] || tag == keys.Global {
				continue
			}
			seen[tag] = true
			if id, ok := keys.Decode(tag); ok {
				out = append(out, id)
			}
		}
		return it.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu = make(chan struct{}, 1)
		mu <- struct{}{}
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			<-mu
			defer func() { mu <- struct{}{} }()
			return scan(ctx, m)
		})
		return out, err
	}
	return out, scan(ctx, c)
}

// payloadPlan marks a KeyState.Override that is the plan the key's tasks'
// payloads put it on, not an override.
const payloadPlan = " (from the payload)"

// Kind names the policy file's block of limit l: gcra, adaptive, quota
// (fixed and calendar windows), sliding, concurrency.
func Kind(l quotas.Limit) string {
	switch l.(type) {
	case quotas.GCRA:
		return "gcra"
	case quotas.Adaptive:
		return "adaptive"
	case quotas.FixedWindow, quotas.CalendarWindow:
		return "quota"
	case quotas.SlidingWindow:
		return "sliding"
	case quotas.Concurrency:
		return "concurrency"
	}
	return fmt.Sprintf("%T", l)
}

// Text renders rep as a table, a line per key.
func Text(rep Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "as of %s (Redis time)\n", rep.At.UTC().Format(time.RFC3339))
	for _, w := range rep.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	fmt.Fprintf(&b, "%-22s %-12s %-10s %6s %9s %-10s %-10s %8s %7s  %s\n", "RULE", "KEY", "KIND", "USED", "REMAINING", "RESETS IN", "BLOCKED", "RATE/S", "WAITING", "LIMIT")
	line := func(r Rule, ks KeyState) {
		key := ks.Key
		if !r.Keyed {
			key = "(global)"
		}
		limit := r.Limit
		if ks.Override != "" {
			limit = ks.Override
			if !strings.Contains(limit, payloadPlan) {
				limit += " (override)"
			}
		}
		if ks.Slots > 0 {
			limit += fmt.Sprintf(", %d learned", ks.Slots)
		}
		if r.Shadow {
			limit += " [shadow]"
		}
		rate := "-"
		if ks.Rate > 0 {
			rate = strconv.FormatFloat(ks.Rate, 'f', 2, 64)
		}
		fmt.Fprintf(&b, "%-22s %-12s %-10s %6d %9d %-10s %-10s %8s %7d  %s\n", r.Name, key, r.Kind, ks.Used, ks.Remaining, until(rep.At, ks.ResetsAt), until(rep.At, ks.BlockedUntil), rate, ks.Waiting, limit)
		for _, f := range ks.Flows {
			fmt.Fprintf(&b, "  flow %s\n", flowText(f))
		}
		if more := ks.FlowCount - len(ks.Flows); more > 0 {
			fmt.Fprintf(&b, "  and %d more flows\n", more)
		}
	}
	for _, r := range rep.Rules {
		switch {
		case r.KeyState != nil:
			line(r, *r.KeyState)
		case len(r.Busiest) == 0:
			fmt.Fprintf(&b, "%-22s %-12s %-10s %6s %9s %-10s %-10s %8s %7s  %s\n", r.Name, "(no key in use)", r.Kind, "-", "-", "-", "-", "-", "-", r.Limit)
		default:
			for _, ks := range r.Busiest {
				line(r, ks)
			}
		}
	}
	for _, p := range rep.Pauses {
		what := "rule " + p.Rule
		if p.Key != "" {
			what += " key " + p.Key
		}
		end := "until resumed"
		if !p.Until.IsZero() {
			end = "for " + until(rep.At, p.Until)
		}
		fmt.Fprintf(&b, "PAUSED: %s %s, since %s by %s: %s\n", what, end, p.At.UTC().Format(time.RFC3339), p.By, p.Reason)
	}
	return b.String()
}

// flowText describes flow f of a fair rule: its name (quoted), its
// level, the slots it holds and whether it waits, with what weight and
// how far ahead.
func flowText(f Flow) string {
	s := strconv.Quote(f.Flow)
	if f.Level > 0 {
		s += " level " + strconv.Itoa(f.Level)
	}
	if f.Held > 0 {
		s += fmt.Sprintf(": holds %d", f.Held)
	}
	if f.Waiting {
		sep := ": "
		if f.Held > 0 {
			sep = ", "
		}
		s += sep + "waiting, weight " + strconv.Itoa(f.Weight)
		if f.AheadSeconds > 0 {
			s += ", booked " + time.Duration(f.AheadSeconds*float64(time.Second)).Round(time.Millisecond).String() + " ahead"
		}
	}
	return s
}

func until(now, t time.Time) string {
	if t.IsZero() || !t.After(now) {
		return "-"
	}
	return t.Sub(now).Round(time.Millisecond).String()
}
