package policy

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/taskrl/taskrl/internal/yamldoc"
	"github.com/taskrl/taskrl/limits"
)

// Parse parses a policy document in YAML:
//
//	redis_unavailable: closed            # optional: open | closed (default) | local
//	critical:                            # optional: see Policy.WithCritical
//	  - {queue: critical}                # matchers like a rule's match
//	throttle: [per-business]             # optional: the rules an upstream throttle
//	                                     # blocks; see Policy.WithThrottle
//	rules:
//	  - name: vendor-peak                # required, unique
//	    match: {type: "http:*"}          # type (path.Match glob) and/or queue (exact)
//	    fair: "{{.business_id}}"         # optional, gcra or concurrency; see Rule.Fair; or
//	    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}  # weighted: see Rule.FairWeight
//	    mode: enforce                    # optional: enforce (default) | shadow; see Rule.Shadow
//	    soft: 10%                        # optional: see Rule.Soft (also 0.1)
//	    prefetch: 5ms                    # optional: gcra, quota, sliding, concurrency (off: no automatic one); see Rule.Prefetch
//	    gcra: {rate: 18, per: 1s, burst: 3}
//	  - name: vendor-points
//	    match: {type: "http:call"}
//	    cost: "{{.units}}"               # optional: units per task, a template or a
//	                                     # whole number; not concurrency; see Rule.Cost
//	    default_cost: 1                  # optional; see Rule.DefaultCost
//	    gcra: {rate: 30, per: 1s, burst: 30}
//	  - name: vendor-window
//	    match: {type: "http:call"}
//	    quota: {limit: 190, every: 10s}  # fixed window aligned to the epoch
//	  - name: vendor-daily
//	    match: {type: "http:call"}
//	    quota: {limit: 10000, cron: "0 0 * * *", tz: "America/Los_Angeles"}
//	  - name: per-business
//	    match: {type: "http:call"}
//	    key: "{{.business_id}}"          # optional; see Rule.Key
//	    default_key: unknown             # optional; see Rule.DefaultKey
//	    borrow: 2x                       # optional, keyed gcra only: see Rule.Borrow (or true)
//	    gcra: {rate: 1.8, per: 1s}
//	  - name: vendor-learned
//	    match: {type: "http:call"}
//	    adaptive: {max: 40, min: 1, per: 1s}  # learned between min and max
//	  - name: recent
//	    match: {queue: bulk}
//	    sliding: {limit: 100, every: 1m}
//	  - name: business-concurrency
//	    match: {type: "http:call"}
//	    key: "{{.business_id}}"
//	    concurrency: {max: 2, lease: 30s, reserved: 0}
//	  - name: search-backend
//	    match: {type: "search:*"}
//	    adaptive_concurrency: {min: 2, max: 64, lease: 30s}  # learned from latency
//	overrides:                           # optional: see Policy.WithOverrides
//	  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s, burst: 2}}
//	shed:                                # optional: see Shed and Policy.WithShed
//	  signal: fleet_busy                 # fleet_busy (default) | upstream_errors | probe
//	  above: 0.8                         # required
//	  classes: [{queue: bulk}, default]  # required; a bare name is a queue
//	  grace: 2s                          # optional (default 2s); also ramp (5s), window (10s)
//	http:                                # optional: not read here, but by the worker
//	  ...                                # binary, for its http:call handler
//
// Each rule has exactly one limit:
//   - gcra: rate (a positive number, fractions allowed), per (a duration),
//     burst (a whole number, at least 1; default 1): limits.GCRA;
//   - adaptive: max and per, optional min (default max/100), start
//     (default max) and burst (default 1): limits.Adaptive, a GCRA rate
//     the fleet learns from the remote side's throttles (numbers, fractions
//     allowed); it may have a key, a rate learned per key, but not fair;
//   - quota: limit and every (a duration): limits.FixedWindow; or limit and
//     cron (a 5-field cron spec or a descriptor such as @daily) with an
//     optional tz (an IANA zone; default UTC): limits.CalendarWindow;
//   - sliding: limit and every: limits.SlidingWindow;
//   - concurrency: max, lease (a duration, at least 30s: asynq's own task
//     lease; the middleware renews it every third of it while the task runs)
//     and reserved (default 0): limits.Concurrency;
//   - adaptive_concurrency: max and lease as concurrency's, optional min
//     (default 1): a limits.Concurrency with Adaptive, whose number of
//     slots the fleet learns between min and max from the latency of the
//     tasks' calls; it may have a key, but not fair, prefetch or reserved.
//
// An override gives one key of a rule with a payload key its own limit, of
// the same kind as the rule's; the key is as the rule's key template
// renders it.
//
// Durations are Go duration strings ("500ms", "1s", "10m", "24h"); a bare
// number is refused, as its unit would be a guess. Anchors, aliases and
// merge keys (<<) are allowed (an alias refers to an anchor defined before
// it and not around it; each anchor has its own name; keys written in a
// mapping override those merged into it); tags and unknown fields are not.
//
// The document is checked completely before anything is built: an error
// names the line, the rule (by name, or by position when it has no valid
// name), the field and what is wrong, e.g.
//
//	policy: line 7: rule "per-business": gcra.rate: must be a positive number, got -1
//
// and every wrong rule is reported, one per line (see Error). On any
// error the Policy is nil.
func Parse(yaml []byte) (*Policy, error) {
	p, errs := parsePolicy(yaml)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// LoadFile reads the policy file at path and parses it with
// Parse. Every error mentions the path:
//
//	policy /etc/worker/policy.yaml: line 7: rule "per-business": gcra.rate: must be a positive number, got -1
func LoadFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = "cannot " + pe.Op + ": " + pe.Err.Error()
		}
		return nil, &Error{File: path, Msg: msg}
	}
	p, errs := parsePolicy(data)
	for _, e := range errs {
		e.File = path
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// policyDoc is a policy file as decoded; its fields are read in this
// order, the order of the message listing them.
type policyDoc struct {
	Rules            yamldoc.List[yamldoc.Block[ruleDoc]]       `yaml:"rules"`
	RedisUnavailable yamldoc.Val[string]                        `yaml:"redis_unavailable"`
	Critical         yamldoc.List[yamldoc.Block[matchDoc]]      `yaml:"critical"`
	Throttle         yamldoc.List[yamldoc.Val[string]]          `yaml:"throttle"`
	Overrides        yamldoc.List[yamldoc.Block[overrideEntry]] `yaml:"overrides"`
	HTTP             yamldoc.Skip                               `yaml:"http"`
	Shed             yamldoc.Block[shedDoc]                     `yaml:"shed"`
}

// ruleDoc is a rule as written in a policy file.
type ruleDoc struct {
	Name        yamldoc.Val[string]                           `yaml:"name"`
	Match       yamldoc.Block[matchDoc]                       `yaml:"match"`
	Key         yamldoc.Val[string]                           `yaml:"key"`
	DefaultKey  yamldoc.Val[string]                           `yaml:"default_key"`
	Fair        yamldoc.OrBlock[string, fairDoc]              `yaml:"fair"`
	Tier        yamldoc.Val[string]                           `yaml:"tier"`
	Priority    yamldoc.OrBlock[yamldoc.IntText, priorityDoc] `yaml:"priority"`
	Tiers       yamldoc.Map[yamldoc.Block[limitsDoc]]         `yaml:"tiers"`
	Mode        yamldoc.Val[string]                           `yaml:"mode"`
	Soft        yamldoc.Val[yamldoc.Share]                    `yaml:"soft"`
	Borrow      yamldoc.Val[yamldoc.Factor]                   `yaml:"borrow"`
	Prefetch    yamldoc.Val[yamldoc.DurationOff]              `yaml:"prefetch"`
	Cost        yamldoc.Val[yamldoc.IntText]                  `yaml:"cost"`
	DefaultCost yamldoc.Val[int]                              `yaml:"default_cost"`
	Limits      limitsDoc                                     `yaml:",inline"`
}

// fairDoc is a rule's fair field written as a mapping.
type fairDoc struct {
	Key    yamldoc.Val[string]          `yaml:"key"`
	Weight yamldoc.Val[yamldoc.IntText] `yaml:"weight"`
}

// priorityDoc is a rule's priority field written as a mapping.
type priorityDoc struct {
	Level  yamldoc.Val[yamldoc.IntText]  `yaml:"level"`
	Queues yamldoc.Map[yamldoc.Val[int]] `yaml:"queues"`
	Aging  yamldoc.Val[time.Duration]    `yaml:"aging"`
}

// matchDoc is a matcher: a rule's match, a critical entry, a shed class.
type matchDoc struct {
	Type  yamldoc.Val[string] `yaml:"type"`
	Queue yamldoc.Val[string] `yaml:"queue"`
}

// shedDoc is the shed section (see Shed).
type shedDoc struct {
	Signal  yamldoc.Val[string]        `yaml:"signal"`
	Above   yamldoc.Val[float64]       `yaml:"above"`
	Classes yamldoc.List[class]        `yaml:"classes"`
	Grace   yamldoc.Val[time.Duration] `yaml:"grace"`
	Ramp    yamldoc.Val[time.Duration] `yaml:"ramp"`
	Window  yamldoc.Val[time.Duration] `yaml:"window"`
}

// class is an entry of shed.classes: a matcher, or a queue's bare name.
type class struct {
	queue yamldoc.Val[string]
	match yamldoc.Block[matchDoc]
}

// UnmarshalYAML reads a bare name into c.queue, anything else into
// c.match.
func (c *class) UnmarshalYAML(decode func(any) error) error {
	n, err := yamldoc.ValueOf(decode)
	if err != nil {
		return err
	}
	if _, ok := n.(*ast.StringNode); ok {
		return c.queue.UnmarshalYAML(decode)
	}
	return c.match.UnmarshalYAML(decode)
}

// parsePolicy parses and validates a policy document.
func parsePolicy(data []byte) (*Policy, errList) {
	var errs errList
	add := func(fe *yamldoc.Problem, index int, rule string) {
		if fe != nil {
			errs.add(&Error{Line: fe.Line, Index: index, Rule: rule, Field: fe.Field, Msg: fe.Msg})
		}
	}
	var doc yamldoc.Block[policyDoc]
	if fe := yamldoc.Decode(data, "a policy needs a rules list", &doc); fe != nil {
		// A problem within a rule (an alias, say) names the rule.
		index := 0
		if n, err := fmt.Sscanf(fe.Field, "rules[%d]", &index); n == 1 && err == nil {
			fe.Field = strings.TrimPrefix(fe.Field[strings.IndexByte(fe.Field, ']')+1:], ".")
		}
		add(fe, index, "")
		return nil, errs
	}
	top := &yamldoc.Reader{}
	d := yamldoc.Must(top, "", doc.Line, &doc)
	if d == nil {
		add(top.First, 0, "")
		return nil, errs
	}
	mode, fe := readMode(d.RedisUnavailable)
	add(fe, 0, "")
	critical, more := readCritical(&d.Critical)
	errs = append(errs, more...)
	throttle, throttleAt, fe := readNames(&d.Throttle, "throttle")
	add(fe, 0, "")
	overrides, overridesAt, more := readOverrides(&d.Overrides)
	errs = append(errs, more...)
	shed, fe := readShed(&d.Shed)
	add(fe, 0, "")

	r := &yamldoc.Reader{}
	switch yamldoc.Entries(r, "rules", &d.Rules, "a list of rules"); {
	case !d.Rules.Set && doc.Keys["rules"] == 0:
		r.Fail("rules", 0, "missing; a policy needs a list of rules")
	case r.First == nil && len(d.Rules.V) == 0:
		r.Fail("rules", max(d.Rules.Line, doc.Keys["rules"]), "empty; a policy needs at least one rule")
	}
	if r.First != nil {
		add(r.First, 0, "")
		return nil, errs
	}
	rules := make([]Rule, len(d.Rules.V))
	pos := make([]yamldoc.Lines, len(d.Rules.V))
	skip := make([]bool, len(d.Rules.V))
	for i := range d.Rules.V {
		rule, ls, fe := readRule(&d.Rules.V[i], d.Rules.At[i])
		rules[i], pos[i] = rule, ls
		if fe != nil {
			skip[i] = true
			name := ""
			if checkName(rule.Name) == nil {
				name = rule.Name
			}
			add(fe, i+1, name)
		}
	}
	p, more := buildPolicy(rules, pos, skip, mode)
	errs = append(errs, more...)
	if p != nil {
		p.critical = critical
		for i, n := range throttle {
			if msg := p.checkThrottle(n); msg != "" {
				errs.add(&Error{Line: throttleAt[i], Field: fmt.Sprintf("throttle[%d]", i+1), Msg: msg})
			}
		}
		p.throttle = throttle
		var more errList
		p.overrides, more = p.checkOverrides(overrides, overridesAt)
		errs = append(errs, more...)
		p.shed = shed
	}
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(a.Line, b.Line))
	})
	if len(errs) > maxErrors {
		errs = errs[:maxErrors]
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return p, nil
}

