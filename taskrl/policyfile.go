package taskrl

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

	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/quotas"
)

// ParsePolicy parses a policy document in YAML:
//
//	redis_unavailable: closed            # optional: open | closed (default) | local
//	critical:                            # optional: see Policy.WithCritical
//	  - {queue: critical}                # matchers like a rule's match
//	throttle: [per-business]             # optional: the rules an upstream throttle
//	                                     # blocks; see Policy.WithThrottle
//	rules:
//	  - name: vendor-peak                # required, unique
//	    match: {type: "http:*"}          # type (path.Match glob) and/or queue (exact)
//	    fair: "{{.business_id}}"         # optional, gcra only; see Rule.Fair
//	    mode: enforce                    # optional: enforce (default) | shadow; see Rule.Shadow
//	    soft: 10%                        # optional: see Rule.Soft (also 0.1)
//	    prefetch: 5ms                    # optional, gcra only: see Rule.Prefetch
//	    gcra: {rate: 18, per: 1s, burst: 3}
//	  - name: vendor-points
//	    match: {type: "http:call"}
//	    cost: "{{.units}}"               # optional: units per task, a template or a
//	                                     # whole number; not concurrency; see Rule.Cost
//	    default_cost: 1                  # optional; see Rule.DefaultCost
//	    settle_header: X-Actual-Cost     # optional; see Rule.SettleHeader
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
//	overrides:                           # optional: see Policy.WithOverrides
//	  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s, burst: 2}}
//	shed:                                # optional: see Shed and Policy.WithShed
//	  signal: fleet_busy                 # fleet_busy (default) | upstream_errors | probe
//	  above: 0.8                         # required
//	  classes: [{queue: bulk}, default]  # required; a bare name is a queue
//	  grace: 2s                          # optional (default 2s); also ramp (5s), window (10s)
//	http:                                # optional: the worker's http:call handler
//	  allow_hosts: [api.example.com, "*.example.net:443"]  # see Policy.WithAllowHosts
//
// Each rule has exactly one limit:
//   - gcra: rate (a positive number, fractions allowed), per (a duration),
//     burst (a whole number, at least 1; default 1): quotas.GCRA;
//   - adaptive: max and per, optional min (default max/100), start
//     (default max) and burst (default 1): quotas.Adaptive, a GCRA rate
//     the fleet learns from the remote side's throttles (numbers, fractions
//     allowed); it may have a key, a rate learned per key, but not fair;
//   - quota: limit and every (a duration): quotas.FixedWindow; or limit and
//     cron (a 5-field cron spec or a descriptor such as @daily) with an
//     optional tz (an IANA zone; default UTC): quotas.CalendarWindow;
//   - sliding: limit and every: quotas.SlidingWindow;
//   - concurrency: max, lease (a duration, at least 30s: asynq's own task
//     lease; the middleware renews it every third of it while the task runs)
//     and reserved (default 0): quotas.Concurrency.
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
// and every wrong rule is reported, one per line (see PolicyError). On any
// error the Policy is nil.
func ParsePolicy(yaml []byte) (*Policy, error) {
	p, errs := parsePolicy(yaml)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// LoadPolicyFile reads the policy file at path and parses it with
// ParsePolicy. Every error mentions the path:
//
//	policy /etc/worker/policy.yaml: line 7: rule "per-business": gcra.rate: must be a positive number, got -1
func LoadPolicyFile(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = "cannot " + pe.Op + ": " + pe.Err.Error()
		}
		return nil, &PolicyError{File: path, Msg: msg}
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
	Rules            list[block[ruleDoc]]       `yaml:"rules"`
	RedisUnavailable val[string]                `yaml:"redis_unavailable"`
	Critical         list[block[matchDoc]]      `yaml:"critical"`
	Throttle         list[val[string]]          `yaml:"throttle"`
	Overrides        list[block[overrideEntry]] `yaml:"overrides"`
	HTTP             block[httpDoc]             `yaml:"http"`
	Shed             block[shedDoc]             `yaml:"shed"`
}

