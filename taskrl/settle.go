package taskrl

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskrl/taskrl/policy"
)

// ErrNoCost is Settle's error when ctx is not the context of a task the
// middleware runs under a rule with a Cost: outside the middleware, for a
// task no rule with a Cost governs, or once the handler has returned.
var ErrNoCost = errors.New("taskrl: Settle: not in a task the middleware runs under a rule with a cost")

// settleKey is the context key of a task's *settlement.
type settleKey struct{}

// settlement is what a handler reports of its task's actual cost, per
// rate rule of the task (j.sp.rates), applied when the handler returns.
type settlement struct {
	mu     sync.Mutex
	costs  []int    // per rate rule: the cost charged; 0: the rule has no Cost
	rules  []string // per rate rule: its name
	actual []int    // per rate rule: the actual cost reported; -1: none
	done   bool     // the handler returned: too late to settle
}

// Settle reports the actual cost of the task whose handler calls it, in
// the units of the rules' Cost (policy.Rule.Cost), when it differs from the cost
// the task was charged (estimated from its payload): say the API reported
// what the call really cost. When the handler returns, successful or not
// (the call was made), the middleware gives the difference back to, or
// charges it to, every rule of the task that has a Cost
// (quotas.Limiter.Settle): tasks that come after then run that much
// earlier or later. Rules without a Cost keep their charge of 1. actual 0
// means nothing was spent; a negative actual is an error. The last call
// counts. A task whose handler reports an upstream throttle (Throttled) is
// refunded whole instead.
//
// ctx must be the context the middleware passed to the handler, or one
// derived from it; otherwise, or for a task no rule with a Cost governs,
// Settle returns ErrNoCost and records nothing. Settle is safe for
// concurrent use.
func Settle(ctx context.Context, actual int) error {
	if actual < 0 {
		return fmt.Errorf("taskrl: Settle: the actual cost must not be negative, got %d", actual)
	}
	st, err := openSettlement(ctx)
	if err != nil {
		return err
	}
	defer st.mu.Unlock()
	for i, c := range st.costs {
		if c > 0 {
			st.actual[i] = actual
		}
	}
	return nil
}

// openSettlement returns the settlement of the task whose context ctx is,
// locked, or ErrNoCost when there is none or it has been applied.
func openSettlement(ctx context.Context) (*settlement, error) {
	st, _ := ctx.Value(settleKey{}).(*settlement)
	if st == nil {
		return nil, ErrNoCost
	}
	st.mu.Lock()
	if st.done {
		st.mu.Unlock()
		return nil, ErrNoCost
	}
	return st, nil
}

// SettleFromHeaders settles (see Settle) the task whose handler calls it
// from a response's headers: each of the task's rules with a Cost that
// headers names (rule name → header name, e.g. "vendor-points" →
// "X-Actual-Cost") takes the whole number (at least 0) its header
// carries, get(name) returning a header's value (http.Header.Get). A
// header that is absent leaves the rule's charge as it is; one that is not
// a whole number of at least 0 too, and is reported in the error, to be
// logged. It returns ErrNoCost as Settle does, and nil when headers names
// no rule of the task. The worker binary's http:call handler calls it
// with the policy file's http.settle_headers. SettleFromHeaders is safe
// for concurrent use; it does not keep headers.
func SettleFromHeaders(ctx context.Context, headers map[string]string, get func(name string) string) error {
	st, err := openSettlement(ctx)
	if err != nil {
		return err
	}
	defer st.mu.Unlock()
	var bad []string
	for i, rule := range st.rules {
		h := headers[rule]
		if h == "" || st.costs[i] == 0 {
			continue
		}
		v := strings.TrimSpace(get(h))
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			bad = append(bad, fmt.Sprintf("%s: %q", h, v))
			continue
		}
		st.actual[i] = n
	}
	if len(bad) > 0 {
		return fmt.Errorf("taskrl: the estimate stands: not a whole number of at least 0: %s", strings.Join(bad, ", "))
	}
	return nil
}

// newSettlement returns the settlement of the job's rate rules, or nil
// when none has a Cost.
func (j *job) newSettlement(b *policy.Binding) *settlement {
	if j.rates.Costs == nil {
		return nil
	}
	st := &settlement{costs: make([]int, len(j.sp.rateIdx)), rules: make([]string, len(j.sp.rateIdx)), actual: make([]int, len(j.sp.rateIdx))}
	some := false
	for k, i := range j.sp.rateIdx {
		st.actual[k] = -1
		if r := b.Rule(i); r.Cost != "" {
			st.costs[k], st.rules[k] = j.rates.Costs[k], r.Name
			some = true
		}
	}
	if !some {
		return nil
	}
	return st
}

// settle applies what the handler reported to st (see Settle) to the
// charge the task ran under. A failure is logged: the estimate then
// stands.
func (j *job) settle(st *settlement) {
	st.mu.Lock()
	st.done = true
	actual := st.actual
	st.mu.Unlock()
	changed := false
	for k, a := range actual {
		changed = changed || a >= 0 && a != st.costs[k]
	}
	if !changed || !j.charge.Allowed {
		// Nothing reported, or nothing charged in Redis (fail open or
		// local).
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 5*time.Second)
	defer cancel()
	if err := j.m.limiter.Settle(ctx, j.sp.rates, j.rates, j.charge, actual); err != nil {
		j.m.cfg.Logger.Warn("taskrl: settling the task's actual cost failed; the estimate stands", "task", j.id, "err", err)
		return
	}
	j.observe(Event{Outcome: Settled})
}
