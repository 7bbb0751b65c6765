package policy

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/taskrl/taskrl/internal/yamldoc"
	"github.com/taskrl/taskrl/limits"
)

// Override gives one key of a keyed rule a limit of its own: a customer
// on a plan of its own ("b7 pays for 5/s") without a rule of its own. The
// key keeps the rule's name, state and everything else; only its limit
// differs. See Policy.WithOverrides.
type Override struct {
	// Rule is the name of a rule of the policy that has a Key template.
	Rule string
	// Key is the entity as the rule's Key template renders it from a
	// payload (for key "{{.business_id}}", a business id such as "b7").
	Key string
	// Limit replaces the rule's limit for Key; it must be of the same kind
	// as the rule's (a GCRA for a gcra rule, a window of the same type for
	// a quota rule, and so on): the key's state in Redis carries over.
	// Nil with Unlimited.
	Limit limits.Limit
	// Unlimited exempts Key from the rule: the rule does not apply to the
	// key's tasks (they neither wait for it nor are counted by it; the
	// other rules still apply). Limit must be nil. Refused for the fair
	// rule a borrowing rule borrows from (Rule.Borrow), whose fair sharing
	// is what gives the borrowed capacity back.
	Unlimited bool
	// Tier puts Key on one of the rule's plans (Rule.Tiers): Key is
	// decided at that plan's limit, whatever plan its payloads name.
	// Unlimited must be false, and Limit nil or the plan's (Overrides
	// reports the plan's limit in it).
	Tier string
}

// WithOverrides returns a copy of p with overrides added: each replaces
// the limit of one key of a keyed rule (or exempts the key from the rule:
// Override.Unlimited), and replaces an override p already
// has for the same rule and key. The policy file's overrides list is read
// into the same. Errors name the entry (overrides[1].rule,
// overrides[1].gcra.rate) and what is wrong: a rule that p lacks or that
// has no key, an empty key, a limit that is invalid or of another kind
// than the rule's, the same rule and key twice. All entries are reported;
// on any error the Policy is nil.
func (p *Policy) WithOverrides(overrides ...Override) (*Policy, error) {
	out, errs := p.checkOverrides(overrides, nil)
	if err := errs.err(); err != nil {
		return nil, err
	}
	q := p.with()
	q.overrides = mergeOverrides(p.Overrides(), out)
	return q, nil
}

// Overrides returns a copy of the policy's overrides, in order.
func (p *Policy) Overrides() []Override {
	if p == nil {
		return nil
	}
	return append([]Override(nil), p.overrides...)
}

// checkOverrides validates overrides against p's rules; at, when not nil,
// gives each entry's lines in a policy file. It returns them with their
// limits as values.
func (p *Policy) checkOverrides(overrides []Override, at []yamldoc.Lines) ([]Override, errList) {
	var errs errList
	out := make([]Override, 0, len(overrides))
	seen := map[[2]string]int{}
	for i, o := range overrides {
		var ls yamldoc.Lines
		if at != nil {
			ls = at[i]
		}
		field := fmt.Sprintf("overrides[%d]", i+1)
		bad := func(f, format string, args ...any) {
			errs.add(&Error{Line: ls.Of(f), Field: yamldoc.Join(field, f), Msg: fmt.Sprintf(format, args...)})
		}
		r := p.rule(o.Rule)
		switch {
		case o.Rule == "":
			bad("rule", "missing; an override names the rule it changes")
			continue
		case r == nil:
			bad("rule", "no rule is named %q", o.Rule)
			continue
		case r.tmpl == nil || !r.tmpl.fields:
			bad("rule", "rule %q has no key that comes from the payload: it limits one thing, so change its limit instead", o.Rule)
			continue
		case o.Key == "":
			bad("key", "missing; an override is for one key of the rule, e.g. key: b7")
			continue
		}
		var lim limits.Limit
		switch {
		case o.Tier != "":
			if lim = r.Tiers[o.Tier]; lim == nil {
				bad("tier", "rule %q has no plan %q%s", o.Rule, o.Tier, planList(r.Tiers))
				continue
			}
			// A Limit beside it must be the plan's (Overrides reports it so).
			same := o.Limit == nil
			if !same {
				given, _, msg := checkLimit(o.Rule, o.Limit)
				same = msg == "" && given == lim
			}
			if o.Unlimited || !same {
				bad("tier", "an override puts the key on a plan (tier), exempts it (unlimited) or gives it a limit: one of them")
				continue
			}
		case o.Unlimited && o.Limit != nil:
			bad("unlimited", "an override either exempts the key (unlimited) or gives it a limit (%s), not both", o.Limit)
			continue
		case o.Unlimited:
			if b := p.borrower(r); b != nil {
				bad("unlimited", "rule %q is the shared limit rule %q borrows from: its fair sharing gives the borrowed capacity back, so it cannot exempt a key", o.Rule, b.Name)
				continue
			}
		default:
			var f, msg string
			lim, f, msg = checkLimit(o.Rule, o.Limit)
			if msg == "" && !sameKind(lim, r.Limit) {
				f, msg = blockOf(lim), fmt.Sprintf("is %s; rule %q is %s, and an override keeps the kind of limit (the key's state carries over)", lim, o.Rule, r.Limit)
			}
			if msg != "" {
				bad(f, "%s", msg)
				continue
			}
		}
		k := [2]string{o.Rule, o.Key}
		if j, dup := seen[k]; dup {
			bad("key", "rule %q key %q is already overridden by overrides[%d]", o.Rule, o.Key, j)
			continue
		}
		seen[k] = i + 1
		out = append(out, Override{Rule: o.Rule, Key: o.Key, Limit: lim, Unlimited: o.Unlimited, Tier: o.Tier})
	}
	return out, errs
}

