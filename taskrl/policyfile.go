package taskrl

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

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
// merge keys (<<) are allowed; tags and unknown fields are not.
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

// ferr is a problem at one YAML node, relative to the rule (or document)
// being read.
type ferr struct {
	field string
	line  int
	msg   string
}

func lineOf(n ast.Node) int {
	if m, ok := n.(*ast.MappingNode); ok && !m.IsFlowStyle && len(m.Values) > 0 {
		n = m.Values[0].Key
	}
	if n == nil || reflect.ValueOf(n).IsNil() {
		return 0
	}
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Line
	}
	return 0
}

func fail(n ast.Node, field, format string, args ...any) *ferr {
	return &ferr{field: field, line: lineOf(n), msg: fmt.Sprintf(format, args...)}
}

func join(field, key string) string {
	if field == "" {
		return key
	}
	return field + "." + key
}

// yamlDoc reads one parsed YAML document.
type yamlDoc struct {
	anchors map[string][]ast.Node // anchor nodes by name, in document order
}

type anchorVisitor struct{ d *yamlDoc }

func (v anchorVisitor) Visit(n ast.Node) ast.Visitor {
	if a, ok := n.(*ast.AnchorNode); ok && a.Name != nil {
		name := tokText(a.Name)
		v.d.anchors[name] = append(v.d.anchors[name], a)
	}
	return v
}

// tokText returns the source text of n's token, or "".
func tokText(n ast.Node) string {
	if n == nil || reflect.ValueOf(n).IsNil() {
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

func offsetOf(n ast.Node) int {
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Offset
	}
	return 0
}

// resolve follows anchors and aliases to the node they stand for.
func (d *yamlDoc) resolve(n ast.Node, field string) (ast.Node, *ferr) {
	for range 64 {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.MappingKeyNode:
			n = v.Value
		case *ast.AliasNode:
			name := ""
			if v.Value != nil {
				name = tokText(v.Value)
			}
			var target ast.Node
			for _, a := range d.anchors[name] {
				if offsetOf(a) < offsetOf(v) {
					target = a
				}
			}
			if target == nil {
				return nil, fail(v, field, "alias *%s refers to no anchor defined before it", name)
			}
			n = target
		case *ast.TagNode:
			return nil, fail(v, field, "YAML tags (%s) are not supported", tokText(v))
		case nil:
			return nil, &ferr{field: field, msg: "missing value"}
		default:
			return n, nil
		}
	}
	return nil, fail(n, field, "aliases nested too deep")
}

// kindOf names a resolved node's kind for messages.
func kindOf(n ast.Node) string {
	switch v := n.(type) {
	case *ast.MappingNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.StringNode:
		return fmt.Sprintf("the string %q", v.Value)
	case *ast.LiteralNode:
		return "a block string"
	case *ast.IntegerNode:
		return "the integer " + tokText(v)
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "the number " + tokText(n)
	case *ast.BoolNode:
		return "the boolean " + tokText(v)
	case *ast.NullNode:
		return "null (an empty value)"
	}
	return n.Type().String()
}

// entry is one key of a mapping.
type entry struct {
	key   string
	knode ast.Node
	val   ast.Node
}

// mapping returns the entries of a mapping node, merge keys expanded.
func (d *yamlDoc) mapping(n ast.Node, field string, depth int) ([]entry, *ferr) {
	n, fe := d.resolve(n, field)
	if fe != nil {
		return nil, fe
	}
	m, ok := n.(*ast.MappingNode)
	if !ok {
		return nil, fail(n, field, "must be a mapping, got %s", kindOf(n))
	}
	if depth > 8 {
		return nil, fail(n, field, "merge keys (<<) nested too deep")
	}
	var out, merged []entry
	seen := map[string]bool{}
	for _, mv := range m.Values {
		if _, ok := mv.Key.(*ast.MergeKeyNode); ok {
			src, fe := d.resolve(mv.Value, field)
			if fe != nil {
				return nil, fe
			}
			srcs := []ast.Node{src}
			if seq, ok := src.(*ast.SequenceNode); ok {
				srcs = seq.Values
			}
			for _, s := range srcs {
				es, fe := d.mapping(s, field, depth+1)
				if fe != nil {
					return nil, fe
				}
				merged = append(merged, es...)
			}
			continue
		}
		k, fe := d.resolve(mv.Key, field)
		if fe != nil {
			return nil, fe
		}
		ks, ok := k.(*ast.StringNode)
		if !ok {
			return nil, fail(k, field, "keys must be field names, got %s", kindOf(k))
		}
		seen[ks.Value] = true
		out = append(out, entry{key: ks.Value, knode: ks, val: mv.Value})
	}
	for _, e := range merged {
		if !seen[e.key] {
			seen[e.key] = true
			out = append(out, e)
		}
	}
	return out, nil
}

