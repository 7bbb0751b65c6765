package taskrl

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/taskrl/taskrl/quotas"
)

// Rule is one named limit bound to tasks. A policy is a list of rules; a
// task is governed by every rule whose Match it satisfies, all decided
// together as one quotas.Set.
type Rule struct {
	// Name identifies the rule in keys, decisions, metrics and errors: 1-64
	// characters from [A-Za-z0-9_.-], unique within the policy. Required.
	Name string
	// Match selects the tasks the rule applies to; at least one of
	// Match.Type and Match.Queue must be set.
	Match Match
	// Key is a template over the task's JSON payload that names the entity
	// the rule limits, e.g. "{{.business_id}}", "{{.account.id}}" or
	// "tenant-{{.tenant}}-{{.region}}". Only field references and literal
	// text are allowed. "" (the default) means one global key for the rule.
	Key string
	// DefaultKey is the whole key used when the payload lacks a field that
	// Key references. "" (the default) means such a task is refused with a
	// *MissingFieldError. It requires a Key that references a field.
	DefaultKey string
	// Fair, a template like Key (e.g. "{{.business_id}}"), shares a GCRA
	// rule's capacity fairly among its values with work waiting
	// (quotas.Rule.Fair): a value alone gets all of it, and of N values
	// waiting each gets an equal share, however many tasks one of them
	// enqueued first. A payload without the field counts as the value "".
	// "" (the default) means first come, first served. Only a GCRA rule
	// can be fair.
	Fair string
	// Limit is the rule's limit, exactly one of quotas.GCRA,
	// quotas.FixedWindow, quotas.CalendarWindow, quotas.SlidingWindow or
	// quotas.Concurrency (a pointer to one is accepted and copied). Required.
	Limit quotas.Limit
}

// Match selects tasks by type and queue. A task matches when both set
// fields match; the zero Match matches nothing and is refused by NewPolicy.
type Match struct {
	// Type is a task type pattern in path.Match syntax: "http:call",
	// "http:*", "email:[ab]*". As in path.Match, '*' does not match '/'.
	// "" (the default) matches any type.
	Type string
	// Queue is a queue name, matched exactly. "" (the default) matches any
	// queue.
	Queue string
}

// matches reports whether m selects a task of type taskType on queue.
func (m Match) matches(taskType, queue string) bool {
	if m.Queue != "" && m.Queue != queue {
		return false
	}
	if m.Type == "" {
		return true
	}
	ok, _ := path.Match(m.Type, taskType) // the pattern was checked when the policy was built
	return ok
}

// FailureMode says what the worker does with a task when Redis cannot be
// reached to decide on it.
type FailureMode string

const (
	// FailOpen runs the task without a decision: limits are not enforced
	// while Redis is down.
	FailOpen FailureMode = "open"
	// FailClosed holds the task in the worker until Redis is back; nothing
	// runs unchecked. It is the default.
	FailClosed FailureMode = "closed"
	// FailLocal decides with a per-process in-memory fallback while Redis
	// is down, so each process enforces the limits on its own.
	FailLocal FailureMode = "local"
)

// maxBindings bounds the number of (task type, queue) pairs a Policy
// caches; beyond it Bind still works but computes the binding each time.
const maxBindings = 4096

// Policy is a validated, compiled list of rules. Build it with NewPolicy,
// ParsePolicy or LoadPolicyFile. A Policy is immutable and safe for
// concurrent use by multiple goroutines. The zero Policy (and a nil
// *Policy) has no rules: Bind returns nil for every task, and
// FailureMode returns FailClosed.
type Policy struct {
	rules    []*crule
	mode     FailureMode
	critical []Match

	mu      sync.RWMutex
	bound   map[bindKey]*Binding // nil values: no rule matches
	subsets map[string]*Binding  // by the indices of the rules bound
}

type bindKey struct{ taskType, queue string }

// crule is a validated rule with its compiled key and fair templates.
type crule struct {
	Rule
	tmpl  *keyTemplate // nil when Key == ""
	ftmpl *keyTemplate // nil when Fair == ""
}

