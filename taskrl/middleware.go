package taskrl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/quotas"
)

// Headers the middleware keeps on a rescheduled copy of a task.
const (
	// HeaderOrigin holds the ID of the task a copy was rescheduled from.
	HeaderOrigin = "taskrl-origin"
	// HeaderRound counts how often the task has been rescheduled.
	HeaderRound = "taskrl-round"
	// HeaderBooked holds the server time, in Unix microseconds, of the slot
	// booked for the copy: its rate and window rules are already charged.
	HeaderBooked = "taskrl-booked"
	// HeaderWaited holds how long, in microseconds, the task has been
	// rescheduled for in total, for Config.ThrottleBudget.
	HeaderWaited = "taskrl-waited"
	// HeaderCharge holds the receipt of the booked slot's charges
	// (quotas.Decision.Receipt), so that the worker that runs the copy can
	// refund them when the task does not happen in that slot.
	HeaderCharge = "taskrl-charge"
)

// Outcome says what the middleware did with a task.
type Outcome string

// Outcomes reported to an Observer.
const (
	// Admitted: the task runs now, at once or after a wait in the worker
	// (Event.Wait): by a decision made now, or in the slot booked for it
	// when it was rescheduled (then Event.Rules is empty). Every run of a
	// task a rule governs is preceded by one Admitted event.
	Admitted Outcome = "admitted"
	// Rescheduled: the task was rescheduled to run after Event.Wait,
	// booked for then when Event.Rule is empty, otherwise to decide again
	// then (Event.Rule denied it beyond Config.MaxReserve).
	Rescheduled Outcome = "rescheduled"
	// Refused: the task is archived: no wait can admit it (its cost
	// exceeds Event.Rule's burst or limit), its payload lacks a key field,
	// or waiting Event.Wait more would spend Config.ThrottleBudget.
	Refused Outcome = "refused"
	// UpstreamThrottled: the handler reported an upstream 429; the task's
	// rules are blocked for Event.Wait.
	UpstreamThrottled Outcome = "upstream_throttled"
	// Unlimited: Redis was unreachable and the policy fails open.
	Unlimited Outcome = "unlimited"
	// Local: Redis was unreachable and the task waited for its turn in this
	// process (policy fail local).
	Local Outcome = "local"
	// RedisError: a call to Redis failed (Event.Err); reported once per
	// failed call, beside the task's final outcome.
	RedisError Outcome = "redis_error"
)

// Event is one report to an Observer.
type Event struct {
	// TaskType and Queue identify the task.
	TaskType, Queue string
	// Outcome is what happened.
	Outcome Outcome
	// Rule is the rule that made the task wait, if one did.
	Rule string
	// Wait is how long the task waited in the worker (Admitted), was
	// rescheduled for (Rescheduled) or blocked its rules for
	// (UpstreamThrottled).
	Wait time.Duration
	// Rules is the state of the task's rate and window rules after its
	// decision, when one was made: used, remaining, reset per rule.
	Rules []quotas.RuleStatus
	// Err is the Redis error of a RedisError event.
	Err error
}

// Observer receives an Event per decision, for metrics and logs. It is
// called on worker goroutines and must be safe for concurrent use and
// quick.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

func (m *Middleware) observe(t *asynq.Task, queue string, e Event) {
	if m.cfg.Observer == nil {
		return
	}
	e.TaskType, e.Queue = t.Type(), queue
	m.cfg.Observer.Observe(e)
}

// lateBooking is how far past its slot a booked copy may start; a later one
// decides again.
const lateBooking = 25 * time.Millisecond

// Config configures a Middleware.
type Config struct {
	// Policy says which rules apply to which tasks. Required.
	Policy *Policy
	// Client is the Redis that holds the limits and the asynq queues the
	// middleware reschedules tasks into. Required.
	Client redis.UniversalClient
	// Prefix starts every limiter key. Default "taskrl:".
	Prefix string
	// MaxHold is the longest a task waits for its turn inside the worker;
	// longer waits book a slot and reschedule the task to it, which frees
	// the worker. Default 500ms.
	MaxHold time.Duration
	// MaxReserve is how far ahead a slot may be booked for a rescheduled
	// task. Default 1h; a task whose turn is further away is rescheduled
	// unbooked to when it would be allowed and decides again then.
	MaxReserve time.Duration
	// ThrottleBudget, if positive, is the longest a task may wait for its
	// limits in all: a task that would wait longer is archived with a
	// reason naming the budget (a stale task is not worth running late,
	// say a one-time code). Default 0: no budget.
	ThrottleBudget time.Duration
	// LocalShare is how many worker processes share the limits, for the
	// FailLocal policy mode: while Redis is unreachable each process
	// enforces every GCRA rule at 1/LocalShare of its rate, in memory.
	// Default 1.
	LocalShare int
	// Logger receives a line per rescheduled task. Default slog.Default().
	Logger *slog.Logger
	// Observer, if set, receives an Event per decision (see Outcome).
	Observer Observer
}