// planList is ": its plans are a, b" for tiers, or ": it has none".
func planList(tiers map[string]limits.Limit) string {
	if len(tiers) == 0 {
		return ": it has none"
	}
	return ": its plans are " + strings.Join(slices.Sorted(maps.Keys(tiers)), ", ")
}

// borrower returns a rule of p that borrows from r (r is its shared rule),
// or nil.
func (p *Policy) borrower(r *crule) *crule {
	for _, c := range p.rules {
		if c != nil && c.Borrow != 0 && sharedRule(p.rules, c) == r {
			return c
		}
	}
	return nil
}

// mergeOverrides returns base with each of more added, replacing an entry
// of the same rule and key.
func mergeOverrides(base, more []Override) []Override {
	for _, o := range more {
		i := 0
		for ; i < len(base); i++ {
			if base[i].Rule == o.Rule && base[i].Key == o.Key {
				break
			}
		}
		if i < len(base) {
			base[i] = o
		} else {
			base = append(base, o)
		}
	}
	return base
}

// rule returns p's rule named name, or nil.
func (p *Policy) rule(name string) *crule {
	if p == nil {
		return nil
	}
	for _, r := range p.rules {
		if r != nil && r.Name == name { // nil: a rule parsePolicy skipped
			return r
		}
	}
	return nil
}

// sameKind reports whether a and b are limits of one kind: one type, and
// for concurrency both adaptive or neither (an override or a plan keeps the
// kind of limit: the key's state carries over).
func sameKind(a, b limits.Limit) bool {
	ca, okA := a.(limits.Concurrency)
	cb, okB := b.(limits.Concurrency)
	if okA && okB {
		return ca.Adaptive == cb.Adaptive
	}
	return reflect.TypeOf(a) == reflect.TypeOf(b)
}

// blockOf names the policy file's block of a limit (gcra, quota, ...).
func blockOf(l limits.Limit) string {
	if c, ok := l.(limits.Concurrency); ok && c.Adaptive {
		return "adaptive_concurrency"
	}
	switch l.(type) {
	case limits.GCRA:
		return "gcra"
	case limits.Adaptive:
		return "adaptive"
	case limits.FixedWindow, limits.CalendarWindow:
		return "quota"
	case limits.SlidingWindow:
		return "sliding"
	}
	return "concurrency"
}