// NewPolicy validates rules and returns a Policy that fails closed when
// Redis is unavailable (see WithFailureMode). Errors name the rule, the
// field (with the names of the YAML format: gcra.rate, quota.every,
// match.type, ...) and what is wrong, e.g.
//
//	policy: rule "per-business": gcra.rate: must be a positive number, got -1
//
// All rules are reported, one line each; on any error the Policy is nil.
func NewPolicy(rules ...Rule) (*Policy, error) {
	p, errs := buildPolicy(rules, nil, nil, FailClosed)
	if err := errs.err(); err != nil {
		return nil, err
	}
	return p, nil
}

// with returns a copy of p (which may be nil) with an empty binding cache.
func (p *Policy) with() *Policy {
	if p == nil {
		return &Policy{}
	}
	return &Policy{rules: p.rules, mode: p.mode, critical: p.critical}
}

// WithFailureMode returns a copy of p that uses mode when Redis is
// unavailable. It fails for a mode other than FailOpen, FailClosed and
// FailLocal.
func (p *Policy) WithFailureMode(mode FailureMode) (*Policy, error) {
	switch mode {
	case FailOpen, FailClosed, FailLocal:
	default:
		return nil, &PolicyError{Field: "redis_unavailable", Msg: fmt.Sprintf("must be open, closed or local, got %q", mode)}
	}
	q := p.with()
	q.mode = mode
	return q, nil
}

// WithCritical returns a copy of p under which the tasks any of ms selects
// are critical (the policy file's critical list): they may use the slots a
// concurrency rule reserves (quotas.Concurrency.Reserved), which other
// tasks never take. Each Match needs a type pattern or a queue, as a
// rule's; the error names the entry (critical[1].type, ...) and what is
// wrong. No Match (the default) makes no task critical.
func (p *Policy) WithCritical(ms ...Match) (*Policy, error) {
	var errs errList
	for i, m := range ms {
		if field, msg := checkMatch(m); msg != "" {
			errs.add(&PolicyError{Field: criticalField(i, field), Msg: msg})
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	q := p.with()
	q.critical = slices.Clone(ms)
	return q, nil
}

// Critical returns a copy of the matchers that make a task critical.
func (p *Policy) Critical() []Match {
	if p == nil {
		return nil
	}
	return slices.Clone(p.critical)
}

// criticalField names field ("match", "match.type", ...) of the i-th
// (0-based) critical entry as the policy file does: critical[1].type.
func criticalField(i int, field string) string {
	return fmt.Sprintf("critical[%d]", i+1) + strings.TrimPrefix(field, "match")
}

// FailureMode returns the policy's failure mode: FailClosed unless
// the policy says otherwise.
func (p *Policy) FailureMode() FailureMode {
	if p == nil || p.mode == "" {
		return FailClosed
	}
	return p.mode
}

// Rules returns a copy of the policy's rules in order. Passing them to
// NewPolicy builds an equivalent policy.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.Rule
	}
	return out
}

// Bind returns the rules that apply to a task of type taskType on queue,
// in policy order, or nil when no rule matches. The result is cached per
// (type, queue), so a repeated call is one read-locked map lookup with no
// allocation; (type, queue) pairs governed by the same rules share one
// *Binding. Bind is safe for concurrent use; a nil *Policy binds nothing.
func (p *Policy) Bind(taskType, queue string) *Binding {
	if p == nil {
		return nil
	}
	k := bindKey{taskType, queue}
	p.mu.RLock()
	b, ok := p.bound[k]
	p.mu.RUnlock()
	if ok {
		return b
	}
	return p.bindSlow(k)
}