// ruleDoc is a rule as written in a policy file.
type ruleDoc struct {
	Name         val[string]        `yaml:"name"`
	Match        block[matchDoc]    `yaml:"match"`
	Key          val[string]        `yaml:"key"`
	DefaultKey   val[string]        `yaml:"default_key"`
	Fair         val[string]        `yaml:"fair"`
	Mode         val[string]        `yaml:"mode"`
	Soft         val[share]         `yaml:"soft"`
	Borrow       val[factor]        `yaml:"borrow"`
	Prefetch     val[time.Duration] `yaml:"prefetch"`
	Cost         val[costText]      `yaml:"cost"`
	DefaultCost  val[int]           `yaml:"default_cost"`
	SettleHeader val[string]        `yaml:"settle_header"`
	Limits       limitsDoc          `yaml:",inline"`
}

// matchDoc is a matcher: a rule's match, a critical entry, a shed class.
type matchDoc struct {
	Type  val[string] `yaml:"type"`
	Queue val[string] `yaml:"queue"`
}

// httpDoc is the http section: the worker's http:call handler.
type httpDoc struct {
	AllowHosts list[val[string]] `yaml:"allow_hosts"`
}

// shedDoc is the shed section (see Shed).
type shedDoc struct {
	Signal  val[string]        `yaml:"signal"`
	Above   val[float64]       `yaml:"above"`
	Classes list[class]        `yaml:"classes"`
	Grace   val[time.Duration] `yaml:"grace"`
	Ramp    val[time.Duration] `yaml:"ramp"`
	Window  val[time.Duration] `yaml:"window"`
}

// class is an entry of shed.classes: a matcher, or a queue's bare name.
type class struct {
	queue val[string]
	match block[matchDoc]
}

// UnmarshalYAML reads a bare name into c.queue, anything else into
// c.match.
func (c *class) UnmarshalYAML(decode func(any) error) error {
	n, err := valueOf(decode)
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
	add := func(fe *ferr, index int, rule string) {
		if fe != nil {
			errs.add(&PolicyError{Line: fe.line, Index: index, Rule: rule, Field: fe.field, Msg: fe.msg})
		}
	}
	var doc block[policyDoc]
	if fe := decodeDoc(data, "a policy needs a rules list", &doc); fe != nil {
		add(fe, 0, "")
		return nil, errs
	}
	top := &reader{ls: lines{}}
	d := must(top, "", doc.line, &doc)
	if d == nil {
		add(top.fe, 0, "")
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
	hosts, more := readHTTP(&d.HTTP)
	errs = append(errs, more...)
	shed, fe := readShed(&d.Shed)
	add(fe, 0, "")

	r := &reader{ls: lines{}}
	switch entries(r, "rules", &d.Rules, "a list of rules"); {
	case !d.Rules.set && doc.keys["rules"] == 0:
		r.fail("rules", 0, "missing; a policy needs a list of rules")
	case r.fe == nil && len(d.Rules.v) == 0:
		r.fail("rules", max(d.Rules.line, doc.keys["rules"]), "empty; a policy needs at least one rule")
	}
	if r.fe != nil {
		add(r.fe, 0, "")
		return nil, errs
	}
	rules := make([]Rule, len(d.Rules.v))
	pos := make([]lines, len(d.Rules.v))
	skip := make([]bool, len(d.Rules.v))
	for i := range d.Rules.v {
		rule, ls, fe := readRule(&d.Rules.v[i], d.Rules.lines[i])
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
				errs.add(&PolicyError{Line: throttleAt[i], Field: fmt.Sprintf("throttle[%d]", i+1), Msg: msg})
			}
		}
		p.throttle = throttle
		var more errList
		p.overrides, more = p.checkOverrides(overrides, overridesAt)
		errs = append(errs, more...)
		p.hosts = hosts
		p.shed = shed
	}
	slices.SortStableFunc(errs, func(a, b *PolicyError) int {
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
func must[T any](r *reader, field string, line int, b *block[T]) *T {
	if !b.set {
		r.fail(field, max(b.line, line), "must be a mapping, got null (an empty value)")
		return nil
	}
	return open(r, field, b)
}

// readMode reads redis_unavailable; FailClosed when absent.
func readMode(s val[string]) (FailureMode, *ferr) {
	r := &reader{ls: lines{}}
	v, ok := get(r, "redis_unavailable", s)
	if !ok {
		return FailClosed, r.fe
	}
	switch m := FailureMode(v); m {
	case FailOpen, FailClosed, FailLocal:
		return m, nil
	}
	r.fail("redis_unavailable", s.line, "must be open, closed or local, got %q", v)
	return FailClosed, r.fe
}

// readMatch reads the matcher b, field ("match", "critical[1]").
func readMatch(r *reader, field string, b *block[matchDoc]) Match {
	var m Match
	if md := open(r, field, b); md != nil {
		m.Type, _ = get(r, field+".type", md.Type)
		m.Queue, _ = get(r, field+".queue", md.Queue)
	}
	return m
}

// readCritical reads the top-level critical list: matchers like a rule's.
func readCritical(l *list[block[matchDoc]]) ([]Match, errList) {
	var errs errList
	add := func(fe *ferr) { errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg}) }
	r := &reader{ls: lines{}}
	es := entries(r, "critical", l, "a list of matchers such as - {queue: critical}")
	if r.fe != nil {
		add(r.fe)
		return nil, errs
	}
	var out []Match
	for i := range es {
		field := criticalField(i, "")
		r := &reader{ls: lines{field: l.lines[i]}}
		m := readMatch(r, field, &es[i])
		if r.fe == nil {
			if f, msg := checkMatch(m); msg != "" {
				f = criticalField(i, f)
				r.fail(f, r.ls.of(f), "%s", msg)
			}
		}
		if r.fe != nil {
			add(r.fe)
			continue
		}
		out = append(out, m)
	}
	return out, errs
}