// known checks that every entry's key is one of allowed.
func known(es []entry, field string, allowed ...string) *ferr {
	for _, e := range es {
		if !slices.Contains(allowed, e.key) {
			return fail(e.knode, join(field, e.key), "unknown field; expected %s", orList(allowed))
		}
	}
	return nil
}

func orList(s []string) string {
	switch len(s) {
	case 1:
		return s[0]
	case 2:
		return s[0] + " or " + s[1]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// scalar reads a scalar node; null reads as absent.
func (d *yamlDoc) scalarNode(n ast.Node, field string) (ast.Node, bool, *ferr) {
	n, fe := d.resolve(n, field)
	if fe != nil {
		return nil, false, fe
	}
	if _, ok := n.(*ast.NullNode); ok {
		return n, false, nil
	}
	return n, true, nil
}

func (d *yamlDoc) str(n ast.Node, field string) (string, bool, *ferr) {
	n, ok, fe := d.scalarNode(n, field)
	if fe != nil || !ok {
		return "", false, fe
	}
	switch v := n.(type) {
	case *ast.StringNode:
		return v.Value, true, nil
	case *ast.LiteralNode:
		return v.Value.Value, true, nil
	case *ast.MappingNode, *ast.SequenceNode:
		return "", false, fail(n, field, "must be a string, got %s", kindOf(n))
	}
	return "", false, fail(n, field, "must be a string, got %s (quote it)", kindOf(n))
}

func (d *yamlDoc) number(n ast.Node, field string) (float64, bool, *ferr) {
	n, ok, fe := d.scalarNode(n, field)
	if fe != nil || !ok {
		return 0, false, fe
	}
	switch v := n.(type) {
	case *ast.IntegerNode:
		switch x := v.Value.(type) {
		case int64:
			return float64(x), true, nil
		case uint64:
			return float64(x), true, nil
		}
	case *ast.FloatNode:
		return v.Value, true, nil
	case *ast.InfinityNode, *ast.NanNode:
		return 0, false, fail(n, field, "must be a finite number, got %s", tokText(n))
	case *ast.StringNode:
		// The parser reads integers too large for int64 as plain strings.
		if tk := v.GetToken(); tk != nil && tk.Type == token.StringType {
			if f, err := strconv.ParseFloat(v.Value, 64); err == nil {
				return f, true, nil
			}
		}
	}
	return 0, false, fail(n, field, "must be a number, got %s", kindOf(n))
}

// maxInt bounds whole numbers: Redis scripts compute in doubles.
const maxInt = 1 << 53

func (d *yamlDoc) integer(n ast.Node, field string) (int, bool, *ferr) {
	f, ok, fe := d.number(n, field)
	if fe != nil || !ok {
		return 0, ok, fe
	}
	n, _, _ = d.scalarNode(n, field) // for its text
	if f > maxInt || f < -maxInt {
		return 0, false, fail(n, field, "out of range (at most %d in magnitude), got %s", int64(maxInt), tokText(n))
	}
	if f != float64(int64(f)) {
		return 0, false, fail(n, field, "must be a whole number, got %s", tokText(n))
	}
	return int(f), true, nil
}

func (d *yamlDoc) duration(n ast.Node, field string) (time.Duration, bool, *ferr) {
	r, ok, fe := d.scalarNode(n, field)
	if fe != nil || !ok {
		return 0, false, fe
	}
	var s string
	switch v := r.(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		return 0, false, fail(r, field, "%s needs a unit, e.g. %ss (Go duration syntax: ms, s, m, h)", tokText(r), tokText(r))
	case *ast.StringNode:
		s = v.Value
	default:
		return 0, false, fail(r, field, "must be a duration such as 1s, 10m or 24h, got %s", kindOf(r))
	}
	dur, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		if _, nerr := strconv.ParseFloat(strings.TrimSpace(s), 64); nerr == nil {
			return 0, false, fail(r, field, "%q needs a unit, e.g. %ss (Go duration syntax: ms, s, m, h)", s, strings.TrimSpace(s))
		}
		return 0, false, fail(r, field, "%q is not a duration; use Go syntax such as 500ms, 1s, 10m or 24h", s)
	}
	return dur, true, nil
}

// parsePolicy parses and validates a policy document.
func parsePolicy(data []byte) (*Policy, errList) {
	var errs errList
	top := func(fe *ferr) (*Policy, errList) {
		errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
		return nil, errs
	}
	d, body, fe := parseDoc(data, "a policy needs a rules list")
	if fe != nil {
		return top(fe)
	}
	es, fe := d.mapping(body, "", 0)
	if fe != nil {
		return top(fe)
	}
	if fe := known(es, "", "rules", "redis_unavailable", "critical", "throttle", "overrides", "http", "shed"); fe != nil {
		return top(fe)
	}
	var overrides []Override
	var overridesAt []lines
	mode := FailClosed
	var rulesNode ast.Node
	var critical []Match
	var throttle []string
	var throttleAt []int // line of each name
	var hosts []string
	var shed *Shed
	for _, e := range es {
		switch e.key {
		case "shed":
			var fe *ferr
			if shed, fe = d.shed(e.val); fe != nil {
				errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
			}
		case "http":
			var more errList
			hosts, more = d.http(e.val)
			errs = append(errs, more...)
		case "throttle":
			var fe *ferr
			throttle, throttleAt, fe = d.names(e.val, "throttle")
			if fe != nil {
				errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
			}
		case "critical":
			var more errList
			critical, more = d.critical(e.val)
			errs = append(errs, more...)
		case "overrides":
			var more errList
			overrides, overridesAt, more = d.overrides(e.val)
			errs = append(errs, more...)
		case "redis_unavailable":
			s, ok, fe := d.str(e.val, e.key)
			if fe == nil && ok {
				switch m := FailureMode(s); m {
				case FailOpen, FailClosed, FailLocal:
					mode = m
				default:
					fe = fail(e.val, e.key, "must be open, closed or local, got %q", s)
				}
			}
			if fe != nil {
				errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
			}
		case "rules":
			rulesNode = e.val
		}
	}
	if rulesNode == nil {
		errs.add(&PolicyError{Field: "rules", Msg: "missing; a policy needs a list of rules"})
		return nil, errs
	}
	rn, fe := d.resolve(rulesNode, "rules")
	if fe != nil {
		return top(fe)
	}
	if _, ok := rn.(*ast.NullNode); ok {
		return top(fail(rn, "rules", "empty; a policy needs at least one rule"))
	}
	seq, ok := rn.(*ast.SequenceNode)
	if !ok {
		return top(fail(rn, "rules", "must be a list of rules, got %s", kindOf(rn)))
	}
	if len(seq.Values) == 0 {
		return top(fail(rn, "rules", "empty; a policy needs at least one rule"))
	}
	rules := make([]Rule, len(seq.Values))
	pos := make([]lines, len(seq.Values))
	skip := make([]bool, len(seq.Values))
	for i, n := range seq.Values {
		r, ls, fe := d.rule(n)
		rules[i], pos[i] = r, ls
		if fe != nil {
			skip[i] = true
			e := &PolicyError{Line: fe.line, Index: i + 1, Field: fe.field, Msg: fe.msg}
			if checkName(r.Name) == nil {
				e.Rule = r.Name
			}
			errs.add(e)
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

// critical reads the top-level critical list: matchers like a rule's.
func (d *yamlDoc) critical(n ast.Node) ([]Match, errList) {
	var errs errList
	cn, fe := d.resolve(n, "critical")
	if fe == nil {
		if _, ok := cn.(*ast.NullNode); ok {
			return nil, nil
		}
		if _, ok := cn.(*ast.SequenceNode); !ok {
			fe = fail(cn, "critical", "must be a list of matchers such as - {queue: critical}, got %s", kindOf(cn))
		}
	}
	if fe != nil {
		errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
		return nil, errs
	}
	var out []Match
	for i, en := range cn.(*ast.SequenceNode).Values {
		field := criticalField(i, "")
		ls := lines{field: lineOf(en)}
		var m Match
		if fe := d.match(en, field, &m, ls); fe != nil {
			errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg})
			continue
		}
		if f, msg := checkMatch(m); msg != "" {
			f = criticalField(i, f)
			errs.add(&PolicyError{Line: ls.of(f), Field: f, Msg: msg})
			continue
		}
		out = append(out, m)
	}
	return out, errs
}

// shed reads the top-level shed section (see Shed) with its defaults;
// nil for an empty one.
func (d *yamlDoc) shed(n ast.Node) (*Shed, *ferr) {
	if v, fe := d.resolve(n, "shed"); fe == nil {
		if _, ok := v.(*ast.NullNode); ok {
			return nil, nil
		}
	}
	es, fe := d.mapping(n, "shed", 0)
	if fe == nil {
		fe = known(es, "shed", "signal", "above", "classes", "grace", "ramp", "window")
	}
	if fe != nil {
		return nil, fe
	}
	var s Shed
	at := map[string]ast.Node{"": n}
	for _, e := range es {
		f := "shed." + e.key
		at[e.key] = e.val
		var fe *ferr
		switch e.key {
		case "signal":
			var v string
			v, _, fe = d.str(e.val, f)
			s.Signal = ShedSignal(v)
		case "above":
			s.Above, _, fe = d.number(e.val, f)
		case "grace":
			s.Grace, _, fe = d.duration(e.val, f)
		case "ramp":
			s.Ramp, _, fe = d.duration(e.val, f)
		case "window":
			s.Window, _, fe = d.duration(e.val, f)
		case "classes":
			s.Classes, fe = d.classes(e.val)
		}
		if fe != nil {
			return nil, fe
		}
	}
	if f, msg := s.check(); msg != "" {
		key, _, _ := strings.Cut(f, "[")
		node := at[key]
		if node == nil {
			node = n
		}
		return nil, fail(node, "shed."+f, "%s", msg)
	}
	s = s.withDefaults()
	return &s, nil
}

// classes reads shed.classes: matchers like a rule's match, or bare queue
// names.
func (d *yamlDoc) classes(n ast.Node) ([]Match, *ferr) {
	ln, fe := d.resolve(n, "shed.classes")
	if fe != nil {
		return nil, fe
	}
	seq, ok := ln.(*ast.SequenceNode)
	if !ok {
		return nil, fail(ln, "shed.classes", "must be a list of classes, least important first, such as [{queue: bulk}, {queue: default}], got %s", kindOf(ln))
	}
	var out []Match
	for i, v := range seq.Values {
		f := fmt.Sprintf("shed.classes[%d]", i+1)
		var m Match
		if r, fe := d.resolve(v, f); fe == nil {
			if _, ok := r.(*ast.StringNode); ok {
				m.Queue, _, fe = d.str(r, f)
				out = append(out, m)
				continue
			}
		}
		if fe := d.match(v, f, &m, lines{}); fe != nil {
			return nil, fe
		}
		if mf, msg := checkMatch(m); msg != "" {
			return nil, fail(v, f+trimMatch(mf), "%s", msg)
		}
		out = append(out, m)
	}
	return out, nil
}

// http reads the top-level http section: allow_hosts, a list of host
// patterns (see Policy.WithAllowHosts), returned in canonical form.
func (d *yamlDoc) http(n ast.Node) ([]string, errList) {
	var errs errList
	add := func(fe *ferr) { errs.add(&PolicyError{Line: fe.line, Field: fe.field, Msg: fe.msg}) }
	es, fe := d.mapping(n, "http", 0)
	if fe == nil {
		fe = known(es, "http", "allow_hosts")
	}
	if fe != nil {
		add(fe)
		return nil, errs
	}
	var hosts []string
	for _, e := range es {
		ln, fe := d.resolve(e.val, "http.allow_hosts")
		if fe != nil {
			add(fe)
			continue
		}
		if _, ok := ln.(*ast.NullNode); ok {
			continue
		}
		seq, ok := ln.(*ast.SequenceNode)
		if !ok {
			add(fail(ln, "http.allow_hosts", "must be a list of hosts such as [api.example.com, \"*.example.net:443\"], got %s", kindOf(ln)))
			continue
		}
		for i, v := range seq.Values {
			f := fmt.Sprintf("http.allow_hosts[%d]", i+1)
			s, ok, fe := d.str(v, f)
			if fe == nil && !ok {
				fe = fail(v, f, "must be a host such as api.example.com")
			}
			if fe == nil {
				if pt, err := egress.ParsePattern(s); err != nil {
					fe = fail(v, f, "%v", err)
				} else {
					hosts = append(hosts, pt.String())
				}
			}
			if fe != nil {
				add(fe)
			}
		}
	}
	return hosts, errs
}

// names reads a list of rule names at field, with the line of each.
func (d *yamlDoc) names(n ast.Node, field string) (names []string, at []int, fe *ferr) {
	ln, fe := d.resolve(n, field)
	if fe != nil {
		return nil, nil, fe
	}
	if _, ok := ln.(*ast.NullNode); ok {
		return nil, nil, nil
	}
	seq, ok := ln.(*ast.SequenceNode)
	if !ok {
		return nil, nil, fail(ln, field, "must be a list of rule names such as [per-business], got %s", kindOf(ln))
	}
	for i, v := range seq.Values {
		f := fmt.Sprintf("%s[%d]", field, i+1)
		s, ok, fe := d.str(v, f)
		if fe != nil {
			return nil, nil, fe
		}
		if !ok || s == "" {
			return nil, nil, fail(v, f, "must be a rule name")
		}
		names, at = append(names, s), append(at, lineOf(v))
	}
	return names, at, nil
}

// parseDoc parses data as one YAML document and returns its body; want
// says what an empty document lacks.
func parseDoc(data []byte, want string) (*yamlDoc, ast.Node, *ferr) {
	f, fe := parseYAML(data)
	if fe != nil {
		return nil, nil, fe
	}
	var docs []*ast.DocumentNode
	for _, doc := range f.Docs {
		if doc != nil && doc.Body != nil {
			docs = append(docs, doc)
		}
	}
	switch {
	case len(docs) == 0:
		return nil, nil, &ferr{msg: "the document is empty; " + want}
	case len(docs) > 1:
		return nil, nil, &ferr{line: lineOf(docs[1]), msg: "more than one YAML document; want one"}
	}
	d := &yamlDoc{anchors: map[string][]ast.Node{}}
	ast.Walk(anchorVisitor{d}, docs[0].Body)
	return d, docs[0].Body, nil
}

// parseYAML parses data, turning the parser's errors (and, defensively,
// its panics) into a ferr.
func parseYAML(data []byte) (f *ast.File, fe *ferr) {
	defer func() {
		if r := recover(); r != nil {
			f, fe = nil, &ferr{msg: fmt.Sprintf("YAML: cannot parse the document: %v", r)}
		}
	}()
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		fe = &ferr{msg: "YAML: " + err.Error()}
		var ye yaml.Error
		if errors.As(err, &ye) {
			fe.msg = "YAML: " + ye.GetMessage()
			if tk := ye.GetToken(); tk != nil && tk.Position != nil {
				fe.line = tk.Position.Line
			}
		}
		return nil, fe
	}
	return f, nil
}

// rule reads one rule. It returns what it could read (the name at least,
// when there is one) even on error.
func (d *yamlDoc) rule(n ast.Node) (Rule, lines, *ferr) {
	var r Rule
	ls := lines{"": lineOf(n)}
	if rn, fe := d.resolve(n, ""); fe == nil {
		ls[""] = lineOf(rn)
	}
	es, fe := d.mapping(n, "", 0)
	if fe != nil {
		return r, ls, fe
	}
	for _, e := range es {
		if e.key == "name" {
			ls["name"] = lineOf(e.val)
			s, _, fe := d.str(e.val, "name")
			if fe != nil {
				return r, ls, fe
			}
			r.Name = s
		}
	}
	if fe := known(es, "", "name", "match", "key", "default_key", "fair", "mode", "soft", "borrow", "prefetch", "cost", "default_cost", "settle_header", "gcra", "adaptive", "quota", "sliding", "concurrency"); fe != nil {
		return r, ls, fe
	}
	var limitKey string
	for _, e := range es {
		ls[e.key] = lineOf(e.knode)
		var fe *ferr
		switch e.key {
		case "match":
			fe = d.match(e.val, "match", &r.Match, ls)
		case "key":
			r.Key, _, fe = d.str(e.val, "key")
		case "default_key":
			r.DefaultKey, _, fe = d.str(e.val, "default_key")
		case "fair":
			r.Fair, _, fe = d.str(e.val, "fair")
		case "cost":
			r.Cost, fe = d.cost(e.val, "cost")
		case "default_cost":
			r.DefaultCost, _, fe = d.integer(e.val, "default_cost")
		case "settle_header":
			r.SettleHeader, _, fe = d.str(e.val, "settle_header")
		case "soft":
			r.Soft, fe = d.share(e.val, "soft")
		case "borrow":
			r.Borrow, fe = d.borrow(e.val)
		case "prefetch":
			r.Prefetch, _, fe = d.duration(e.val, "prefetch")
		case "mode":
			var mode string
			if mode, _, fe = d.str(e.val, "mode"); fe == nil {
				switch mode {
				case "shadow":
					r.Shadow = true
				case "enforce", "":
				default:
					fe = fail(e.val, "mode", "must be enforce or shadow, got %q", mode)
				}
			}
		case "gcra", "adaptive", "quota", "sliding", "concurrency":
			if limitKey != "" {
				return r, ls, fail(e.knode, "", "has both %s and %s; a rule has exactly one limit", limitKey, e.key)
			}
			limitKey = e.key
			r.Limit, fe = d.limit(e.key, e.val, ls)
		}
		if fe != nil {
			return r, ls, fe
		}
	}
	return r, ls, nil
}

// cost reads a rule's cost: a template string ("{{.units}}") or a whole
// number (3), kept as text.
func (d *yamlDoc) cost(n ast.Node, field string) (string, *ferr) {
	if v, fe := d.resolve(n, field); fe == nil {
		if _, ok := v.(*ast.IntegerNode); ok {
			i, _, fe := d.integer(n, field)
			return strconv.Itoa(i), fe
		}
	}
	s, _, fe := d.str(n, field)
	return s, fe
}

// share reads a share: a number (0.1) or a percentage ("10%").
func (d *yamlDoc) share(n ast.Node, field string) (float64, *ferr) {
	if v, fe := d.resolve(n, field); fe == nil {
		if sn, ok := v.(*ast.StringNode); ok && strings.HasSuffix(sn.Value, "%") {
			f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(sn.Value, "%")), 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return 0, fail(n, field, "must be a share like 10%% or 0.1, got %q", sn.Value)
			}
			return f / 100, nil
		}
	}
	f, _, fe := d.number(n, field)
	return f, fe
}

