package policy

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/taskrl/taskrl/internal/yamldoc"
	"github.com/taskrl/taskrl/limits"
)

// buildPolicy validates rules; pos, when not nil, holds each rule's YAML
// lines, and skip marks rules already reported (they are only checked for
// duplicate names) and left nil in the Policy returned, which then serves
// only to check the rest of the document.
func buildPolicy(rules []Rule, pos []yamldoc.Lines, skip []bool, mode FailureMode) (*Policy, errList) {
	var errs errList
	if len(rules) == 0 {
		errs.add(&Error{Field: "rules", Msg: "a policy needs at least one rule"})
		return nil, errs
	}
	p := &Policy{mode: mode, rules: make([]*crule, len(rules))}
	seen := map[string]int{}
	for i, r := range rules {
		var ls yamldoc.Lines
		if pos != nil {
			ls = pos[i]
		}
		if skip != nil && skip[i] {
			if _, dup := seen[r.Name]; !dup && checkName(r.Name) == nil {
				seen[r.Name] = i + 1
			}
			continue
		}
		c, field, msg := compileRule(r)
		if msg != "" {
			e := &Error{Line: ls.Of(field), Index: i + 1, Field: field, Msg: msg}
			if checkName(r.Name) == nil {
				e.Rule = r.Name
			}
			errs.add(e)
			continue
		}
		if j, dup := seen[r.Name]; dup {
			errs.add(&Error{Line: ls.Of("name"), Index: i + 1, Field: "name", Msg: fmt.Sprintf("%q is already the name of rule %d", r.Name, j)})
			continue
		}
		seen[r.Name] = i + 1
		p.rules[i] = c
	}
	if len(errs) > 0 {
		return nil, errs
	}
	for i, c := range p.rules {
		if c == nil || c.Borrow == 0 {
			continue
		}
		var ls yamldoc.Lines
		if pos != nil {
			ls = pos[i]
		}
		shared := sharedRule(p.rules, c)
		if shared == nil {
			errs.add(&Error{Line: ls.Of("borrow"), Index: i + 1, Rule: c.Name, Field: "borrow",
				Msg: "needs an enforced fair gcra rule (fair: ...) governing every task this rule governs: the shared limit it borrows from, whose fair sharing gives the capacity back when other keys have work; no rule's match covers " + matchText(c.Match)})
			continue
		}
		if math.IsInf(c.Borrow, 1) {
			own, sh := c.Limit.(limits.GCRA), shared.Limit.(limits.GCRA)
			c.Borrow = perSecond(sh) / perSecond(own)
			if c.Borrow <= 1 {
				errs.add(&Error{Line: ls.Of("borrow"), Index: i + 1, Rule: c.Name, Field: "borrow",
					Msg: fmt.Sprintf("true, but the shared rule %q (%s) is no faster than this rule (%s): nothing to borrow", shared.Name, sh, own)})
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return p, nil
}

// sharedRule returns the enforced fair gcra rule of rules that governs
// every task c governs, the slowest if several do, or nil.
func sharedRule(rules []*crule, c *crule) *crule {
	var best *crule
	for _, f := range rules {
		if f == nil {
			continue
		}
		g, ok := f.Limit.(limits.GCRA)
		if !ok || f.ftmpl == nil || f.Shadow || !covers(f.Match, c.Match) {
			continue
		}
		if best == nil || perSecond(g) < perSecond(best.Limit.(limits.GCRA)) {
			best = f
		}
	}
	return best
}

// covers reports whether every task m matches is matched by f too.
func covers(f, m Match) bool {
	if f.Queue != "" && f.Queue != m.Queue {
		return false
	}
	switch {
	case f.Type == "" || f.Type == m.Type:
		return true
	case m.Type == "" || strings.ContainsAny(m.Type, `*?[\`):
		return false // a pattern: covered only by itself
	}
	ok, _ := path.Match(f.Type, m.Type)
	return ok
}

// matchText writes m as in a policy file.
func matchText(m Match) string {
	var parts []string
	if m.Type != "" {
		parts = append(parts, fmt.Sprintf("type: %q", m.Type))
	}
	if m.Queue != "" {
		parts = append(parts, fmt.Sprintf("queue: %q", m.Queue))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// perSecond is g's rate per second.
func perSecond(g limits.GCRA) float64 { return g.Rate / g.Period.Seconds() }

// compileRule validates r. On failure it returns the field at fault and
// what is wrong.
func compileRule(r Rule) (c *crule, field, msg string) {
	if err := checkName(r.Name); err != nil {
		return nil, "name", err.Error()
	}
	if field, msg := checkMatch(r.Match); msg != "" {
		return nil, field, msg
	}
	c = &crule{Rule: r}
	if r.Key != "" {
		t, err := parseKeyTemplate(r.Key)
		if err != nil {
			return nil, "key", "bad template " + err.Error()
		}
		c.tmpl = t
	}
	if r.DefaultKey != "" && (c.tmpl == nil || !c.tmpl.fields) {
		return nil, "default_key", "set, but key references no payload field that could be missing"
	}
	lim, field, msg := checkLimit(r.Name, r.Limit)
	if msg != "" {
		return nil, field, msg
	}
	c.Limit = lim
	if field, msg := c.compileTiers(); msg != "" {
		return nil, field, msg
	}
	if r.Soft != 0 {
		switch lim.(type) {
		case limits.GCRA, limits.FixedWindow, limits.SlidingWindow:
		default:
			return nil, "soft", "only a gcra rate, a fixed quota window or a sliding window can be soft; this rule's limit is " + lim.String()
		}
		if !(r.Soft > 0 && r.Soft <= 10) {
			return nil, "soft", fmt.Sprintf("must be a share between 0 and 1000%% (10), got %v", r.Soft)
		}
		if err := (limits.Rule{Name: r.Name, Limit: r.Raised(lim)}).Validate(); err != nil {
			return nil, "soft", "raises the limit past its bounds: " + err.Error()
		}
	}
	if r.Borrow != 0 {
		switch {
		case !(r.Borrow > 1 && r.Borrow <= 100 || math.IsInf(r.Borrow, 1)):
			return nil, "borrow", fmt.Sprintf("must be true or a factor above 1 and at most 100 (2x), got %v", r.Borrow)
		case r.Key == "":
			return nil, "borrow", "only a keyed rule (key: ...) can borrow: a global rule has no shared limit above it"
		case r.Fair != "":
			return nil, "borrow", "a fair rule cannot borrow: it is the shared limit others borrow from"
		}
		if _, ok := lim.(limits.GCRA); !ok {
			return nil, "borrow", "only a gcra rate can borrow; this rule's limit is " + lim.String()
		}
		if err := (limits.Rule{Name: r.Name, Limit: r.Raised(lim)}).Validate(); err != nil {
			return nil, "borrow", "raises the limit past its bounds: " + err.Error()
		}
	}
	if r.Fair != "" {
		t, err := parseKeyTemplate(r.Fair)
		if err != nil {
			return nil, "fair", "bad template " + err.Error()
		}
		switch l := lim.(type) {
		case limits.GCRA:
		case limits.Concurrency:
			if l.Adaptive {
				return nil, "fair", "an adaptive concurrency rule learns one number of slots for all its tasks; it cannot be shared fairly (remove fair, or use concurrency)"
			}
		default:
			return nil, "fair", "only a gcra rate or a concurrency cap can be shared fairly; this rule's limit is " + lim.String()
		}
		c.ftmpl = t
	}
	if r.FairWeight != "" {
		if r.Fair == "" {
			return nil, "fair.weight", "weighs the values of fair: give fair: {key: ..., weight: ...}"
		}
		t, err := parseKeyTemplate(r.FairWeight)
		if err != nil {
			return nil, "fair.weight", "bad template " + err.Error()
		}
		if t.fields && len(t.parts) != 1 {
			return nil, "fair.weight", fmt.Sprintf("a template of the weight is one field such as \"{{.weight}}\", with no text around it, got %q", r.FairWeight)
		}
		if n, err := strconv.Atoi(r.FairWeight); !t.fields && (err != nil || n < 1 || n > limits.MaxWeight) {
			return nil, "fair.weight", fmt.Sprintf("must be a whole number from 1 to %d or a template such as \"{{.weight}}\", got %q", limits.MaxWeight, r.FairWeight)
		}
		c.wtmpl = t
	}
	if field, msg := c.compilePriority(lim); msg != "" {
		return nil, field, msg
	}
	if r.Cost != "" || r.DefaultCost != 0 {
		if field, msg := c.compileCost(lim); msg != "" {
			return nil, field, msg
		}
	}
	if r.Prefetch < 0 && r.Prefetch != NoPrefetch {
		return nil, "prefetch", fmt.Sprintf("must be between 1µs and %v, or off, got %v", limits.MaxPrefetch, r.Prefetch)
	}
	if r.Prefetch > 0 {
		if err := (limits.Rule{Name: r.Name, Limit: r.Raised(lim), Fair: r.Fair != "", Prefetch: r.Prefetch}).Validate(); err != nil {
			var re *limits.RuleError
			if errors.As(err, &re) && re.Field == "Rule.Prefetch" {
				return nil, "prefetch", re.Reason
			}
			return nil, "prefetch", err.Error()
		}
	}
	return c, "", ""
}

// DefaultAging is a prioritized rule's Aging when it gives none: a task
// of level 5 keeps its booking from tasks of level 1 once it has waited
// 4 agings, 40 s.
const DefaultAging = 10 * time.Second

// compilePriority validates the rule's Priority, PriorityQueues and
// Aging under its limit lim; on failure it returns the field at fault
// and what is wrong.
func (c *crule) compilePriority(lim limits.Limit) (field, msg string) {
	r := c.Rule
	if r.Priority == "" && r.PriorityQueues == nil {
		if r.Aging != 0 {
			return "priority.aging", "set, but the rule has no priority: give priority: {level: ..., queues: ...}"
		}
		return "", ""
	}
	levels := fmt.Sprintf("a level from 1 (first) to %d (last)", limits.MaxPriority)
	switch {
	case r.Prefetch > 0:
		return "prefetch", "a rule with priority decides each task in turn with the others waiting; remove prefetch or priority"
	case r.Borrow != 0:
		return "priority", "a borrowing rule cannot have priority: give the priority to the shared fair rule it borrows from"
	}
	_, rate := lim.(limits.GCRA)
	cc, slots := lim.(limits.Concurrency)
	if !rate && (!slots || cc.Adaptive) {
		return "priority", "orders the tasks waiting for a gcra rate or a concurrency cap; this rule's limit is " + lim.String()
	}
	if r.Priority != "" {
		t, err := parseKeyTemplate(r.Priority)
		switch {
		case err != nil:
			return "priority", "bad template " + err.Error()
		case t.fields && len(t.parts) != 1:
			return "priority", fmt.Sprintf("a template of the level is one field such as \"{{.priority}}\", with no text around it, got %q", r.Priority)
		case t.fields:
			c.ptmpl = t
		default:
			if n, err := strconv.Atoi(r.Priority); err == nil && n >= 1 && n <= limits.MaxPriority {
				c.level = n
			} else {
				return "priority", fmt.Sprintf("must be %s or a template such as \"{{.priority}}\", got %q", levels, r.Priority)
			}
		}
	}
	for _, q := range slices.Sorted(maps.Keys(r.PriorityQueues)) {
		if n := r.PriorityQueues[q]; n < 1 || n > limits.MaxPriority {
			return yamldoc.Join("priority.queues", q), fmt.Sprintf("must be %s, got %d", levels, n)
		}
		if q == "" {
			return "priority.queues", "a queue's name must not be empty"
		}
	}
	if a := r.PriorityAging(); a < limits.MinAging || a > limits.MaxAging {
		return "priority.aging", fmt.Sprintf("must be between %v and %v, got %v", limits.MinAging, limits.MaxAging, r.Aging)
	}
	return "", ""
}

// compileCost validates the rule's Cost and DefaultCost under its limit
// lim; on failure it returns the field at fault and what is wrong.
func (c *crule) compileCost(lim limits.Limit) (field, msg string) {
	r := c.Rule
	if r.Cost == "" {
		return "default_cost", "set, but the rule has no cost"
	}
	if _, ok := lim.(limits.Concurrency); ok {
		return "cost", "a concurrency rule takes one slot per task; only gcra, adaptive, quota and sliding rules have a cost"
	}
	if r.Prefetch > 0 {
		return "cost", "a rule with prefetch hands out one unit per task; remove prefetch or cost"
	}
	if n, err := strconv.Atoi(r.Cost); err == nil {
		if n < 1 {
			return "cost", fmt.Sprintf("must be a whole number of at least 1, got %d", n)
		}
		c.cost = n
	} else {
		t, err := parseKeyTemplate(r.Cost)
		if err != nil {
			return "cost", "bad template " + err.Error()
		}
		if !t.fields {
			return "cost", fmt.Sprintf("must be a whole number of at least 1 or a template over the payload such as \"{{.units}}\", got %q", r.Cost)
		}
		c.ctmpl = t
	}
	if m := limits.Capacity(lim); c.cost > m {
		return "cost", fmt.Sprintf("%d is above the rule's %s of %d: no task could ever pass", c.cost, capacityName(lim), m)
	}
	switch {
	case r.DefaultCost < 0:
		return "default_cost", fmt.Sprintf("must be a whole number of at least 1, got %d", r.DefaultCost)
	case r.DefaultCost > 0 && c.ctmpl == nil:
		return "default_cost", "set, but cost references no payload field that could be missing"
	case r.DefaultCost > limits.Capacity(lim):
		return "default_cost", fmt.Sprintf("%d is above the rule's %s of %d: no task could ever pass", r.DefaultCost, capacityName(lim), limits.Capacity(lim))
	}
	return "", ""
}

// capacityName names capacity's measure of l: "burst" or "limit".
func capacityName(l limits.Limit) string {
	switch l.(type) {
	case limits.GCRA, limits.Adaptive:
		return "burst"
	}
	return "limit"
}

// checkMatch validates m; on failure it returns the field at fault
// ("match" or "match.type") and what is wrong.
func checkMatch(m Match) (field, msg string) {
	if m.Type == "" && m.Queue == "" {
		return "match", "needs a task type (type: ...) or a queue (queue: ...) or both"
	}
	if m.Type != "" {
		if _, err := path.Match(m.Type, ""); err != nil {
			return "match.type", fmt.Sprintf("bad pattern %q: %v (see path.Match)", m.Type, err)
		}
	}
	return "", ""
}

// checkName applies quotas' rule-name rules.
// compileTiers checks the rule's Tiers (keyed rule, names, limits of the
// rule's kind, valid once raised) and Tier, and keeps each tier's limit as
// a value.
func (c *crule) compileTiers() (field, msg string) {
	if c.Tier != "" && len(c.Tiers) == 0 {
		return "tier", "set, but the rule has no tiers to choose from"
	}
	if len(c.Tiers) == 0 {
		return "", ""
	}
	if c.tmpl == nil || !c.tmpl.fields {
		return "tiers", "only a rule with a key from the payload has plans: a global rule limits one thing"
	}
	if math.IsInf(c.Borrow, 1) {
		return "borrow", "true borrows up to the shared rule's rate from the rule's own, which its plans do not share: give a factor such as 2x"
	}
	tiers := make(map[string]limits.Limit, len(c.Tiers))
	for _, name := range slices.Sorted(maps.Keys(c.Tiers)) {
		f := "tiers." + name
		if err := checkName(name); err != nil {
			return f, "plan name: " + strings.Replace(err.Error(), "every rule needs a name", "a plan needs a name", 1)
		}
		lim, lf, msg := checkLimit(c.Name, c.Tiers[name])
		if msg != "" {
			return yamldoc.Join(f, lf), msg
		}
		if !sameKind(lim, c.Limit) {
			return yamldoc.Join(f, blockOf(lim)), fmt.Sprintf("is %s; the rule is %s, and a plan keeps the kind of limit", lim, c.Limit)
		}
		if err := (limits.Rule{Name: c.Name, Limit: c.Raised(lim)}).Validate(); err != nil {
			return f, "raised by soft or borrow past its bounds: " + err.Error()
		}
		tiers[name] = lim
	}
	c.Tiers = tiers
	if c.Tier != "" {
		t, err := parseKeyTemplate(c.Tier)
		if err != nil {
			return "tier", "bad template " + err.Error()
		}
		c.ttmpl = t
	}
	return "", ""
}

func checkName(name string) error {
	if name == "" {
		return errors.New("missing; every rule needs a name")
	}
	var re *limits.RuleError
	if errors.As(limits.Rule{Name: name}.Validate(), &re) && re.Field == "Rule.Name" {
		return errors.New(re.Reason)
	}
	return nil
}

// yamlFields maps the fields of quotas' limits (limits.RuleError.Field) to
// their names in a policy's limit blocks.
var yamlFields = map[string]string{
	"Rate": "rate", "Period": "per", "Burst": "burst", "Min": "min", "Start": "start", "Per": "per",
	"Limit": "limit", "Every": "every", "Cron": "cron", "TZ": "tz",
	"Max": "max", "Lease": "lease", "Reserved": "reserved",
}

// minLease is the shortest concurrency lease a policy accepts: asynq's own
// lease on a running task. The middleware renews a slot every third of its
// lease while the task runs.
const minLease = 30 * time.Second

// checkLimit validates the limit l of the rule named name (a valid name)
// with quotas and returns it as a value (not a pointer), or the field at
// fault and what is wrong.
func checkLimit(name string, l limits.Limit) (out limits.Limit, field, msg string) {
	var block string
	switch v := l.(type) {
	case *limits.GCRA:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *limits.Adaptive:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *limits.FixedWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *limits.CalendarWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *limits.SlidingWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *limits.Concurrency:
		if v != nil {
			return checkLimit(name, *v)
		}
	case limits.GCRA:
		block = "gcra"
	case limits.Adaptive:
		block = "adaptive"
	case limits.FixedWindow, limits.CalendarWindow:
		block = "quota"
	case limits.SlidingWindow:
		block = "sliding"
	case limits.Concurrency:
		block = "concurrency"
		if v.Adaptive {
			block = "adaptive_concurrency"
		}
		if v.Lease < minLease {
			return nil, block + ".lease", fmt.Sprintf("must be at least %v, asynq's own task lease (a shorter one could free the slot of a task still running on a stalled worker), got %v", minLease, v.Lease)
		}
	}
	if block == "" {
		return nil, "", "no limit; add one of gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency"
	}
	err := limits.Rule{Name: name, Limit: l}.Validate()
	if err == nil {
		return l, "", ""
	}
	var re *limits.RuleError
	if !errors.As(err, &re) {
		return nil, block, err.Error()
	}
	if f, ok := yamlFields[re.Field]; ok {
		return nil, block + "." + f, re.Reason
	}
	// No one field is at fault (a GCRA's per/rate): the reason names the
	// Go fields, which are the YAML ones but for Period.
	return nil, block, strings.ReplaceAll(re.Reason, "period", "per")
}