// must is open for a block that cannot be absent or null: a document, an
// entry of a list of mappings (at line).
func must[T any](r *yamldoc.Reader, field string, line int, b *yamldoc.Block[T]) *T {
	if !b.Set {
		r.Fail(field, max(b.Line, line), "must be a mapping, got null (an empty value)")
		return nil
	}
	return yamldoc.Open(r, field, b)
}

// readMode reads redis_unavailable; FailClosed when absent.
func readMode(s yamldoc.Val[string]) (FailureMode, *yamldoc.Problem) {
	r := &yamldoc.Reader{}
	v, ok := yamldoc.Get(r, "redis_unavailable", s)
	if !ok {
		return FailClosed, r.First
	}
	switch m := FailureMode(v); m {
	case FailOpen, FailClosed, FailLocal:
		return m, nil
	}
	r.Fail("redis_unavailable", s.Line, "must be open, closed or local, got %q", v)
	return FailClosed, r.First
}

// readMatch reads the matcher b, field ("match", "critical[1]").
func readMatch(r *yamldoc.Reader, field string, b *yamldoc.Block[matchDoc]) Match {
	var m Match
	if md := yamldoc.Open(r, field, b); md != nil {
		m.Type, _ = yamldoc.Get(r, field+".type", md.Type)
		m.Queue, _ = yamldoc.Get(r, field+".queue", md.Queue)
	}
	return m
}