func (p *Policy) bindSlow(k bindKey) *Binding {
	var idx []int
	for i, r := range p.rules {
		if r.Match.matches(k.taskType, k.queue) {
			idx = append(idx, i)
		}
	}
	critical := slices.ContainsFunc(p.critical, func(m Match) bool { return m.matches(k.taskType, k.queue) })
	var id strings.Builder
	for _, i := range idx {
		id.WriteString(strconv.Itoa(i))
		id.WriteByte(',')
	}
	if critical {
		id.WriteByte('c')
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b, ok := p.bound[k]; ok {
		return b
	}
	var b *Binding
	if len(idx) > 0 {
		b = p.subsets[id.String()]
		if b == nil {
			b = newBinding(p.rules, idx)
			b.critical = critical
			if len(p.subsets) < maxBindings {
				if p.subsets == nil {
					p.subsets = map[string]*Binding{}
				}
				p.subsets[id.String()] = b
			}
		}
	}
	if len(p.bound) < maxBindings {
		if p.bound == nil {
			p.bound = map[bindKey]*Binding{}
		}
		p.bound[k] = b
	}
	return b
}

func newBinding(all []*crule, idx []int) *Binding {
	b := &Binding{rules: make([]*crule, len(idx))}
	qs := make([]quotas.Rule, len(idx))
	for j, i := range idx {
		r := all[i]
		b.rules[j] = r
		qs[j] = quotas.Rule{Name: r.Name, Limit: r.Limit, Fair: r.ftmpl != nil}
		b.payload = b.payload || (r.tmpl != nil && r.tmpl.fields)
	}
	s, err := quotas.NewSet(qs...)
	if err != nil {
		// Unreachable: every rule was validated by quotas and the names
		// are unique, so every subset is a valid set.
		panic("taskrl: internal error: " + err.Error())
	}
	b.set = s
	return b
}

// Binding is the rules of a policy that apply to one (task type, queue),
// as one quotas.Set, with the key templates that pick each rule's entity
// from a task's payload. Get it from Policy.Bind. A Binding is immutable
// and safe for concurrent use.
type Binding struct {
	set      *quotas.Set
	rules    []*crule
	payload  bool // some key template references a payload field
	critical bool
}

// Critical reports whether the policy's critical list selects the bound
// (task type, queue): such tasks may use reserved concurrency slots
// (quotas.Request.Critical). A nil *Binding is not critical.
func (b *Binding) Critical() bool {
	return b != nil && b.critical
}

// Set returns the bound rules, in policy order, as one quotas.Set to decide
// with a quotas.Limiter. A nil *Binding returns nil.
func (b *Binding) Set() *quotas.Set {
	if b == nil {
		return nil
	}
	return b.set
}

// Keys returns, for each rule of Set() in order, the entity key rendered
// from the task's JSON payload, or "" for a rule without a key template
// (its one global key): the value for quotas.Request.Keys. The payload is
// decoded at most once, and only if some rule's template references a
// field; so a binding of global rules accepts any payload.
//
// Field values render as follows: strings raw, numbers exactly as written
// (12345678901 stays 12345678901), booleans as true or false. A field that
// is absent makes the whole key the rule's DefaultKey, or, without one, a
// *MissingFieldError. A field that is null, an object or an array, and a
// payload that is not a JSON object, are errors naming the rule (and the
// field). A nil *Binding returns nil, nil.
func (b *Binding) Keys(payload []byte) ([]string, error) {
	if b == nil {
		return nil, nil
	}
	r, err := b.Request(payload)
	return r.Keys, err
}

// Request returns the quotas.Request a task with payload makes of Set():
// its Keys (see Keys), its Fair flows, rendered from the fair rules'
// templates like keys (a flow that cannot be rendered, for want of a field
// or an object, is ""), and Critical (see Critical). A nil *Binding
// returns the zero Request.
func (b *Binding) Request(payload []byte) (quotas.Request, error) {
	if b == nil {
		return quotas.Request{}, nil
	}
	req := quotas.Request{Keys: make([]string, len(b.rules)), Fair: make([]string, len(b.rules)), Critical: b.critical}
	var obj map[string]json.RawMessage
	var objErr error
	decoded := false
	object := func() (map[string]json.RawMessage, error) {
		if !decoded {
			obj, objErr = decodeObject(payload)
			decoded = true
		}
		return obj, objErr
	}
	for i, r := range b.rules {
		if t := r.ftmpl; t != nil {
			if !t.fields {
				req.Fair[i] = r.Fair
			} else if o, err := object(); err == nil {
				req.Fair[i], _ = t.render(o)
			}
		}
		switch {
		case r.tmpl == nil:
		case !r.tmpl.fields:
			req.Keys[i] = r.Key
		default:
			o, err := object()
			if err != nil {
				return quotas.Request{}, fmt.Errorf("taskrl: rule %q: payload is not a JSON object: %v", r.Name, err)
			}
			k, err := r.tmpl.render(o)
			var missing *MissingFieldError
			switch {
			case errors.As(err, &missing) && r.DefaultKey != "":
				k = r.DefaultKey
			case errors.As(err, &missing):
				missing.Rule = r.Name
				return quotas.Request{}, missing
			case err != nil:
				return quotas.Request{}, fmt.Errorf("taskrl: rule %q: %w", r.Name, err)
			}
			req.Keys[i] = k
		}
	}
	return req, nil
}

// MissingFieldError reports that a task's payload lacks a field a rule's
// key template needs and the rule has no DefaultKey.
type MissingFieldError struct {
	// Rule is the rule's name.
	Rule string
	// Field is the field's path in the payload, e.g. "business_id" or
	// "account.id".
	Field string
}

// Error returns e.g. `taskrl: rule "per-business": payload has no field "business_id"`.
func (e *MissingFieldError) Error() string {
	return fmt.Sprintf("taskrl: rule %q: payload has no field %q", e.Rule, e.Field)
}

// decodeObject decodes a JSON object's top-level fields, leaving their
// values undecoded.
func decodeObject(payload []byte) (map[string]json.RawMessage, error) {
	t := bytes.TrimLeft(payload, " \t\r\n")
	if len(t) == 0 {
		return nil, errors.New("empty payload")
	}
	if t[0] != '{' {
		return nil, fmt.Errorf("payload is %s", jsonKind(t))
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	var m map[string]json.RawMessage
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON object")
	}
	return m, nil
}

// jsonKind names the kind of the JSON value raw starts with.
func jsonKind(raw []byte) string {
	switch {
	case raw[0] == '{':
		return "an object"
	case raw[0] == '[':
		return "an array"
	case raw[0] == '"':
		return "a string"
	case bytes.HasPrefix(raw, []byte("null")):
		return "null"
	case bytes.HasPrefix(raw, []byte("true")), bytes.HasPrefix(raw, []byte("false")):
		return "a boolean"
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		return "a number"
	}
	return "not JSON"
}

// keyTemplate is a parsed key template: literal text and field references.
type keyTemplate struct {
	parts  []tmplPart
	fields bool // some part is a field reference
}

type tmplPart struct {
	lit   string
	path  []string // field reference when non-nil
	field string   // path joined with '.'
}

// parseKeyTemplate parses the subset of text/template syntax allowed in
// keys: literal text and {{.field}} / {{.a.b}} references.
func parseKeyTemplate(s string) (*keyTemplate, error) {
	t := &keyTemplate{}
	rest := s
	for rest != "" {
		open := strings.Index(rest, "{{")
		if cl := strings.Index(rest, "}}"); cl >= 0 && (open < 0 || cl < open) {
			return nil, fmt.Errorf(`%q: "}}" without "{{"`, s)
		}
		if open < 0 {
			t.parts = append(t.parts, tmplPart{lit: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, tmplPart{lit: rest[:open]})
		}
		rest = rest[open+2:]
		end := strings.Index(rest, "}}")
		if end < 0 {
			return nil, fmt.Errorf(`%q: unclosed "{{"`, s)
		}
		action := rest[:end]
		rest = rest[end+2:]
		p, err := parseFieldRef(action)
		if err != nil {
			if "{{"+action+"}}" == s {
				return nil, fmt.Errorf("%q: %v", s, err)
			}
			return nil, fmt.Errorf("%q: %q: %v", s, "{{"+action+"}}", err)
		}
		t.parts = append(t.parts, tmplPart{path: p, field: strings.Join(p, ".")})
		t.fields = true
	}
	return t, nil
}

const onlyFields = "only field references such as {{.business_id}} or {{.account.id}} are allowed"

func parseFieldRef(action string) ([]string, error) {
	if strings.HasPrefix(action, "-") || strings.HasSuffix(action, "-") {
		return nil, errors.New("trim markers are not allowed; " + onlyFields)
	}
	a := strings.Trim(action, " ")
	switch {
	case a == "":
		return nil, errors.New("empty action; " + onlyFields)
	case a == ".":
		return nil, errors.New("the whole payload cannot be a key; " + onlyFields)
	case a[0] != '.':
		return nil, errors.New(onlyFields)
	}
	segs := strings.Split(a[1:], ".")
	for _, seg := range segs {
		if !isIdent(seg) {
			return nil, errors.New(onlyFields)
		}
	}
	return segs, nil
}

// isIdent reports whether s is a text/template field name: a letter or '_'
// followed by letters, digits and '_'.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case i > 0 && c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// render renders t over a payload object. A missing field is reported as a
// *MissingFieldError without its Rule.
func (t *keyTemplate) render(obj map[string]json.RawMessage) (string, error) {
	var sb strings.Builder
	for _, p := range t.parts {
		if p.path == nil {
			sb.WriteString(p.lit)
			continue
		}
		v, err := lookup(obj, p)
		if err != nil {
			return "", err
		}
		sb.WriteString(v)
	}
	return sb.String(), nil
}

func lookup(obj map[string]json.RawMessage, p tmplPart) (string, error) {
	for i, name := range p.path {
		raw, ok := obj[name]
		if !ok {
			return "", &MissingFieldError{Field: p.field}
		}
		raw = bytes.TrimSpace(raw)
		if i == len(p.path)-1 {
			return scalar(raw, p.field)
		}
		sub := strings.Join(p.path[:i+1], ".")
		if len(raw) == 0 || raw[0] != '{' {
			return "", fmt.Errorf("payload field %q is %s, not an object, so %q cannot be read", sub, jsonKind(raw), p.field)
		}
		obj = nil
		if err := json.Unmarshal(raw, &obj); err != nil {
			return "", fmt.Errorf("payload field %q: %v", sub, err)
		}
	}
	return "", &MissingFieldError{Field: p.field} // unreachable: paths are non-empty
}

// scalar renders one JSON value as key text.
func scalar(raw json.RawMessage, field string) (string, error) {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("payload field %q: %v", field, err)
		}
		return s, nil
	case 't', 'f', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), nil // validated by the decoder: exact JSON text
	}
	return "", fmt.Errorf("payload field %q is %s; a key needs a string, number or boolean", field, jsonKind(raw))
}

