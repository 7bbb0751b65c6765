package taskrl

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml/ast"

	"github.com/taskrl/taskrl/quotas"
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
	Limit quotas.Limit
}

// WithOverrides returns a copy of p with overrides added: each replaces
// the limit of one key of a keyed rule, and replaces an override p already
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
func (p *Policy) checkOverrides(overrides []Override, at []lines) ([]Override, errList) {
	var errs errList
	out := make([]Override, 0, len(overrides))
	seen := map[[2]string]int{}
	for i, o := range overrides {
		var ls lines
		if at != nil {
			ls = at[i]
		}
		field := fmt.Sprintf("overrides[%d]", i+1)
		bad := func(f, format string, args ...any) {
			errs.add(&PolicyError{Line: ls.of(f), Field: join(field, f), Msg: fmt.Sprintf(format, args...)})
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
		lim, f, msg := checkLimit(o.Rule, o.Limit)
		if msg == "" && reflect.TypeOf(lim) != reflect.TypeOf(r.Limit) {
			f, msg = blockOf(lim), fmt.Sprintf("is %s; rule %q is %s, and an override keeps the kind of limit (the key's state carries over)", lim, o.Rule, r.Limit)
		}
		if msg != "" {
			bad(f, "%s", msg)
			continue
		}
		k := [2]string{o.Rule, o.Key}
		if j, dup := seen[k]; dup {
			bad("key", "rule %q key %q is already overridden by overrides[%d]", o.Rule, o.Key, j)
			continue
		}
		seen[k] = i + 1
		out = append(out, Override{Rule: o.Rule, Key: o.Key, Limit: lim})
	}
	return out, errs
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
		if r.Name == name {
			return r
		}
	}
	return nil
}

// blockOf names the policy file's block of a limit (gcra, quota, ...).
func blockOf(l quotas.Limit) string {
	switch l.(type) {
	case quotas.GCRA:
		return "gcra"
	case quotas.Adaptive:
		return "adaptive"
	case quotas.FixedWindow, quotas.CalendarWindow:
		return "quota"
	case quotas.SlidingWindow:
		return "sliding"
	}
	return "concurrency"
}

// ParseLimit parses one limit block in the policy file's syntax, such as
//
//	gcra: {rate: 5, per: 1s, burst: 2}
//
// or quota: {...}, sliding: {...}, concurrency: {...}, adaptive: {...}
// (see ParsePolicy), and validates it. Errors name the field, e.g.
// `policy: line 1: gcra.rate: must be a positive number, got -1`.
func ParseLimit(yaml []byte) (quotas.Limit, error) {
	d, body, fe := parseDoc(yaml, "a limit such as gcra: {rate: 5, per: 1s}")
	if fe == nil {
		var es []entry
		if es, fe = d.mapping(body, "", 0); fe == nil {
			if fe = known(es, "", "gcra", "adaptive", "quota", "sliding", "concurrency"); fe == nil && len(es) != 1 {
				fe = fail(body, "", "want exactly one limit block, got %d", len(es))
			}
			if fe == nil {
				ls := lines{}
				var l quotas.Limit
				if l, fe = d.limit(es[0].key, es[0].val, ls); fe == nil {
					lim, field, msg := checkLimit("override", l)
					if msg == "" {
						return lim, nil
					}
					fe = &ferr{field: field, line: ls.of(field), msg: msg}
				}
			}
		}
	}
	return nil, &PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg}
}