// readCritical reads the top-level critical list: matchers like a rule's.
func readCritical(l *yamldoc.List[yamldoc.Block[matchDoc]]) ([]Match, errList) {
	var errs errList
	add := func(fe *yamldoc.Problem) { errs.add(&Error{Line: fe.Line, Field: fe.Field, Msg: fe.Msg}) }
	r := &yamldoc.Reader{}
	es := yamldoc.Entries(r, "critical", l, "a list of matchers such as - {queue: critical}")
	if r.First != nil {
		add(r.First)
		return nil, errs
	}
	var out []Match
	for i := range es {
		field := criticalField(i, "")
		r := &yamldoc.Reader{Lines: yamldoc.Lines{field: l.At[i]}}
		m := readMatch(r, field, &es[i])
		if r.First == nil {
			if f, msg := checkMatch(m); msg != "" {
				f = criticalField(i, f)
				r.Fail(f, r.Lines.Of(f), "%s", msg)
			}
		}
		if r.First != nil {
			add(r.First)
			continue
		}
		out = append(out, m)
	}
	return out, errs
}

// readNames reads a list of rule names, field, with the line of each.
func readNames(l *yamldoc.List[yamldoc.Val[string]], field string) (names []string, at []int, fe *yamldoc.Problem) {
	r := &yamldoc.Reader{}
	for i, s := range yamldoc.Entries(r, field, l, "a list of rule names such as [per-business]") {
		f := fmt.Sprintf("%s[%d]", field, i+1)
		if v, _ := yamldoc.Get(r, f, s); v == "" {
			r.Fail(f, l.At[i], "must be a rule name")
		}
		names, at = append(names, s.V), append(at, l.At[i])
	}
	if r.First != nil {
		return nil, nil, r.First
	}
	return names, at, nil
}