// Middleware makes asynq tasks respect the rules of a Policy across every
// worker process that shares the Redis. Build one with New; it is safe for
// concurrent use.
type Middleware struct {
	cfg     Config
	local   gcra.Model   // the FailLocal fallback
	down    atomic.Int64 // until when (Unix ns) Redis counts as unreachable
	prefix  string
	pace    *pacer
	limiter *quotas.Limiter
	client  *asynq.Client
	inspect *asynq.Inspector
	splits  sync.Map // *Binding -> *split
	// skew is the last seen server time minus local time, µs.
	skew atomic.Int64
}

// New validates cfg and returns a Middleware.
func New(cfg Config) (*Middleware, error) {
	if cfg.Policy == nil {
		return nil, errors.New("taskrl: Config.Policy is required")
	}
	if cfg.Client == nil {
		return nil, errors.New("taskrl: Config.Client is required")
	}
	if cfg.MaxHold == 0 {
		cfg.MaxHold = 500 * time.Millisecond
	}
	if cfg.MaxReserve == 0 {
		cfg.MaxReserve = time.Hour
	}
	if cfg.MaxHold < 0 || cfg.MaxReserve < 0 {
		return nil, errors.New("taskrl: Config.MaxHold and MaxReserve must not be negative")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LocalShare < 0 {
		return nil, errors.New("taskrl: Config.LocalShare must not be negative")
	}
	cfg.LocalShare = max(cfg.LocalShare, 1)
	if cfg.Prefix == "" {
		cfg.Prefix = gcra.DefaultPrefix
	}
	l, err := quotas.New(quotas.Config{Client: cfg.Client, Prefix: cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("taskrl: %w", err)
	}
	m := &Middleware{cfg: cfg, prefix: cfg.Prefix, limiter: l, client: asynq.NewClientFromRedisClient(cfg.Client), inspect: asynq.NewInspectorFromRedisClient(cfg.Client)}
	m.pace = newPacer(m)
	return m, nil
}

// Close stops the middleware's pacer. Call it after the asynq server has
// shut down; rescheduled tasks then still run, up to a few seconds late.
func (m *Middleware) Close() error {
	m.pace.close()
	return nil
}

// split is a binding's rules in two sets: the rate and window rules, which
// are booked ahead, and the concurrency rules, taken when the task runs.
type split struct {
	rates, slots     *quotas.Set
	rateIdx, slotIdx []int // positions in the binding's set
	critical         bool  // the binding's tasks may use reserved slots
	fair             bool  // a rate rule is fair
}

func (m *Middleware) split(b *Binding) (*split, error) {
	if v, ok := m.splits.Load(b); ok {
		return v.(*split), nil
	}
	sp := &split{critical: b.Critical()}
	var rates, slots []quotas.Rule
	for i, r := range b.Set().Rules() {
		if _, ok := r.Limit.(quotas.Concurrency); ok {
			slots, sp.slotIdx = append(slots, r), append(sp.slotIdx, i)
		} else {
			rates, sp.rateIdx = append(rates, r), append(sp.rateIdx, i)
			sp.fair = sp.fair || r.Fair
		}
	}
	var err error
	if len(rates) > 0 {
		if sp.rates, err = quotas.NewSet(rates...); err != nil {
			return nil, err
		}
	}
	if len(slots) > 0 {
		if sp.slots, err = quotas.NewSet(slots...); err != nil {
			return nil, err
		}
	}
	v, _ := m.splits.LoadOrStore(b, sp)
	return v.(*split), nil
}

func pick(keys []string, idx []int) []string {
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = keys[j]
	}
	return out
}

// Handler wraps next. Tasks no rule matches go straight to next, without a
// Redis call; if the remote side throttles one (Throttled), it is
// rescheduled too, so that it never spends a retry or is archived for it.
func (m *Middleware) Handler(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		queue, _ := asynq.GetQueueName(ctx)
		b := m.cfg.Policy.Bind(t.Type(), queue)
		if b == nil {
			err := next.ProcessTask(ctx, t)
			if te := (*ThrottledError)(nil); errors.As(err, &te) {
				return m.backOff(ctx, t, queue, te, nil, nil, quotas.Decision{})
			}
			return err
		}
		return m.process(ctx, t, queue, b, next)
	})
}

