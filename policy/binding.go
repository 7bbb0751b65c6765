package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/taskrl/taskrl/limits"
)

// Binding is the rules of a policy that apply to one (task type, queue),
// as the rules of one quotas.Set, with the key templates that pick each rule's entity
// from a task's payload. Get it from Policy.Bind. A Binding is immutable
// and safe for concurrent use.
type Binding struct {
	set      []limits.Rule // the rules as a set decides them: raised, overridden
	rules    []*crule
	payload  bool // some key template references a payload field
	costs    bool // some rule has a Cost
	critical bool
	throttle []bool // per rule: the policy's throttle list names it

	over      []map[string]limits.Limit // per rule: overridden keys; nil: none
	variants  sync.Map                  // ForKeys' cache: signature -> *Binding
	nvariants atomic.Int64
	transient bool     // a variant ForKeys did not cache (Transient)
	exempt    []bool   // per rule: exempt for the keys (Exempt); nil: none
	tiered    bool     // a rule reads a plan from the payload (Rule.Tier)
	plans     []string // per rule: the payload's plan applied (Plan); nil: none

	levels      []int // per rule: the level of a literal Priority, else the queue's (PriorityQueues), else 0
	prioritized bool  // a rule has priorities (Rule.Priority, Rule.PriorityQueues)
}

// Critical reports whether the policy's critical list selects the bound
// (task type, queue): such tasks may use reserved concurrency slots
// (limits.Request.Critical). A nil *Binding is not critical.
func (b *Binding) Critical() bool {
	return b != nil && b.critical
}

// Rules returns the bound rules, in policy order, as one quotas.Set
// decides them: soft rules raised (Rule.Raised), the policy's overrides
// of the binding applied. They always pass limits.Validate. A nil
// *Binding returns nil.
func (b *Binding) Rules() []limits.Rule {
	if b == nil {
		return nil
	}
	return slices.Clone(b.set)
}

// Keys returns, for each rule of Set() in order, the entity key rendered
// from the task's JSON payload, or "" for a rule without a key template
// (its one global key): the value for limits.Request.Keys. The payload is
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

// Request returns the limits.Request a task with payload makes of Set():
// its Keys (see Keys), its Fair flows, rendered from the fair rules'
// templates like keys (a flow that cannot be rendered, for want of a field
// or an object, is ""), when a fair rule has a FairWeight its Weights (see
// Rule.FairWeight), when a rule has priorities its Priorities (the
// payload's level, else the queue's, else 0: see Rule.Priority), Critical
// (see Critical) and, when a rule has a
// Cost, its Costs (1 for rules without one, and for a rule an unlimited
// override exempts the task's key from); a cost that is not a whole
// number of at least 1, or missing without a DefaultCost, is a *CostError.
// Costs are not checked against the limits here: see CheckCosts. A nil
// *Binding returns the zero Request.
func (b *Binding) Request(payload []byte) (limits.Request, error) {
	if b == nil {
		return limits.Request{}, nil
	}
	req := limits.Request{Keys: make([]string, len(b.rules)), Fair: make([]string, len(b.rules)), Critical: b.critical}
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
	if b.costs {
		req.Costs = make([]int, len(b.rules))
	}
	for i, r := range b.rules {
		if t := r.ftmpl; t != nil {
			if !t.fields {
				req.Fair[i] = r.Fair
			} else if o, err := object(); err == nil {
				req.Fair[i], _ = t.render(o)
			}
		}
		if b.prioritized {
			if req.Priorities == nil {
				req.Priorities = make([]int, len(b.rules))
			}
			req.Priorities[i] = b.levels[i]
			if r.ptmpl != nil {
				if p := r.renderLevel(object); p > 0 {
					req.Priorities[i] = p
				}
			}
		}
		if r.wtmpl != nil {
			if req.Weights == nil {
				req.Weights = make([]int, len(b.rules))
			}
			req.Weights[i] = r.renderWeight(object)
		}
		switch {
		case r.tmpl == nil:
		case !r.tmpl.fields:
			req.Keys[i] = r.Key
		default:
			o, err := object()
			if err != nil {
				return limits.Request{}, fmt.Errorf("taskrl: rule %q: payload is not a JSON object: %v", r.Name, err)
			}
			k, err := r.tmpl.render(o)
			var missing *MissingFieldError
			switch {
			case errors.As(err, &missing) && r.DefaultKey != "":
				k = r.DefaultKey
			case errors.As(err, &missing):
				missing.Rule = r.Name
				return limits.Request{}, missing
			case err != nil:
				return limits.Request{}, fmt.Errorf("taskrl: rule %q: %w", r.Name, err)
			}
			req.Keys[i] = k
		}
		if b.costs {
			n := 1 // a key exempt from the rule (unlimited) pays nothing
			if !b.exemptKey(i, req.Keys[i]) {
				var err error
				if n, err = r.renderCost(object); err != nil {
					return limits.Request{}, err
				}
			}
			req.Costs[i] = n
		}
	}
	return req, nil
}

// exemptKey reports whether an unlimited override exempts key from rule i.
func (b *Binding) exemptKey(i int, key string) bool {
	if b.over == nil {
		return false
	}
	l, ok := b.over[i][key]
	return ok && l == nil
}