// readNames reads a list of rule names, field, with the line of each.
func readNames(l *list[val[string]], field string) (names []string, at []int, fe *ferr) {
	r := &reader{ls: lines{}}
	for i, s := range entries(r, field, l, "a list of rule names such as [per-business]") {
		f := fmt.Sprintf("%s[%d]", field, i+1)
		if v, _ := get(r, f, s); v == "" {
			r.fail(f, l.lines[i], "must be a rule name")
		}
		names, at = append(names, s.v), append(at, l.lines[i])
	}
	if r.fe != nil {
		return nil, nil, r.fe
	}
	return names, at, nil
}

// readShed reads the top-level shed section (see Shed) with its defaults;
// nil for an empty one.
func readShed(b *block[shedDoc]) (*Shed, *ferr) {
	r := &reader{ls: lines{}}
	sd := open(r, "shed", b)
	if sd == nil {
		return nil, r.fe
	}
	r.at("shed", b.keys)
	var s Shed
	signal, _ := get(r, "shed.signal", sd.Signal)
	s.Signal = ShedSignal(signal)
	s.Above, _ = get(r, "shed.above", sd.Above)
	for i, c := range entries(r, "shed.classes", &sd.Classes, "a list of classes, least important first, such as [{queue: bulk}, {queue: default}]") {
		f := fmt.Sprintf("shed.classes[%d]", i+1)
		r.ls[f] = sd.Classes.lines[i]
		if c.queue.set {
			q, _ := get(r, f, c.queue)
			s.Classes = append(s.Classes, Match{Queue: q})
			continue
		}
		s.Classes = append(s.Classes, readMatch(r, f, &c.match))
	}
	s.Grace, _ = get(r, "shed.grace", sd.Grace)
	s.Ramp, _ = get(r, "shed.ramp", sd.Ramp)
	s.Window, _ = get(r, "shed.window", sd.Window)
	if r.fe != nil {
		return nil, r.fe
	}
	if f, msg := s.check(); msg != "" {
		return nil, &ferr{field: "shed." + f, line: r.ls.of("shed." + f), msg: msg}
	}
	s = s.withDefaults()
	return &s, nil
}

// readHTTP reads the top-level http section: allow_hosts, a list of host
// patterns (see Policy.WithAllowHosts), returned in canonical form.
func readHTTP(b *block[httpDoc]) ([]string, errList) {
	var errs errList
	add := func(fe *ferr) { errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg}) }
	r := &reader{ls: lines{}}
	hd := open(r, "http", b)
	if hd == nil {
		if r.fe != nil {
			add(r.fe)
		}
		return nil, errs
	}
	var hosts []string
	es := entries(r, "http.allow_hosts", &hd.AllowHosts, `a list of hosts such as [api.example.com, "*.example.net:443"]`)
	if r.fe != nil {
		add(r.fe)
	}
	for i, s := range es {
		f := fmt.Sprintf("http.allow_hosts[%d]", i+1)
		r := &reader{ls: lines{}}
		if h, ok := get(r, f, s); ok {
			if pt, err := egress.ParsePattern(h); err != nil {
				r.fail(f, s.line, "%v", err)
			} else {
				hosts = append(hosts, pt.String())
			}
		} else {
			r.fail(f, hd.AllowHosts.lines[i], "must be a host such as api.example.com")
		}
		if r.fe != nil {
			add(r.fe)
		}
	}
	return hosts, errs
}