// readShed reads the top-level shed section (see Shed) with its defaults;
// nil for an empty one.
func readShed(b *yamldoc.Block[shedDoc]) (*Shed, *yamldoc.Problem) {
	r := &yamldoc.Reader{}
	sd := yamldoc.Open(r, "shed", b)
	if sd == nil {
		return nil, r.First
	}
	r.At("shed", b.Keys)
	var s Shed
	signal, _ := yamldoc.Get(r, "shed.signal", sd.Signal)
	s.Signal = ShedSignal(signal)
	s.Above, _ = yamldoc.Get(r, "shed.above", sd.Above)
	for i, c := range yamldoc.Entries(r, "shed.classes", &sd.Classes, "a list of classes, least important first, such as [{queue: bulk}, {queue: default}]") {
		f := fmt.Sprintf("shed.classes[%d]", i+1)
		r.Lines[f] = sd.Classes.At[i]
		if c.queue.Set {
			q, _ := yamldoc.Get(r, f, c.queue)
			s.Classes = append(s.Classes, Match{Queue: q})
			continue
		}
		s.Classes = append(s.Classes, readMatch(r, f, &c.match))
	}
	s.Grace, _ = yamldoc.Get(r, "shed.grace", sd.Grace)
	s.Ramp, _ = yamldoc.Get(r, "shed.ramp", sd.Ramp)
	s.Window, _ = yamldoc.Get(r, "shed.window", sd.Window)
	if r.First != nil {
		return nil, r.First
	}
	if f, msg := s.check(); msg != "" {
		return nil, &yamldoc.Problem{Field: "shed." + f, Line: r.Lines.Of("shed." + f), Msg: msg}
	}
	s = s.withDefaults()
	return &s, nil
}