// Middleware returns the middleware for asynq.ServeMux.Use.
func (m *Middleware) Middleware() asynq.MiddlewareFunc { return m.Handler }

// ServerConfig returns cfg adjusted for paced tasks, and starts pacing its
// queues now rather than when a task of theirs is first rescheduled here:
//   - TaskCheckInterval at most 50ms (asynq's default is 1s): a copy the
//     pacer moves to pending at its slot is picked up within 50ms even by an
//     idle worker, which then checks its queues 20 times a second;
//   - DelayedTaskCheckInterval at most 1s (default 5s): a copy no pacer
//     moved (every pacer down) still runs about 3s after its slot.
func (m *Middleware) ServerConfig(cfg asynq.Config) asynq.Config {
	for q := range cfg.Queues {
		m.pace.serve(q)
	}
	if cfg.TaskCheckInterval == 0 || cfg.TaskCheckInterval > 50*time.Millisecond {
		cfg.TaskCheckInterval = 50 * time.Millisecond
	}
	if cfg.DelayedTaskCheckInterval == 0 || cfg.DelayedTaskCheckInterval > time.Second {
		cfg.DelayedTaskCheckInterval = time.Second
	}
	return cfg
}

func (m *Middleware) process(ctx context.Context, t *asynq.Task, queue string, b *Binding, next asynq.Handler) error {
	rq, err := b.Request(t.Payload())
	keys := rq.Keys
	if err != nil {
		// No key, no limit to apply: archived with the reason.
		var mf *MissingFieldError
		if errors.As(err, &mf) {
			m.observe(t, queue, Event{Outcome: Refused, Rule: mf.Rule})
		}
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	sp, err := m.split(b)
	if err != nil {
		return err
	}
	id, _ := asynq.GetTaskID(ctx)
	var charge quotas.Decision // the rate charges this run is made under
	var admit Event            // reported when the task is sure to run
	if sp.rates != nil {
		var done bool
		if done, charge, err = m.admitRates(ctx, t, queue, id, sp, keys, rq.Fair, &admit); done {
			return err
		}
	}
	if sp.slots == nil {
		if admit.Outcome != "" {
			m.observe(t, queue, admit)
		}
		err = next.ProcessTask(ctx, t)
	} else {
		err = m.runHolding(ctx, t, queue, id, sp, keys, charge, admit, next)
	}
	var te *ThrottledError
	if !errors.As(err, &te) {
		return err
	}
	return m.backOff(ctx, t, queue, te, sp, keys, charge)
}

// backOff handles a task the remote side throttled: every worker backs off
// the task's rate rules' keys (sp, keys; none for a task no rule matches)
// until it said to retry, the charge of this call is refunded, and the task
// runs again then.
func (m *Middleware) backOff(ctx context.Context, t *asynq.Task, queue string, te *ThrottledError, sp *split, keys []string, charge quotas.Decision) error {
	id, _ := asynq.GetTaskID(ctx)
	wait := te.RetryAfter
	if wait <= 0 {
		wait = time.Second
	}
	if sp != nil && sp.rates != nil {
		// The remote side did not count the call: neither do the windows.
		m.refund(ctx, sp, keys, charge)
		if berr := m.block(context.WithoutCancel(ctx), sp, keys, m.serverNow().Add(wait)); berr != nil {
			m.cfg.Logger.Warn("taskrl: blocking throttled rules failed", "err", berr)
		}
	}
	m.cfg.Logger.Info("taskrl: upstream throttled; backing off", "task", id, "retry_after", wait, "err", te.Err)
	m.observe(t, queue, Event{Outcome: UpstreamThrottled, Wait: wait})
	return m.reschedule(ctx, t, queue, id, wait, time.Time{}, "")
}

// refund gives back the rate charges of d, an admitted or booked decision
// (or one parsed from a receipt) whose task did not happen. A failure is
// logged: the charge then stays, as if the task had run.
func (m *Middleware) refund(ctx context.Context, sp *split, keys []string, d quotas.Decision) {
	if !d.Allowed {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.limiter.Refund(rctx, sp.rates, quotas.Request{Keys: pick(keys, sp.rateIdx)}, d); err != nil {
		m.cfg.Logger.Warn("taskrl: refunding an unused charge failed", "err", err)
	}
}

// block stops the task's rate rules for every worker until the given time:
// new decisions through the limiter, and booked copies through a marker per
// rule key that they read before their slot.
func (m *Middleware) block(ctx context.Context, sp *split, keys []string, until time.Time) error {
	rk := pick(keys, sp.rateIdx)
	if _, err := m.limiter.Block(ctx, sp.rates, quotas.Request{Keys: rk}, until); err != nil {
		return err
	}
	ttl := max(time.Until(until), 0) + time.Second // the server's clock may lag
	_, err := m.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range sp.rates.Rules() {
			p.Set(ctx, m.blockKey(r.Name, rk[i]), until.UnixMicro(), ttl)
		}
		return nil
	})
	return err
}