// borrow reads a rule's borrow: true (up to the shared rule's rate),
// false, or a factor such as 2x (or 2).
func (d *yamlDoc) borrow(n ast.Node) (float64, *ferr) {
	if v, fe := d.resolve(n, "borrow"); fe == nil {
		switch v := v.(type) {
		case *ast.BoolNode:
			if v.Value {
				return math.Inf(1), nil
			}
			return 0, nil
		case *ast.StringNode:
			if f, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(v.Value, "x")), 64); err == nil && strings.HasSuffix(v.Value, "x") && !math.IsNaN(f) && !math.IsInf(f, 0) {
				return f, nil
			}
			return 0, fail(n, "borrow", "must be true, false or a factor like 2x, got %q", v.Value)
		}
	}
	f, _, fe := d.number(n, "borrow")
	return f, fe
}

// match reads a matcher at field ("match", or "critical[1]") into m.
func (d *yamlDoc) match(n ast.Node, field string, m *Match, ls lines) *ferr {
	if v, fe := d.resolve(n, field); fe == nil {
		if _, ok := v.(*ast.NullNode); ok {
			return nil // empty match: refused by checkMatch
		}
	}
	es, fe := d.mapping(n, field, 0)
	if fe != nil {
		return fe
	}
	if fe := known(es, field, "type", "queue"); fe != nil {
		return fe
	}
	for _, e := range es {
		f := field + "." + e.key
		ls[f] = lineOf(e.val)
		var fe *ferr
		switch e.key {
		case "type":
			m.Type, _, fe = d.str(e.val, f)
		case "queue":
			m.Queue, _, fe = d.str(e.val, f)
		}
		if fe != nil {
			return fe
		}
	}
	return nil
}