// readRule reads one rule, the entry at line of the rules list. It returns
// what it could read (the name at least, when there is one) even on error.
func readRule(b *yamldoc.Block[ruleDoc], line int) (Rule, yamldoc.Lines, *yamldoc.Problem) {
	var rule Rule
	r := &yamldoc.Reader{Lines: yamldoc.Lines{"": max(b.Line, line)}}
	rd := &b.V
	rule.Name, _ = yamldoc.Get(r, "name", rd.Name)
	if yamldoc.Must(r, "", line, b) == nil || r.First != nil {
		return rule, r.Lines, r.First
	}
	r.At("", b.Keys)
	rule.Match = readMatch(r, "match", &rd.Match)
	rule.Key, _ = yamldoc.Get(r, "key", rd.Key)
	rule.DefaultKey, _ = yamldoc.Get(r, "default_key", rd.DefaultKey)
	rule.Fair, _ = yamldoc.Get(r, "fair", rd.Fair.Val)
	if fd := yamldoc.Open(r, "fair", &rd.Fair.Block); fd != nil {
		r.At("fair", rd.Fair.Block.Keys)
		rule.Fair, _ = yamldoc.Get(r, "fair.key", fd.Key)
		weight, _ := yamldoc.Get(r, "fair.weight", fd.Weight)
		rule.FairWeight = string(weight)
		if !fd.Key.Set {
			r.Fail("fair.key", rd.Fair.Block.Line, "is required: the template of the values the rule is shared among, such as \"{{.business_id}}\"")
		}
	}
	level, _ := yamldoc.Get(r, "priority", rd.Priority.Val)
	rule.Priority = string(level)
	if pd := yamldoc.Open(r, "priority", &rd.Priority.Block); pd != nil {
		r.At("priority", rd.Priority.Block.Keys)
		level, _ := yamldoc.Get(r, "priority.level", pd.Level)
		rule.Priority = string(level)
		rule.PriorityQueues = readLevels(r, &pd.Queues)
		rule.Aging, _ = yamldoc.Get(r, "priority.aging", pd.Aging)
		if !pd.Level.Set && !pd.Queues.Set {
			r.Fail("priority", rd.Priority.Block.Line, "gives no level: give level: \"{{.priority}}\" (or a level from 1 to 5), queues: {QUEUE: LEVEL}, or both")
		}
	}
	if mode, ok := yamldoc.Get(r, "mode", rd.Mode); ok {
		switch mode {
		case "shadow":
			rule.Shadow = true
		case "enforce", "":
		default:
			r.Fail("mode", rd.Mode.Line, "must be enforce or shadow, got %q", mode)
		}
	}
	soft, _ := yamldoc.Get(r, "soft", rd.Soft)
	borrow, _ := yamldoc.Get(r, "borrow", rd.Borrow)
	rule.Soft, rule.Borrow = float64(soft), float64(borrow)
	prefetch, _ := yamldoc.Get(r, "prefetch", rd.Prefetch)
	rule.Prefetch = time.Duration(prefetch)
	cost, _ := yamldoc.Get(r, "cost", rd.Cost)
	rule.Cost = string(cost)
	rule.DefaultCost, _ = yamldoc.Get(r, "default_cost", rd.DefaultCost)
	rule.Tier, _ = yamldoc.Get(r, "tier", rd.Tier)
	rule.Tiers = readTiers(r, &rd.Tiers)
	rule.Limit = rd.Limits.read(r, b.Keys, "a rule has exactly one limit")
	return rule, r.Lines, r.First
}