// blockedUntil returns the latest block on the task's rate rules and the
// rule it is on, in one round trip.
func (m *Middleware) blockedUntil(ctx context.Context, sp *split, keys []string) (until time.Time, rule string, err error) {
	rk := pick(keys, sp.rateIdx)
	rules := sp.rates.Rules()
	cmds := make([]*redis.StringCmd, len(rules))
	_, err = m.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, r := range rules {
			cmds[i] = p.Get(ctx, m.blockKey(r.Name, rk[i]))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, "", err
	}
	for i, c := range cmds {
		if us, err := c.Int64(); err == nil && time.UnixMicro(us).After(until) {
			until, rule = time.UnixMicro(us), rules[i].Name
		}
	}
	return until, rule, nil
}

// blockKey is the marker of a throttled rule key, hash-tagged like the
// rule's own keys.
func (m *Middleware) blockKey(rule, entity string) string {
	tag := "~g"
	if entity != "" {
		tag = keys.Encode(entity)
	}
	return m.prefix + "block:{" + tag + "}:" + rule
}

// ThrottledError reports that the remote side throttled a task (HTTP 429)
// and asked to be called again after RetryAfter. A handler returns one with
// Throttled; the middleware then blocks the task's rate rules for every
// worker until then and reschedules the task, without spending a retry.
type ThrottledError struct {
	// RetryAfter is the wait the remote side asked for; 0 means 1s.
	RetryAfter time.Duration
	// Err is the remote side's answer, for logs. It may be nil.
	Err error
}

// Throttled returns a *ThrottledError: the remote side throttled this task
// and asked to retry after retryAfter.
func Throttled(retryAfter time.Duration, err error) error {
	return &ThrottledError{RetryAfter: retryAfter, Err: err}
}

// Error implements error.
func (e *ThrottledError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("taskrl: throttled upstream, retry after %v", e.RetryAfter)
	}
	return fmt.Sprintf("taskrl: throttled upstream, retry after %v: %v", e.RetryAfter, e.Err)
}

// Unwrap returns Err.
func (e *ThrottledError) Unwrap() error { return e.Err }