// overrides reads the policy file's overrides list: entries
// {rule, key, <one limit block>}, with their lines.
func (d *yamlDoc) overrides(n ast.Node) ([]Override, []lines, errList) {
	var errs errList
	on, fe := d.resolve(n, "overrides")
	if fe == nil {
		if _, ok := on.(*ast.NullNode); ok {
			return nil, nil, nil
		}
		if _, ok := on.(*ast.SequenceNode); !ok {
			fe = fail(on, "overrides", "must be a list such as - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}}, got %s", kindOf(on))
		}
	}
	if fe != nil {
		errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
		return nil, nil, errs
	}
	var out []Override
	var at []lines
	for i, en := range on.(*ast.SequenceNode).Values {
		field := fmt.Sprintf("overrides[%d]", i+1)
		ls := lines{"": lineOf(en)}
		o, fe := d.override(en, ls)
		if fe != nil {
			if fe.field != "" {
				field += "." + fe.field
			}
			errs.add(&PolicyError{Line: fe.line, Field: field, Msg: fe.msg})
			continue
		}
		out, at = append(out, o), append(at, ls)
	}
	return out, at, errs
}

// override reads one entry of the overrides list.
func (d *yamlDoc) override(n ast.Node, ls lines) (Override, *ferr) {
	var o Override
	es, fe := d.mapping(n, "", 0)
	if fe != nil {
		return o, fe
	}
	if fe := known(es, "", "rule", "key", "gcra", "adaptive", "quota", "sliding", "concurrency"); fe != nil {
		return o, fe
	}
	var block string
	for _, e := range es {
		ls[e.key] = lineOf(e.knode)
		var fe *ferr
		switch e.key {
		case "rule":
			o.Rule, _, fe = d.str(e.val, "rule")
		case "key":
			o.Key, _, fe = d.keyString(e.val, "key")
		default:
			if block != "" {
				return o, fail(e.knode, "", "has both %s and %s; an override has exactly one limit", block, e.key)
			}
			block = e.key
			o.Limit, fe = d.limit(e.key, e.val, ls)
		}
		if fe != nil {
			return o, fe
		}
	}
	if block == "" {
		return o, fail(n, "", "no limit; add the key's own gcra, adaptive, quota, sliding or concurrency")
	}
	return o, nil
}

// keyString reads a key: a string, or a number or boolean as written
// (key: 42 is the key "42", as the template renders the number 42).
func (d *yamlDoc) keyString(n ast.Node, field string) (string, bool, *ferr) {
	v, ok, fe := d.scalarNode(n, field)
	if fe != nil || !ok {
		return "", ok, fe
	}
	switch v.(type) {
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return tokText(v), true, nil
	}
	return d.str(n, field)
}

// maxVariants bounds the bindings with overrides applied that one binding
// caches; beyond it they are built for each task.
const maxVariants = 4096

// forKeys returns b with the policy's overrides for keys (one per rule,
// as Request renders them) applied, or b itself when none applies.
// Variants are cached per combination of overridden keys.
func (b *Binding) forKeys(keys []string) *Binding {
	if b == nil || b.over == nil {
		return b
	}
	var sig strings.Builder
	for j, m := range b.over {
		if _, ok := m[keys[j]]; ok {
			sig.WriteString(strconv.Itoa(j))
			sig.WriteByte(0)
			sig.WriteString(keys[j])
			sig.WriteByte(0)
		}
	}
	if sig.Len() == 0 {
		return b
	}
	if v, ok := b.variants.Load(sig.String()); ok {
		return v.(*Binding)
	}
	v := &Binding{rules: append([]*crule(nil), b.rules...), payload: b.payload, costs: b.costs, critical: b.critical, throttle: b.throttle}
	qs := b.set.Rules()
	for j, m := range b.over {
		if l, ok := m[keys[j]]; ok {
			r := *b.rules[j]
			r.Limit = l
			// An override's limit may have too small a burst to prefetch.
			v.rules[j], qs[j].Limit, qs[j].Prefetch = &r, l, 0
		}
	}
	s, err := quotas.NewSet(qs...)
	if err != nil {
		panic("taskrl: internal error: " + err.Error()) // every override was validated with its rule
	}
	v.set = s
	if b.nvariants.Add(1) <= maxVariants {
		b.variants.Store(sig.String(), v)
	} else {
		v.transient = true
	}
	return v
}