// limit reads one limit block.
func (d *yamlDoc) limit(block string, n ast.Node, ls lines) (quotas.Limit, *ferr) {
	es, fe := d.mapping(n, block, 0)
	if fe != nil {
		return nil, fe
	}
	fields := map[string][]string{
		"gcra":        {"rate", "per", "burst"},
		"adaptive":    {"max", "min", "start", "per", "burst"},
		"quota":       {"limit", "every", "cron", "tz"},
		"sliding":     {"limit", "every"},
		"concurrency": {"max", "lease", "reserved"},
	}[block]
	if fe := known(es, block, fields...); fe != nil {
		return nil, fe
	}
	var (
		num   = map[string]float64{}
		ints  = map[string]int{}
		durs  = map[string]time.Duration{}
		strs  = map[string]string{}
		given = map[string]bool{}
	)
	for _, e := range es {
		f := block + "." + e.key
		ls[f] = lineOf(e.val)
		var ok bool
		var fe *ferr
		switch {
		case e.key == "rate" || block == "adaptive" && (e.key == "max" || e.key == "min" || e.key == "start"):
			num[e.key], ok, fe = d.number(e.val, f)
		case e.key == "burst" || e.key == "limit" || e.key == "max" || e.key == "reserved":
			ints[e.key], ok, fe = d.integer(e.val, f)
		case e.key == "per" || e.key == "every" || e.key == "lease":
			durs[e.key], ok, fe = d.duration(e.val, f)
		case e.key == "cron" || e.key == "tz":
			strs[e.key], ok, fe = d.str(e.val, f)
		}
		if fe != nil {
			return nil, fe
		}
		given[e.key] = ok
	}
	need := func(keys ...string) *ferr {
		for _, k := range keys {
			if !given[k] {
				return fail(n, block+"."+k, "missing; %s needs %s", block, strings.Join(keys, " and "))
			}
		}
		return nil
	}
	switch block {
	case "gcra":
		if fe := need("rate", "per"); fe != nil {
			return nil, fe
		}
		burst := 1
		if given["burst"] {
			burst = ints["burst"]
		}
		return quotas.GCRA{Rate: num["rate"], Period: durs["per"], Burst: burst}, nil
	case "adaptive":
		if fe := need("max", "per"); fe != nil {
			return nil, fe
		}
		return quotas.Adaptive{Max: num["max"], Min: num["min"], Start: num["start"], Per: durs["per"], Burst: ints["burst"]}, nil
	case "quota":
		if fe := need("limit"); fe != nil {
			return nil, fe
		}
		switch {
		case given["every"] && given["cron"]:
			return nil, fail(n, block, "has both every and cron; use every for a fixed window or cron (with tz) for a calendar window")
		case given["every"] && given["tz"]:
			return nil, &ferr{field: "quota.tz", line: ls.of("quota.tz"), msg: "only allowed with cron (the calendar window's time zone)"}
		case given["every"]:
			return quotas.FixedWindow{Limit: ints["limit"], Every: durs["every"]}, nil
		case given["cron"]:
			return quotas.CalendarWindow{Limit: ints["limit"], Cron: strs["cron"], TZ: strs["tz"]}, nil
		case given["tz"]:
			return nil, &ferr{field: "quota.tz", line: ls.of("quota.tz"), msg: "only allowed with cron (the calendar window's time zone)"}
		}
		return nil, fail(n, block, "needs every (a fixed window, e.g. every: 10s) or cron (a calendar window, e.g. cron: \"0 0 * * *\")")
	case "sliding":
		if fe := need("limit", "every"); fe != nil {
			return nil, fe
		}
		return quotas.SlidingWindow{Limit: ints["limit"], Every: durs["every"]}, nil
	default: // concurrency
		if fe := need("max", "lease"); fe != nil {
			return nil, fe
		}
		return quotas.Concurrency{Max: ints["max"], Lease: durs["lease"], Reserved: ints["reserved"]}, nil
	}
}