// admitRates gets the task's turn under its rate and window rules: now, after
// a hold, or, if the turn is further away, by rescheduling. done reports that
// the task was rescheduled (or failed) and must not run now; otherwise
// charge is the decision (or booking) the task runs under, for a refund if
// the remote side throttles it, and *admit the Admitted event to report
// once the task is sure to run. A slot a fair rule's booking held, taken
// over meanwhile by a task with less than its share, is decided again.
func (m *Middleware) admitRates(ctx context.Context, t *asynq.Task, queue, id string, sp *split, keys, fair []string, admit *Event) (done bool, charge quotas.Decision, err error) {
	req := quotas.Request{Keys: pick(keys, sp.rateIdx), Critical: sp.critical, Fair: pick(fair, sp.rateIdx)}
	// A booking pays for the copy's first attempt only, at its slot: a retry
	// after a failure is charged again, and so is a copy that comes back
	// well after its slot (the worker or Redis stalled), so that late copies
	// do not all start at once; its booking is refunded then.
	if booked, ok := bookedAt(t); ok && retryCount(ctx) == 0 {
		receipt := t.Headers()[HeaderCharge]
		charge, _ := quotas.ParseReceipt(receipt) // none: nothing to refund
		wait := booked.Sub(m.serverNow())
		switch {
		case wait < -lateBooking:
			m.refund(ctx, sp, keys, charge)
		case wait > 2*m.cfg.MaxHold || !fitsDeadline(ctx, wait):
			// Far too early: reschedule again, still booked.
			m.observe(t, queue, Event{Outcome: Rescheduled, Wait: wait})
			return true, charge, m.reschedule(ctx, t, queue, id, wait, booked, receipt)
		default:
			if err := hold(ctx, wait); err != nil {
				return true, charge, err
			}
			if !m.held(ctx, sp, keys, req, charge) {
				break // decided again below
			}
			if done, err := m.unlessBlocked(ctx, t, queue, id, sp, keys, charge); done {
				return true, charge, err
			}
			*admit = Event{Outcome: Admitted, Wait: max(wait, 0)}
			return false, charge, nil
		}
	}
	reserve := func() (quotas.Decision, error) {
		return guard(m, func() (quotas.Decision, error) { return m.limiter.Reserve(ctx, sp.rates, req, m.cfg.MaxReserve) })
	}
	for taken := 0; ; taken++ {
		done, d, again, err := m.decideRates(ctx, t, queue, id, sp, keys, req, reserve, admit, taken < 3)
		if !again {
			return done, d, err
		}
	}
}

// decideRates books the task's turn (reserve) and acts on the decision:
// admits it, holds it or reschedules it (see admitRates). When retry is
// set, a slot within MaxHold that a fair rule's booking lost while the task
// was held is given back and again reported: the task is to be decided
// again.
func (m *Middleware) decideRates(ctx context.Context, t *asynq.Task, queue, id string, sp *split, keys []string, req quotas.Request, reserve func() (quotas.Decision, error), admit *Event, retry bool) (done bool, charge quotas.Decision, again bool, err error) {
	d, err := reserve()
	for backoff := 50 * time.Millisecond; err != nil; backoff = min(2*backoff, 2*time.Second) {
		if !errors.Is(err, errRedisDown) {
			m.observe(t, queue, Event{Outcome: RedisError, Err: err})
		}
		switch m.cfg.Policy.RedisUnavailable() {
		case FailOpen:
			m.cfg.Logger.Warn("taskrl: Redis unavailable; running the task without limits (fail open)", "task", id, "err", err)
			m.observe(t, queue, Event{Outcome: Unlimited})
			return false, quotas.Decision{}, false, nil
		case FailLocal:
			m.cfg.Logger.Warn("taskrl: Redis unavailable; limiting in this process (fail local)", "task", id, "err", err)
			m.observe(t, queue, Event{Outcome: Local})
			return false, quotas.Decision{}, false, m.localTurn(ctx, sp, keys)
		}
		// Fail closed: the task waits for Redis, which asynq needs too.
		m.cfg.Logger.Warn("taskrl: Redis unavailable; the task waits for it (fail closed)", "task", id, "err", err)
		if herr := hold(ctx, backoff); herr != nil {
			return true, quotas.Decision{}, false, herr
		}
		d, err = reserve()
	}
	m.learn(d.Now)
	if wait := max(d.Delay, d.RetryAfter); m.cfg.ThrottleBudget > 0 && waited(t)+wait > m.cfg.ThrottleBudget {
		m.refund(ctx, sp, keys, d)
		m.observe(t, queue, Event{Outcome: Refused, Rule: d.Rule, Wait: wait, Rules: d.Rules})
		return true, d, false, fmt.Errorf("taskrl: throttle budget %v spent (waited %v, would wait %v more): %w", m.cfg.ThrottleBudget, waited(t), wait, asynq.SkipRetry)
	}
	switch {
	case d.Allowed && d.Delay == 0:
		*admit = Event{Outcome: Admitted, Rules: d.Rules}
		return false, d, false, nil
	case d.Allowed && d.Delay <= m.cfg.MaxHold && fitsDeadline(ctx, d.Delay):
		if err := hold(ctx, d.Delay); err != nil {
			m.refund(ctx, sp, keys, d)
			return true, d, false, err
		}
		if retry && !m.held(ctx, sp, keys, req, d) {
			return false, quotas.Decision{}, true, nil
		}
		done, err := m.unlessBlocked(ctx, t, queue, id, sp, keys, d)
		if !done {
			*admit = Event{Outcome: Admitted, Wait: d.Delay, Rules: d.Rules}
		}
		return done, d, false, err
	case d.Allowed:
		m.observe(t, queue, Event{Outcome: Rescheduled, Wait: d.Delay, Rules: d.Rules})
		if err := m.reschedule(ctx, t, queue, id, d.Delay, d.Now.Add(d.Delay), d.Receipt()); err != nil {
			m.refund(ctx, sp, keys, d)
			return true, d, false, err
		}
		return true, d, false, nil
	case d.RetryAfter == quotas.Never:
		m.observe(t, queue, Event{Outcome: Refused, Rule: d.Rule, Rules: d.Rules})
		return true, d, false, fmt.Errorf("taskrl: task can never pass rule %q: %w", d.Rule, asynq.SkipRetry)
	default:
		m.observe(t, queue, Event{Outcome: Rescheduled, Rule: d.Rule, Wait: d.RetryAfter, Rules: d.Rules})
		return true, d, false, m.reschedule(ctx, t, queue, id, d.RetryAfter, time.Time{}, "")
	}
}