// readRule reads one rule, the entry at line of the rules list. It returns
// what it could read (the name at least, when there is one) even on error.
func readRule(b *block[ruleDoc], line int) (Rule, lines, *ferr) {
	var rule Rule
	r := &reader{ls: lines{"": max(b.line, line)}}
	rd := &b.v
	rule.Name, _ = get(r, "name", rd.Name)
	if must(r, "", line, b) == nil || r.fe != nil {
		return rule, r.ls, r.fe
	}
	r.at("", b.keys)
	rule.Match = readMatch(r, "match", &rd.Match)
	rule.Key, _ = get(r, "key", rd.Key)
	rule.DefaultKey, _ = get(r, "default_key", rd.DefaultKey)
	rule.Fair, _ = get(r, "fair", rd.Fair)
	if mode, ok := get(r, "mode", rd.Mode); ok {
		switch mode {
		case "shadow":
			rule.Shadow = true
		case "enforce", "":
		default:
			r.fail("mode", rd.Mode.line, "must be enforce or shadow, got %q", mode)
		}
	}
	soft, _ := get(r, "soft", rd.Soft)
	borrow, _ := get(r, "borrow", rd.Borrow)
	rule.Soft, rule.Borrow = float64(soft), float64(borrow)
	rule.Prefetch, _ = get(r, "prefetch", rd.Prefetch)
	cost, _ := get(r, "cost", rd.Cost)
	rule.Cost = string(cost)
	rule.DefaultCost, _ = get(r, "default_cost", rd.DefaultCost)
	rule.SettleHeader, _ = get(r, "settle_header", rd.SettleHeader)
	rule.Limit = rd.Limits.read(r, b.keys, "a rule has exactly one limit")
	return rule, r.ls, r.fe
}