// ParseLimit parses one limit block in the policy file's syntax, such as
//
//	gcra: {rate: 5, per: 1s, burst: 2}
//
// or quota: {...}, sliding: {...}, concurrency: {...}, adaptive: {...},
// adaptive_concurrency: {...} (see Parse), and validates it. Errors name the field, e.g.
// `policy: line 1: gcra.rate: must be a positive number, got -1`.
func ParseLimit(yaml []byte) (limits.Limit, error) {
	var b yamldoc.Block[limitsDoc]
	fe := yamldoc.Decode(yaml, "a limit such as gcra: {rate: 5, per: 1s}", &b)
	if fe == nil {
		r := &yamldoc.Reader{}
		if l := yamldoc.Must(r, "", 0, &b); l != nil {
			r.At("", b.Keys)
			if n := len(l.given(b.Keys)); n != 1 {
				r.Fail("", b.Line, "want exactly one limit block, got %d", n)
			} else if lim := l.read(r, b.Keys, ""); lim != nil {
				lim, field, msg := checkLimit("override", lim)
				if msg == "" {
					return lim, nil
				}
				r.Fail(field, r.Lines.Of(field), "%s", msg)
			}
		}
		fe = r.First
	}
	return nil, &Error{Line: fe.Line, Field: fe.Field, Msg: fe.Msg}
}

// overrideEntry is an entry of a policy file's overrides list.
type overrideEntry struct {
	Rule      yamldoc.Val[string]             `yaml:"rule"`
	Key       yamldoc.Val[yamldoc.ScalarText] `yaml:"key"`
	Unlimited yamldoc.Val[bool]               `yaml:"unlimited"`
	Tier      yamldoc.Val[string]             `yaml:"tier"`
	Limits    limitsDoc                       `yaml:",inline"`
}

// readOverrides reads the policy file's overrides list: entries
// {rule, key, <one limit block>}, with their lines.
func readOverrides(l *yamldoc.List[yamldoc.Block[overrideEntry]]) ([]Override, []yamldoc.Lines, errList) {
	var errs errList
	add := func(field string, fe *yamldoc.Problem) {
		errs.add(&Error{Line: fe.Line, Field: yamldoc.Join(field, fe.Field), Msg: fe.Msg})
	}
	r := &yamldoc.Reader{}
	es := yamldoc.Entries(r, "overrides", l, "a list such as - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}}")
	if r.First != nil {
		add("", r.First)
		return nil, nil, errs
	}
	var out []Override
	var at []yamldoc.Lines
	for i := range es {
		r := &yamldoc.Reader{Lines: yamldoc.Lines{"": l.At[i]}}
		o := readOverride(r, &es[i], l.At[i])
		if r.First != nil {
			add(fmt.Sprintf("overrides[%d]", i+1), r.First)
			continue
		}
		out, at = append(out, o), append(at, r.Lines)
	}
	return out, at, errs
}

// readOverride reads b, the entry at line of the overrides list.
func readOverride(r *yamldoc.Reader, b *yamldoc.Block[overrideEntry], line int) Override {
	var o Override
	od := yamldoc.Must(r, "", line, b)
	if od == nil {
		return o
	}
	r.At("", b.Keys)
	o.Rule, _ = yamldoc.Get(r, "rule", od.Rule)
	key, _ := yamldoc.Get(r, "key", od.Key)
	o.Key = string(key)
	o.Unlimited, _ = yamldoc.Get(r, "unlimited", od.Unlimited)
	if od.Unlimited.Set && !o.Unlimited {
		r.Fail("unlimited", r.Lines.Of("unlimited"), "false means nothing: leave it out, or give true to exempt the key from the rule")
		return o
	}
	o.Tier, _ = yamldoc.Get(r, "tier", od.Tier)
	given := len(od.Limits.given(b.Keys)) > 0
	switch {
	case o.Tier != "" && (given || o.Unlimited):
		r.Fail("tier", r.Lines.Of("tier"), "an override puts the key on a plan (tier), exempts it (unlimited) or gives it a limit: one of them")
	case o.Tier != "":
	case o.Unlimited && given:
		r.Fail("unlimited", r.Lines.Of("unlimited"), "an override either exempts the key (unlimited: true) or gives it a limit, not both")
	case o.Unlimited:
	default:
		o.Limit = od.Limits.read(r, b.Keys, "an override has exactly one limit")
		if o.Limit == nil {
			r.Fail("", b.Line, "no limit; add the key's own gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency, tier: PLAN to put it on one of the rule's plans, or unlimited: true to exempt it from the rule")
		}
	}
	return o
}

// Exempt reports whether rule i of b does not apply to the keys ForKeys
// was given: an Override with Unlimited exempts its key. Callers skip
// exempt rules (they are kept in Rules and Set so that positions match the
// Request's).
func (b *Binding) Exempt(i int) bool { return b.exempt != nil && b.exempt[i] }