// renderWeight returns the rule's fair weight for the payload object
// returns: its literal or its template's value, 1 when that is missing or
// not a whole number of at least 1, at most limits.MaxWeight.
func (r *crule) renderWeight(object func() (map[string]json.RawMessage, error)) int {
	v := r.FairWeight
	if r.wtmpl.fields {
		o, err := object()
		if err != nil {
			return 1
		}
		if v, err = r.wtmpl.render(o); err != nil {
			return 1
		}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 1
	}
	return min(n, limits.MaxWeight)
}

// renderLevel returns the rule's priority level rendered from the
// payload object returns, or 0 when the field is missing or not a whole
// number from 1 to limits.MaxPriority.
func (r *crule) renderLevel(object func() (map[string]json.RawMessage, error)) int {
	o, err := object()
	if err != nil {
		return 0
	}
	v, err := r.ptmpl.render(o)
	n, nerr := strconv.Atoi(v)
	if err != nil || nerr != nil || n < 1 || n > limits.MaxPriority {
		return 0
	}
	return n
}

// renderCost returns the rule's cost for the payload object returns: 1
// without a Cost, its literal, or its template's value.
func (r *crule) renderCost(object func() (map[string]json.RawMessage, error)) (int, error) {
	switch {
	case r.Cost == "":
		return 1, nil
	case r.ctmpl == nil:
		return r.cost, nil
	}
	o, err := object()
	if err != nil {
		return 0, fmt.Errorf("taskrl: rule %q: payload is not a JSON object: %v", r.Name, err)
	}
	v, err := r.ctmpl.render(o)
	var missing *MissingFieldError
	switch {
	case errors.As(err, &missing) && r.DefaultCost > 0:
		return r.DefaultCost, nil
	case errors.As(err, &missing):
		return 0, &CostError{Rule: r.Name, Field: missing.Field}
	case err != nil:
		return 0, &CostError{Rule: r.Name, Err: err}
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxCost {
		return 0, &CostError{Rule: r.Name, Value: v}
	}
	return n, nil
}

// maxCost bounds a task's cost: far above any limit's capacity, and exact
// in the scripts' doubles.
const maxCost = 1 << 31

// Rule returns the policy rule behind Rules()[i], as the policy has it
// (its Shadow, Cost and key templates).
func (b *Binding) Rule(i int) Rule { return b.rules[i].Rule }

// Throttled reports whether the policy's throttle list (Policy.Throttle)
// names Rules()[i].
func (b *Binding) Throttled(i int) bool { return b.throttle[i] }

// CheckCosts returns a *CostError for the first rule of Set(), shadow
// rules aside, whose cost in costs (Request.Costs) exceeds what the rule
// admits at once: a GCRA or adaptive burst, a window's limit (overrides
// and soft raises included, as the binding's set has them). Such a task
// can never pass. nil costs, and a nil *Binding, pass.
func (b *Binding) CheckCosts(costs []int) error {
	if b == nil || costs == nil {
		return nil
	}
	for i, r := range b.set {
		if b.rules[i].Shadow || b.Exempt(i) {
			continue
		}
		if err := CheckCost(r, costs[i]); err != nil {
			return err
		}
	}
	return nil
}

// CheckCost returns a *CostError if cost exceeds what r admits at once: a
// GCRA or adaptive burst, a window's limit; nil for a concurrency rule.
func CheckCost(r limits.Rule, cost int) error {
	if m := limits.Capacity(r.Limit); cost > m {
		return &CostError{Rule: r.Name, Value: strconv.Itoa(cost), Max: m, Measure: capacityName(r.Limit)}
	}
	return nil
}

// CostError reports that a task's cost under a rule (Rule.Cost) is not one
// the rule can charge: not a whole number of at least 1, missing from the
// payload without a DefaultCost, or above what the rule admits at once.
// The middleware archives such a task (asynq.SkipRetry), charging nothing.
type CostError struct {
	// Rule is the rule's name.
	Rule string
	// Value is the cost as the template rendered it; "" when Field is
	// missing from the payload.
	Value string
	// Field is the payload field the template needs, when it is missing.
	Field string
	// Max is, when the cost exceeds it, the most the rule admits at once;
	// Measure names it ("burst" or "limit"). 0 otherwise.
	Max     int
	Measure string
	// Err is why the template could not be rendered, if it could not
	// (a field that is an object, a payload that is not JSON).
	Err error
}

// Error says what is wrong, naming the rule, e.g.
// `taskrl: rule "points": cost 40 is above the rule's burst of 30: the task can never pass`.
func (e *CostError) Error() string {
	switch {
	case e.Max > 0:
		return fmt.Sprintf("taskrl: rule %q: cost %s is above the rule's %s of %d: the task can never pass", e.Rule, e.Value, e.Measure, e.Max)
	case e.Field != "":
		return fmt.Sprintf("taskrl: rule %q: cost: payload has no field %q and the rule has no default_cost", e.Rule, e.Field)
	case e.Err != nil:
		return fmt.Sprintf("taskrl: rule %q: cost: %v", e.Rule, e.Err)
	}
	return fmt.Sprintf("taskrl: rule %q: cost %q is not a whole number of at least 1", e.Rule, e.Value)
}

// Unwrap returns Err.
func (e *CostError) Unwrap() error { return e.Err }

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