// openMap records the lines of mapping field m and reports whether it is
// given and well formed; r fails when it is not well formed.
func openMap[T any](r *yamldoc.Reader, field string, m *yamldoc.Map[T]) bool {
	if !m.Set {
		return false
	}
	r.At(field, m.At)
	if m.Bad != nil {
		r.Fail(yamldoc.Join(field, m.Bad.Field), m.Bad.Line, "%s", m.Bad.Msg)
		return false
	}
	return true
}

// readLevels reads a rule's priority.queues: queue name -> level.
func readLevels(r *yamldoc.Reader, m *yamldoc.Map[yamldoc.Val[int]]) map[string]int {
	if !openMap(r, "priority.queues", m) {
		return nil
	}
	out := map[string]int{}
	for _, q := range m.Names {
		out[q], _ = yamldoc.Get(r, yamldoc.Join("priority.queues", q), m.V[q])
	}
	return out
}

// readTiers reads a rule's tiers: plan name -> one limit block.
func readTiers(r *yamldoc.Reader, m *yamldoc.Map[yamldoc.Block[limitsDoc]]) map[string]limits.Limit {
	if !openMap(r, "tiers", m) {
		return nil
	}
	out := map[string]limits.Limit{}
	for _, name := range m.Names {
		f := yamldoc.Join("tiers", name)
		b := m.V[name]
		tr := &yamldoc.Reader{Lines: yamldoc.Lines{"": m.At[name]}}
		if ld := yamldoc.Must(tr, "", m.At[name], &b); ld != nil {
			tr.At("", b.Keys)
			out[name] = ld.read(tr, b.Keys, "a plan has exactly one limit")
			if out[name] == nil && tr.First == nil {
				tr.Fail("", b.Line, "no limit; give the plan's gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency")
			}
		}
		if tr.First != nil {
			r.Fail(yamldoc.Join(f, tr.First.Field), tr.First.Line, "%s", tr.First.Msg)
			return nil
		}
		for k, line := range tr.Lines {
			r.Lines[yamldoc.Join(f, k)] = line
		}
	}
	return out
}

// limitsDoc is the limit blocks of a rule or override, of which one is
// given.
type limitsDoc struct {
	GCRA        yamldoc.Block[gcraDoc]        `yaml:"gcra"`
	Adaptive    yamldoc.Block[adaptiveDoc]    `yaml:"adaptive"`
	Quota       yamldoc.Block[quotaDoc]       `yaml:"quota"`
	Sliding     yamldoc.Block[slidingDoc]     `yaml:"sliding"`
	Concurrency yamldoc.Block[concurrencyDoc] `yaml:"concurrency"`
	// AdaptiveConcurrency is a concurrency limit whose number of slots
	// is learned.
	AdaptiveConcurrency yamldoc.Block[adaptiveConcurrencyDoc] `yaml:"adaptive_concurrency"`
}

// given returns the names of the blocks given, in the order of their
// lines (keys, where written).
func (l *limitsDoc) given(keys map[string]int) []string {
	var out []string
	lineOf := map[string]int{}
	for _, g := range []struct {
		name string
		set  bool
		line int
	}{
		{"gcra", l.GCRA.Set, l.GCRA.Line}, {"adaptive", l.Adaptive.Set, l.Adaptive.Line},
		{"quota", l.Quota.Set, l.Quota.Line}, {"sliding", l.Sliding.Set, l.Sliding.Line},
		{"concurrency", l.Concurrency.Set, l.Concurrency.Line},
		{"adaptive_concurrency", l.AdaptiveConcurrency.Set, l.AdaptiveConcurrency.Line},
	} {
		if g.set {
			out = append(out, g.name)
			lineOf[g.name] = cmp.Or(keys[g.name], g.line)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(lineOf[a], lineOf[b]) })
	return out
}