// Transient reports whether b is a variant ForKeys built for one call and
// did not cache: what a caller derives from it is not worth caching either.
func (b *Binding) Transient() bool { return b.transient }

// maxVariants bounds the bindings with overrides applied that one binding
// caches; beyond it they are built for each task.
const maxVariants = 4096

// ForKeys returns b with the policy's overrides (Policy.WithOverrides) for
// keys (one per rule, as Request renders them) applied, or b itself when
// none applies. Variants are cached per combination of overridden keys, up
// to 4096 per binding; beyond that each call builds its own, which reports
// Transient. A nil *Binding returns nil. Plans a payload names (Rule.Tier)
// need ForPayload.
func (b *Binding) ForKeys(keys []string) *Binding { return b.variant(keys, nil) }

// ForPayload is ForKeys for a task with payload (keys are Request's for
// it): besides the overrides, a rule's key on a plan the payload names
// (Rule.Tier, one of Rule.Tiers) is decided at that plan's limit; an
// override of the key wins over its payload's plan. Without a rule that
// reads a plan from the payload it is ForKeys, and does not read payload.
func (b *Binding) ForPayload(keys []string, payload []byte) *Binding {
	if b == nil || !b.tiered {
		return b.ForKeys(keys)
	}
	plans := make([]string, len(b.rules))
	obj, err := decodeObject(payload)
	for j, r := range b.rules {
		if r.ttmpl == nil || err != nil {
			continue
		}
		if p, perr := r.ttmpl.render(obj); perr == nil && r.Tiers[p] != nil {
			plans[j] = p
		}
	}
	return b.variant(keys, plans)
}

// Plan returns the plan (one of Rules()[i]'s Tiers) that ForPayload read
// from the payload and applied to rule i, "" if none did (the payload names
// none, or an override of the key wins).
func (b *Binding) Plan(i int) string {
	if b == nil || b.plans == nil {
		return ""
	}
	return b.plans[i]
}

// variant returns b with the overrides for keys and, where none applies,
// the plans (a rule's Tiers entry, "" for none; nil: none) applied.
func (b *Binding) variant(keys, plans []string) *Binding {
	if b == nil || b.over == nil && plans == nil {
		return b
	}
	over := func(j int) (limits.Limit, bool) {
		if b.over == nil {
			return nil, false
		}
		l, ok := b.over[j][keys[j]]
		return l, ok
	}
	var sig strings.Builder
	for j := range b.rules {
		if _, ok := over(j); ok {
			sig.WriteString(strconv.Itoa(j))
			sig.WriteByte(0)
			sig.WriteString(keys[j])
			sig.WriteByte(0)
		} else if plans != nil && plans[j] != "" {
			sig.WriteString(strconv.Itoa(j))
			sig.WriteByte(1)
			sig.WriteString(plans[j])
			sig.WriteByte(0)
		}
	}
	if sig.Len() == 0 {
		return b
	}
	if v, ok := b.variants.Load(sig.String()); ok {
		return v.(*Binding)
	}
	v := &Binding{rules: append([]*crule(nil), b.rules...), payload: b.payload, costs: b.costs, critical: b.critical, throttle: b.throttle, levels: b.levels, prioritized: b.prioritized}
	qs := slices.Clone(b.set)
	for j := range b.rules {
		l, ok := over(j)
		switch {
		case ok && l == nil:
			// Unlimited: the rule stays in the set (positions are
			// kept) and is marked exempt.
			if v.exempt == nil {
				v.exempt = make([]bool, len(b.rules))
			}
			v.exempt[j] = true
			continue
		case !ok && plans != nil && plans[j] != "":
			l = b.rules[j].Raised(b.rules[j].Tiers[plans[j]])
			if v.plans == nil {
				v.plans = make([]string, len(b.rules))
			}
			v.plans[j] = plans[j]
		case !ok:
			continue
		}
		r := *b.rules[j]
		r.Limit = l
		// An override's or a plan's limit may have too small a burst to
		// prefetch.
		v.rules[j], qs[j].Limit, qs[j].Prefetch = &r, l, 0
	}
	v.set = qs
	if b.nvariants.Add(1) <= maxVariants {
		b.variants.Store(sig.String(), v)
	} else {
		v.transient = true
	}
	return v
}