// held reports whether the slot a fair rule booked for the task (d) is
// still the task's: a task with less than its share may have taken it over
// since (quotas.Limiter.Held). If it was, or Redis cannot tell, d is given
// back (only the task's own rules: the taker inherited the rest) and the
// task must be decided again. Without a fair rule it is true at no cost.
func (m *Middleware) held(ctx context.Context, sp *split, keys []string, req quotas.Request, d quotas.Decision) bool {
	if !sp.fair {
		return true
	}
	ok, err := m.limiter.Held(ctx, sp.rates, req, d)
	if err == nil && ok {
		return true
	}
	if err != nil {
		m.cfg.Logger.Warn("taskrl: checking a fair booking failed; deciding again", "err", err)
	} else {
		m.cfg.Logger.Debug("taskrl: a task with less than its share took this task's slot; deciding again")
	}
	m.refund(ctx, sp, keys, d)
	return false
}

// errRedisDown is the error of a decision not tried because Redis failed a
// moment ago.
var errRedisDown = errors.New("taskrl: Redis failed less than a second ago; not tried")

// guard runs a limiter call unless Redis failed less than a second ago, so
// that while Redis is down each task pays the client's timeouts and retries
// at most once a second per process, not every time.
func guard(m *Middleware, call func() (quotas.Decision, error)) (quotas.Decision, error) {
	if time.Now().UnixNano() < m.down.Load() {
		return quotas.Decision{}, errRedisDown
	}
	d, err := call()
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		m.down.Store(time.Now().Add(time.Second).UnixNano())
	}
	return d, err
}

// localTurn waits for the task's turn under its GCRA rules in this process
// alone, each at 1/LocalShare of its rate: the FailLocal mode while Redis
// is unreachable. Window and concurrency rules are not enforced then.
func (m *Middleware) localTurn(ctx context.Context, sp *split, keys []string) error {
	rk := pick(keys, sp.rateIdx)
	for i, r := range sp.rates.Rules() {
		g, ok := r.Limit.(quotas.GCRA)
		if !ok {
			continue
		}
		l := gcra.Limit(g)
		l.Rate /= float64(m.cfg.LocalShare)
		l.Burst = max(1, l.Burst/m.cfg.LocalShare)
		res, err := m.local.Reserve(time.Now(), r.Name+"\x00"+rk[i], l, 1, 24*time.Hour)
		if err != nil {
			return err
		}
		if err := hold(ctx, res.Delay); err != nil {
			return err
		}
	}
	return nil
}

// unlessBlocked lets a task that waited for its slot run, unless the remote
// side throttled meanwhile: then its charge is refunded and it is
// rescheduled to when that ends.
func (m *Middleware) unlessBlocked(ctx context.Context, t *asynq.Task, queue, id string, sp *split, keys []string, charge quotas.Decision) (bool, error) {
	until, rule, err := m.blockedUntil(ctx, sp, keys)
	if err != nil || !until.After(m.serverNow()) {
		return false, nil
	}
	m.refund(ctx, sp, keys, charge)
	wait := until.Sub(m.serverNow())
	m.observe(t, queue, Event{Outcome: Rescheduled, Rule: rule, Wait: wait})
	return true, m.reschedule(ctx, t, queue, id, wait, time.Time{}, "")
}