// read reads the one limit given; nil when there is none. one says that
// there must be one.
func (l *limitsDoc) read(r *yamldoc.Reader, keys map[string]int, one string) limits.Limit {
	given := l.given(keys)
	for _, name := range []string{"gcra", "adaptive", "quota", "sliding", "concurrency", "adaptive_concurrency"} {
		if keys[name] > 0 && !slices.Contains(given, name) { // written, but null
			r.Fail(name, keys[name], "must be a mapping, got null (an empty value)")
			return nil
		}
	}
	switch {
	case len(given) == 0:
		return nil
	case len(given) > 1:
		r.Fail("", r.Lines.Of(given[1]), "has both %s and %s; %s", given[0], given[1], one)
		return nil
	}
	switch given[0] {
	case "gcra":
		return limitOf(r, "gcra", &l.GCRA)
	case "adaptive":
		return limitOf(r, "adaptive", &l.Adaptive)
	case "quota":
		return limitOf(r, "quota", &l.Quota)
	case "sliding":
		return limitOf(r, "sliding", &l.Sliding)
	case "adaptive_concurrency":
		return limitOf(r, "adaptive_concurrency", &l.AdaptiveConcurrency)
	}
	return limitOf(r, "concurrency", &l.Concurrency)
}

// limitOf reads the limit block b, name.
func limitOf[T any, P interface {
	*T
	limit(r *yamldoc.Reader, line int) limits.Limit
}](r *yamldoc.Reader, name string, b *yamldoc.Block[T]) limits.Limit {
	d := yamldoc.Open(r, name, b)
	if d == nil || r.First != nil {
		return nil
	}
	l := P(d).limit(r, b.Line)
	if r.First != nil {
		return nil
	}
	return l
}

// need fails unless every key of block (at line) is given.
func need(r *yamldoc.Reader, block string, line int, keys []string, given ...bool) bool {
	for i, ok := range given {
		if !ok {
			r.Fail(block+"."+keys[i], line, "missing; %s needs %s", block, strings.Join(keys, " and "))
			return false
		}
	}
	return true
}

// gcraDoc is the limit block gcra: limits.GCRA; burst defaults to 1.
type gcraDoc struct {
	Rate  yamldoc.Val[float64]       `yaml:"rate"`
	Per   yamldoc.Val[time.Duration] `yaml:"per"`
	Burst yamldoc.Val[int]           `yaml:"burst"`
}

func (d *gcraDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	rate, okRate := yamldoc.Get(r, "gcra.rate", d.Rate)
	per, okPer := yamldoc.Get(r, "gcra.per", d.Per)
	burst, okBurst := yamldoc.Get(r, "gcra.burst", d.Burst)
	if r.First != nil || !need(r, "gcra", line, []string{"rate", "per"}, okRate, okPer) {
		return nil
	}
	if !okBurst {
		burst = 1
	}
	return limits.GCRA{Rate: rate, Period: per, Burst: burst}
}

// adaptiveDoc is the limit block adaptive: limits.Adaptive.
type adaptiveDoc struct {
	Max   yamldoc.Val[float64]       `yaml:"max"`
	Min   yamldoc.Val[float64]       `yaml:"min"`
	Start yamldoc.Val[float64]       `yaml:"start"`
	Per   yamldoc.Val[time.Duration] `yaml:"per"`
	Burst yamldoc.Val[int]           `yaml:"burst"`
}

func (d *adaptiveDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	maxRate, okMax := yamldoc.Get(r, "adaptive.max", d.Max)
	minRate, _ := yamldoc.Get(r, "adaptive.min", d.Min)
	start, _ := yamldoc.Get(r, "adaptive.start", d.Start)
	per, okPer := yamldoc.Get(r, "adaptive.per", d.Per)
	burst, _ := yamldoc.Get(r, "adaptive.burst", d.Burst)
	if r.First != nil || !need(r, "adaptive", line, []string{"max", "per"}, okMax, okPer) {
		return nil
	}
	return limits.Adaptive{Max: maxRate, Min: minRate, Start: start, Per: per, Burst: burst}
}