// limitsDoc is the limit blocks of a rule or override, of which one is
// given.
type limitsDoc struct {
	GCRA        block[gcraDoc]        `yaml:"gcra"`
	Adaptive    block[adaptiveDoc]    `yaml:"adaptive"`
	Quota       block[quotaDoc]       `yaml:"quota"`
	Sliding     block[slidingDoc]     `yaml:"sliding"`
	Concurrency block[concurrencyDoc] `yaml:"concurrency"`
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
		{"gcra", l.GCRA.set, l.GCRA.line}, {"adaptive", l.Adaptive.set, l.Adaptive.line},
		{"quota", l.Quota.set, l.Quota.line}, {"sliding", l.Sliding.set, l.Sliding.line},
		{"concurrency", l.Concurrency.set, l.Concurrency.line},
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
func (l *limitsDoc) read(r *reader, keys map[string]int, one string) quotas.Limit {
	given := l.given(keys)
	switch {
	case len(given) == 0:
		return nil
	case len(given) > 1:
		r.fail("", r.ls.of(given[1]), "has both %s and %s; %s", given[0], given[1], one)
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
	}
	return limitOf(r, "concurrency", &l.Concurrency)
}

// limitOf reads the limit block b, name.
func limitOf[T any, P interface {
	*T
	limit(r *reader, line int) quotas.Limit
}](r *reader, name string, b *block[T]) quotas.Limit {
	d := open(r, name, b)
	if d == nil || r.fe != nil {
		return nil
	}
	l := P(d).limit(r, b.line)
	if r.fe != nil {
		return nil
	}
	return l
}

// need fails unless every key of block (at line) is given.
func need(r *reader, block string, line int, keys []string, given ...bool) bool {
	for i, ok := range given {
		if !ok {
			r.fail(block+"."+keys[i], line, "missing; %s needs %s", block, strings.Join(keys, " and "))
			return false
		}
	}
	return true
}

type gcraDoc struct {
	Rate  val[float64]       `yaml:"rate"`
	Per   val[time.Duration] `yaml:"per"`
	Burst val[int]           `yaml:"burst"`
}

func (d *gcraDoc) limit(r *reader, line int) quotas.Limit {
	rate, okRate := get(r, "gcra.rate", d.Rate)
	per, okPer := get(r, "gcra.per", d.Per)
	burst, okBurst := get(r, "gcra.burst", d.Burst)
	if r.fe != nil || !need(r, "gcra", line, []string{"rate", "per"}, okRate, okPer) {
		return nil
	}
	if !okBurst {
		burst = 1
	}
	return quotas.GCRA{Rate: rate, Period: per, Burst: burst}
}

type adaptiveDoc struct {
	Max   val[float64]       `yaml:"max"`
	Min   val[float64]       `yaml:"min"`
	Start val[float64]       `yaml:"start"`
	Per   val[time.Duration] `yaml:"per"`
	Burst val[int]           `yaml:"burst"`
}

func (d *adaptiveDoc) limit(r *reader, line int) quotas.Limit {
	maxRate, okMax := get(r, "adaptive.max", d.Max)
	minRate, _ := get(r, "adaptive.min", d.Min)
	start, _ := get(r, "adaptive.start", d.Start)
	per, okPer := get(r, "adaptive.per", d.Per)
	burst, _ := get(r, "adaptive.burst", d.Burst)
	if r.fe != nil || !need(r, "adaptive", line, []string{"max", "per"}, okMax, okPer) {
		return nil
	}
	return quotas.Adaptive{Max: maxRate, Min: minRate, Start: start, Per: per, Burst: burst}
}

type quotaDoc struct {
	Limit val[int]           `yaml:"limit"`
	Every val[time.Duration] `yaml:"every"`
	Cron  val[string]        `yaml:"cron"`
	TZ    val[string]        `yaml:"tz"`
}

func (d *quotaDoc) limit(r *reader, line int) quotas.Limit {
	limit, okLimit := get(r, "quota.limit", d.Limit)
	every, okEvery := get(r, "quota.every", d.Every)
	cron, okCron := get(r, "quota.cron", d.Cron)
	tz, okTZ := get(r, "quota.tz", d.TZ)
	if r.fe != nil || !need(r, "quota", line, []string{"limit"}, okLimit) {
		return nil
	}
	switch {
	case okEvery && okCron:
		r.fail("quota", line, "has both every and cron; use every for a fixed window or cron (with tz) for a calendar window")
	case okTZ && !okCron:
		r.fail("quota.tz", d.TZ.line, "only allowed with cron (the calendar window's time zone)")
	case okEvery:
		return quotas.FixedWindow{Limit: limit, Every: every}
	case okCron:
		return quotas.CalendarWindow{Limit: limit, Cron: cron, TZ: tz}
	default:
		r.fail("quota", line, "needs every (a fixed window, e.g. every: 10s) or cron (a calendar window, e.g. cron: \"0 0 * * *\")")
	}
	return nil
}

type slidingDoc struct {
	Limit val[int]           `yaml:"limit"`
	Every val[time.Duration] `yaml:"every"`
}

func (d *slidingDoc) limit(r *reader, line int) quotas.Limit {
	limit, okLimit := get(r, "sliding.limit", d.Limit)
	every, okEvery := get(r, "sliding.every", d.Every)
	if r.fe != nil || !need(r, "sliding", line, []string{"limit", "every"}, okLimit, okEvery) {
		return nil
	}
	return quotas.SlidingWindow{Limit: limit, Every: every}
}

type concurrencyDoc struct {
	Max      val[int]           `yaml:"max"`
	Lease    val[time.Duration] `yaml:"lease"`
	Reserved val[int]           `yaml:"reserved"`
}

func (d *concurrencyDoc) limit(r *reader, line int) quotas.Limit {
	maxSlots, okMax := get(r, "concurrency.max", d.Max)
	lease, okLease := get(r, "concurrency.lease", d.Lease)
	reserved, _ := get(r, "concurrency.reserved", d.Reserved)
	if r.fe != nil || !need(r, "concurrency", line, []string{"max", "lease"}, okMax, okLease) {
		return nil
	}
	return quotas.Concurrency{Max: maxSlots, Lease: lease, Reserved: reserved}
}