// runHolding takes the task's concurrency slots, waiting up to MaxHold for
// them (or rescheduling), reports the task admitted (admit, from its rate
// rules, or its own event when the slots are its only rules), keeps them
// renewed while next runs, and releases them when it returns, panics or is
// cancelled.
func (m *Middleware) runHolding(ctx context.Context, t *asynq.Task, queue, id string, sp *split, keys []string, charge quotas.Decision, admit Event, next asynq.Handler) (err error) {
	req := quotas.Request{Keys: pick(keys, sp.slotIdx), Holder: origin(t, id), Critical: sp.critical}
	deadline := time.Now().Add(m.cfg.MaxHold)
	var held time.Duration // waiting for a slot in the worker
	var d quotas.Decision
	for backoff := 50 * time.Millisecond; ; {
		d, err = guard(m, func() (quotas.Decision, error) { return m.limiter.Allow(ctx, sp.slots, req) })
		if err != nil {
			if !errors.Is(err, errRedisDown) {
				m.observe(t, queue, Event{Outcome: RedisError, Err: err})
			}
			if m.cfg.Policy.RedisUnavailable() != FailClosed {
				// Open and local: concurrency has no local equivalent.
				m.cfg.Logger.Warn("taskrl: Redis unavailable; running without a concurrency slot", "task", id, "err", err)
				return next.ProcessTask(ctx, t)
			}
			if herr := hold(ctx, backoff); herr != nil {
				return herr
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		if d.Allowed {
			break
		}
		wait := min(d.RetryAfter, 100*time.Millisecond)
		if time.Now().Add(wait).After(deadline) {
			// Slots stay busy: try again in a second without holding the
			// worker. The rate charge already made stays, as the booking
			// of the copy's slot then, so only the slots are tried again.
			var booked time.Time
			if charge.Allowed {
				booked = m.serverNow().Add(time.Second)
			}
			m.observe(t, queue, Event{Outcome: Rescheduled, Rule: d.Rule, Wait: time.Second, Rules: d.Rules})
			return m.reschedule(ctx, t, queue, id, time.Second, booked, charge.Receipt())
		}
		if err := hold(ctx, wait); err != nil {
			return err
		}
		held += wait
	}
	switch admit.Outcome {
	case "": // the slots were the task's only decision
		m.observe(t, queue, Event{Outcome: Admitted, Wait: held, Rules: d.Rules})
	case Admitted:
		admit.Wait += held
		m.observe(t, queue, admit)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		m.renew(stop, d.Leases)
	}()
	defer func() {
		close(stop)
		wg.Wait()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, ls := range d.Leases {
			if _, rerr := m.limiter.Release(rctx, ls); rerr != nil {
				m.cfg.Logger.Warn("taskrl: releasing a concurrency slot failed; it frees itself when its lease ends", "rule", ls.Rule, "err", rerr)
			}
		}
	}()
	return next.ProcessTask(ctx, t)
}

// renew extends the leases every third of their length until stop closes.
func (m *Middleware) renew(stop <-chan struct{}, leases []quotas.Lease) {
	if len(leases) == 0 {
		return
	}
	tick := time.NewTicker(leases[0].Duration / 3)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			for _, ls := range leases {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if ok, err := m.limiter.Renew(ctx, ls); !ok || err != nil {
					m.cfg.Logger.Warn("taskrl: renewing a concurrency slot failed", "rule", ls.Rule, "err", err)
				}
				cancel()
			}
		}
	}
}