// quotaDoc is the limit block quota: limits.FixedWindow (every) or limits.CalendarWindow (cron, tz).
type quotaDoc struct {
	Limit yamldoc.Val[int]           `yaml:"limit"`
	Every yamldoc.Val[time.Duration] `yaml:"every"`
	Cron  yamldoc.Val[string]        `yaml:"cron"`
	TZ    yamldoc.Val[string]        `yaml:"tz"`
}

func (d *quotaDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	limit, okLimit := yamldoc.Get(r, "quota.limit", d.Limit)
	every, okEvery := yamldoc.Get(r, "quota.every", d.Every)
	cron, okCron := yamldoc.Get(r, "quota.cron", d.Cron)
	tz, okTZ := yamldoc.Get(r, "quota.tz", d.TZ)
	if r.First != nil || !need(r, "quota", line, []string{"limit"}, okLimit) {
		return nil
	}
	switch {
	case okEvery && okCron:
		r.Fail("quota", line, "has both every and cron; use every for a fixed window or cron (with tz) for a calendar window")
	case okTZ && !okCron:
		r.Fail("quota.tz", d.TZ.Line, "only allowed with cron (the calendar window's time zone)")
	case okEvery:
		return limits.FixedWindow{Limit: limit, Every: every}
	case okCron:
		return limits.CalendarWindow{Limit: limit, Cron: cron, TZ: tz}
	default:
		r.Fail("quota", line, "needs every (a fixed window, e.g. every: 10s) or cron (a calendar window, e.g. cron: \"0 0 * * *\")")
	}
	return nil
}

// slidingDoc is the limit block sliding: limits.SlidingWindow.
type slidingDoc struct {
	Limit yamldoc.Val[int]           `yaml:"limit"`
	Every yamldoc.Val[time.Duration] `yaml:"every"`
}

func (d *slidingDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	limit, okLimit := yamldoc.Get(r, "sliding.limit", d.Limit)
	every, okEvery := yamldoc.Get(r, "sliding.every", d.Every)
	if r.First != nil || !need(r, "sliding", line, []string{"limit", "every"}, okLimit, okEvery) {
		return nil
	}
	return limits.SlidingWindow{Limit: limit, Every: every}
}

// concurrencyDoc is the limit block concurrency: limits.Concurrency.
type concurrencyDoc struct {
	Max      yamldoc.Val[int]           `yaml:"max"`
	Lease    yamldoc.Val[time.Duration] `yaml:"lease"`
	Reserved yamldoc.Val[int]           `yaml:"reserved"`
}

func (d *concurrencyDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	maxSlots, okMax := yamldoc.Get(r, "concurrency.max", d.Max)
	lease, okLease := yamldoc.Get(r, "concurrency.lease", d.Lease)
	reserved, _ := yamldoc.Get(r, "concurrency.reserved", d.Reserved)
	if r.First != nil || !need(r, "concurrency", line, []string{"max", "lease"}, okMax, okLease) {
		return nil
	}
	return limits.Concurrency{Max: maxSlots, Lease: lease, Reserved: reserved}
}

// adaptiveConcurrencyDoc is the limit block adaptive_concurrency: a
// limits.Concurrency with Adaptive; min defaults to 1.
type adaptiveConcurrencyDoc struct {
	Min   yamldoc.Val[int]           `yaml:"min"`
	Max   yamldoc.Val[int]           `yaml:"max"`
	Lease yamldoc.Val[time.Duration] `yaml:"lease"`
}

func (d *adaptiveConcurrencyDoc) limit(r *yamldoc.Reader, line int) limits.Limit {
	minSlots, okMin := yamldoc.Get(r, "adaptive_concurrency.min", d.Min)
	maxSlots, okMax := yamldoc.Get(r, "adaptive_concurrency.max", d.Max)
	lease, okLease := yamldoc.Get(r, "adaptive_concurrency.lease", d.Lease)
	if r.First != nil || !need(r, "adaptive_concurrency", line, []string{"max", "lease"}, okMax, okLease) {
		return nil
	}
	if !okMin {
		minSlots = 1
	}
	return limits.Concurrency{Max: maxSlots, Min: minSlots, Lease: lease, Adaptive: true}
}