// PolicyError is one thing wrong with a policy. Errors from NewPolicy,
// ParsePolicy and LoadPolicyFile are a *PolicyError or, when several rules
// are wrong, an errors.Join of them (one per line; errors.As finds the
// first).
type PolicyError struct {
	// File is the policy file's path; "" unless from LoadPolicyFile.
	File string
	// Line is the 1-based line in the YAML document; 0 when unknown
	// (NewPolicy, or an error about the whole document).
	Line int
	// Rule is the rule's name; "" when the rule has no valid name or the
	// error is not about one rule.
	Rule string
	// Index is the rule's 1-based position in the policy; 0 when the error
	// is not about one rule.
	Index int
	// Field is the YAML path of the field at fault, e.g. "gcra.rate",
	// "match.type", "redis_unavailable"; "" when the error is about the
	// rule or document as a whole.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error returns e.g.
// `policy: line 7: rule "per-business": gcra.rate: must be a positive number, got -1`.
func (e *PolicyError) Error() string {
	var sb strings.Builder
	sb.WriteString("policy")
	if e.File != "" {
		sb.WriteString(" " + e.File)
	}
	sb.WriteString(": ")
	if e.Line > 0 {
		sb.WriteString("line " + strconv.Itoa(e.Line) + ": ")
	}
	switch {
	case e.Rule != "":
		sb.WriteString("rule " + strconv.Quote(e.Rule) + ": ")
	case e.Index > 0:
		sb.WriteString("rule " + strconv.Itoa(e.Index) + ": ")
	}
	if e.Field != "" {
		sb.WriteString(e.Field + ": ")
	}
	sb.WriteString(e.Msg)
	return sb.String()
}

// maxErrors bounds how many problems one error reports.
const maxErrors = 20

// errList collects policy errors.
type errList []*PolicyError

func (l *errList) add(e *PolicyError) {
	if len(*l) < maxErrors {
		*l = append(*l, e)
	}
}

func (l errList) err() error {
	switch len(l) {
	case 0:
		return nil
	case 1:
		return l[0]
	}
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// lines maps a rule's field paths ("" for the rule itself) to YAML lines.
type lines map[string]int

func (ls lines) of(field string) int {
	if ls == nil {
		return 0
	}
	for f := field; ; {
		if n, ok := ls[f]; ok {
			return n
		}
		i := strings.LastIndexByte(f, '.')
		if i < 0 {
			if f == "" {
				return 0
			}
			f = ""
			continue
		}
		f = f[:i]
	}
}

// buildPolicy validates rules; pos, when not nil, holds each rule's YAML
// lines, and skip marks rules already reported (they are only checked for
// duplicate names).
func buildPolicy(rules []Rule, pos []lines, skip []bool, mode FailureMode) (*Policy, errList) {
	var errs errList
	if len(rules) == 0 {
		errs.add(&PolicyError{Field: "rules", Msg: "a policy needs at least one rule"})
		return nil, errs
	}
	p := &Policy{mode: mode, rules: make([]*crule, len(rules))}
	seen := map[string]int{}
	for i, r := range rules {
		var ls lines
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
			e := &PolicyError{Line: ls.of(field), Index: i + 1, Field: field, Msg: msg}
			if checkName(r.Name) == nil {
				e.Rule = r.Name
			}
			errs.add(e)
			continue
		}
		if j, dup := seen[r.Name]; dup {
			errs.add(&PolicyError{Line: ls.of("name"), Index: i + 1, Field: "name", Msg: fmt.Sprintf("%q is already the name of rule %d", r.Name, j)})
			continue
		}
		seen[r.Name] = i + 1
		p.rules[i] = c
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return p, nil
}

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
	if r.Fair != "" {
		t, err := parseKeyTemplate(r.Fair)
		if err != nil {
			return nil, "fair", "bad template " + err.Error()
		}
		if _, ok := lim.(quotas.GCRA); !ok {
			return nil, "fair", "only a gcra rate can be shared fairly; this rule's limit is " + lim.String()
		}
		c.ftmpl = t
	}
	return c, "", ""
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
func checkName(name string) error {
	if name == "" {
		return errors.New("missing; every rule needs a name")
	}
	var re *quotas.RuleError
	if errors.As(quotas.Rule{Name: name}.Validate(), &re) && re.Field == "Rule.Name" {
		return errors.New(re.Reason)
	}
	return nil
}

// yamlFields maps the fields of quotas' limits (quotas.RuleError.Field) to
// their names in a policy's limit blocks.
var yamlFields = map[string]string{
	"Rate": "rate", "Period": "per", "Burst": "burst",
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
func checkLimit(name string, l quotas.Limit) (out quotas.Limit, field, msg string) {
	var block string
	switch v := l.(type) {
	case *quotas.GCRA:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *quotas.FixedWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *quotas.CalendarWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *quotas.SlidingWindow:
		if v != nil {
			return checkLimit(name, *v)
		}
	case *quotas.Concurrency:
		if v != nil {
			return checkLimit(name, *v)
		}
	case quotas.GCRA:
		block = "gcra"
	case quotas.FixedWindow, quotas.CalendarWindow:
		block = "quota"
	case quotas.SlidingWindow:
		block = "sliding"
	case quotas.Concurrency:
		block = "concurrency"
		if v.Lease < minLease {
			return nil, "concurrency.lease", fmt.Sprintf("must be at least %v, asynq's own task lease (a shorter one could free the slot of a task still running on a stalled worker), got %v", minLease, v.Lease)
		}
	}
	if block == "" {
		return nil, "", "no limit; add one of gcra, quota, sliding or concurrency"
	}
	err := quotas.Rule{Name: name, Limit: l}.Validate()
	if err == nil {
		return l, "", ""
	}
	var re *quotas.RuleError
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

// ParsePolicy parses a policy document in YAML:
//
//	redis_unavailable: closed            # optional: open | closed (default) | local
//	critical:                            # optional: see Policy.WithCritical
//	  - {queue: critical}                # matchers like a rule's match
//	rules:
//	  - name: vendor-peak                # required, unique
//	    match: {type: "http:*"}          # type (path.Match glob) and/or queue (exact)
//	    fair: "{{.business_id}}"         # optional, gcra only; see Rule.Fair
//	    gcra: {rate: 18, per: 1s, burst: 3}
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
//	    gcra: {rate: 1.8, per: 1s}
//	  - name: recent
//	    match: {queue: bulk}
//	    sliding: {limit: 100, every: 1m}
//	  - name: business-concurrency
//	    match: {type: "http:call"}
//	    key: "{{.business_id}}"
//	    concurrency: {max: 2, lease: 30s, reserved: 0}
//
// Each rule has exactly one limit:
//   - gcra: rate (a positive number, fractions allowed), per (a duration),
//     burst (a whole number, at least 1; default 1): quotas.GCRA;
//   - quota: limit and every (a duration): quotas.FixedWindow; or limit and
//     cron (a 5-field cron spec or a descriptor such as @daily) with an
//     optional tz (an IANA zone; default UTC): quotas.CalendarWindow;
//   - sliding: limit and every: quotas.SlidingWindow;
//   - concurrency: max, lease (a duration, at least 30s: asynq's own task
//     lease; the middleware renews it every third of it while the task runs)
//     and reserved (default 0): quotas.Concurrency.
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
	f, fe := parseYAML(data)
	if fe != nil {
		return top(fe)
	}
	var docs []*ast.DocumentNode
	for _, doc := range f.Docs {
		if doc != nil && doc.Body != nil {
			docs = append(docs, doc)
		}
	}
	switch {
	case len(docs) == 0:
		return top(&ferr{msg: "the document is empty; a policy needs a rules list"})
	case len(docs) > 1:
		return top(&ferr{line: lineOf(docs[1]), msg: "more than one YAML document; a policy is one document"})
	}
	d := &yamlDoc{anchors: map[string][]ast.Node{}}
	ast.Walk(anchorVisitor{d}, docs[0].Body)
	es, fe := d.mapping(docs[0].Body, "", 0)
	if fe != nil {
		return top(fe)
	}
	if fe := known(es, "", "rules", "redis_unavailable", "critical"); fe != nil {
		return top(fe)
	}
	mode := FailClosed
	var rulesNode ast.Node
	var critical []Match
	for _, e := range es {
		switch e.key {
		case "critical":
			var more errList
			critical, more = d.critical(e.val)
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
	if fe := known(es, "", "name", "match", "key", "default_key", "fair", "gcra", "quota", "sliding", "concurrency"); fe != nil {
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
		case "gcra", "quota", "sliding", "concurrency":
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
		switch e.key {
		case "rate":
			num[e.key], ok, fe = d.number(e.val, f)
		case "burst", "limit", "max", "reserved":
			ints[e.key], ok, fe = d.integer(e.val, f)
		case "per", "every", "lease":
			durs[e.key], ok, fe = d.duration(e.val, f)
		case "cron", "tz":
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