// reschedule enqueues a copy of the task to run after delay and lets the
// original complete, so that waiting for a limit never spends a retry or
// archives the task (asynq archives a failing task whose retries are spent
// before it asks whether the error was a failure). The copy keeps the
// task's payload, headers, queue, timeout, deadline and retention, and the
// retries it had left. Its ID is derived from the original's and the round,
// so a redelivered original cannot make two copies. booked, if set, is the
// slot already charged for it (receipt: the charge's quotas receipt, for a
// refund): the pacer moves the copy to pending then.
func (m *Middleware) reschedule(ctx context.Context, t *asynq.Task, queue, id string, delay time.Duration, booked time.Time, receipt string) error {
	round := 0
	if v, ok := t.Headers()[HeaderRound]; ok {
		round, _ = strconv.Atoi(v)
	}
	headers := make(map[string]string, len(t.Headers())+3)
	for k, v := range t.Headers() {
		headers[k] = v
	}
	org := origin(t, id)
	headers[HeaderOrigin] = org
	headers[HeaderRound] = strconv.Itoa(round + 1)
	delete(headers, HeaderBooked)
	delete(headers, HeaderCharge)
	headers[HeaderWaited] = strconv.FormatInt((waited(t) + max(delay, 0)).Microseconds(), 10)
	at := time.Now().Add(delay)
	if !booked.IsZero() {
		headers[HeaderBooked] = strconv.FormatInt(booked.UnixMicro(), 10)
		if receipt != "" {
			headers[HeaderCharge] = receipt
		}
		at = at.Add(paceSlack) // the pacer runs it at its slot
	}
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	copyID := formatID(org, round+1)
	opts := []asynq.Option{asynq.Queue(queue), asynq.TaskID(copyID), asynq.MaxRetry(max(0, maxRetry-retryCount(ctx))), asynq.ProcessAt(at)}
	// inherit adds the original's timeout, deadline and retention, once.
	inherited := false
	inherit := func() {
		info, err := m.inspect.GetTaskInfo(queue, id)
		if err != nil {
			return
		}
		inherited = true
		if info.Timeout > 0 {
			opts = append(opts, asynq.Timeout(info.Timeout))
		}
		if !info.Deadline.IsZero() {
			opts = append(opts, asynq.Deadline(info.Deadline))
		}
		if info.Retention > 0 {
			opts = append(opts, asynq.Retention(info.Retention))
		}
	}
	wctx := context.WithoutCancel(ctx)
	copyTask := asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers)
	// Until the copy is enqueued the task must not end: a failed task
	// would spend a retry or, with none left, be archived. So an enqueue
	// that fails (Redis is down: asynq could not record the task's end
	// either) is tried again until it works or the task's context ends.
	for backoff := 50 * time.Millisecond; ; backoff = min(2*backoff, 2*time.Second) {
		if !inherited {
			inherit()
		}
		_, err := m.client.EnqueueContext(wctx, copyTask, opts...)
		if err == nil {
			break
		}
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil // a redelivery of this task already rescheduled it
		}
		m.cfg.Logger.Warn("taskrl: rescheduling failed; trying again", "task", id, "err", err)
		if herr := hold(ctx, backoff); herr != nil {
			return fmt.Errorf("taskrl: rescheduling: %w (then %w)", err, herr)
		}
	}
	if !booked.IsZero() {
		if err := m.pace.add(wctx, queue, copyID, booked); err != nil {
			m.cfg.Logger.Warn("taskrl: pacing a rescheduled task failed; it runs a little late", "task", copyID, "err", err)
		}
	}
	m.cfg.Logger.Debug("taskrl: rescheduled", "task", id, "copy", copyID, "in", delay, "booked", !booked.IsZero())
	return nil
}

// OriginID returns the ID the task had when it was first enqueued: the
// task's own ID (asynq.GetTaskID), or, for a copy the middleware
// rescheduled, the ID of the task it was copied from. It stays the same
// however often the task is rescheduled, so it is the key to deduplicate on,
// e.g. as an Idempotency-Key header. It returns "" when ctx is not a task's
// context. Safe for concurrent use.
func OriginID(ctx context.Context, t *asynq.Task) string {
	id, _ := asynq.GetTaskID(ctx)
	return origin(t, id)
}

func origin(t *asynq.Task, id string) string {
	if o, ok := t.Headers()[HeaderOrigin]; ok && o != "" {
		return o
	}
	return id
}

// waited is how long the task has been rescheduled for so far.
func waited(t *asynq.Task) time.Duration {
	us, _ := strconv.ParseInt(t.Headers()[HeaderWaited], 10, 64)
	return time.Duration(us) * time.Microsecond
}

func bookedAt(t *asynq.Task) (time.Time, bool) {
	v, ok := t.Headers()[HeaderBooked]
	if !ok {
		return time.Time{}, false
	}
	us, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// learn records the offset of the server's clock from the local one.
func (m *Middleware) learn(server time.Time) {
	m.skew.Store(server.Sub(time.Now()).Microseconds())
}

// serverNow estimates the server's clock from the last decision.
func (m *Middleware) serverNow() time.Time {
	return time.Now().Add(time.Duration(m.skew.Load()) * time.Microsecond)
}

func retryCount(ctx context.Context) int {
	n, _ := asynq.GetRetryCount(ctx)
	return n
}

func fitsDeadline(ctx context.Context, wait time.Duration) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > wait
}

func hold(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
