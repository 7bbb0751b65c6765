package taskrl

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// Config configures a Middleware.
type Config struct {
	// Policy says which rules apply to which tasks. Required.
	Policy *policy.Policy
	// Client is the Redis that holds the asynq queues the middleware
	// reschedules tasks into, and the limits unless LimitsClient is set.
	// Required.
	Client redis.UniversalClient
	// LimitsClient, if set, is the Redis that holds the limits instead:
	// every rule's state (decisions, bookings, leases, learned rates), the
	// markers of a throttle and the fleet's busy counts, so that the queues
	// and the limits can live on different servers (a single server,
	// Sentinel or Cluster for either). Every worker and every tool reading
	// the limits (worker status, worker limits) must use the same one.
	// Default nil: Client.
	LimitsClient redis.UniversalClient
	// Prefix starts every limiter key. Default "taskrl:".
	Prefix string
	// MaxHold is the longest a task waits for its turn inside the worker;
	// longer waits book a slot and reschedule the task to it, which frees
	// the worker. Default 500ms.
	MaxHold time.Duration
	// MaxReserve is how far ahead a slot may be booked for a rescheduled
	// task. Default 1h; a task whose turn is further away is rescheduled
	// unbooked to when it would be allowed and decides again then. A task
	// with an adaptive rule (quotas.Adaptive) is booked at most 1s ahead:
	// its bookings keep the rate they were made at.
	MaxReserve time.Duration
	// ThrottleBudget, if positive, is the longest a task may wait for its
	// limits in all: a task that would wait longer is archived with a
	// reason naming the budget (a stale task is not worth running late,
	// say a one-time code). Default 0: no budget.
	ThrottleBudget time.Duration
	// LocalShare is how many worker processes share the limits, for the
	// policy.FailLocal policy mode: while Redis is unreachable each process
	// enforces every rule at 1/LocalShare of it, in memory (a GCRA rule's
	// rate and burst, a window's limit, a concurrency rule's slots; each
	// at least 1). Default 1.
	LocalShare int
	// Logger receives a line per rescheduled task. Default slog.Default().
	Logger *slog.Logger
	// Observer, if set, receives an Event per decision (see Outcome).
	Observer Observer
	// Shadow, if set, makes every rule a shadow rule (policy.Rule.Shadow): each
	// task is decided and reported but never held back. For trying a
	// policy on live traffic before enforcing it. Default false.
	Shadow bool
	// KeepOrder, if set, leaves asynq's queues in their order. By default
	// a task rescheduled a minute or more ahead has the tasks of the same
	// backlog (same rate and window rules, same keys) that are pending
	// behind it, and whose slot is estimated a minute or more away, moved
	// to asynq's scheduled set, each due 6 s before that slot, so that one
	// business's 10,000 queued tasks do not stand between the tasks behind
	// them and the workers (docs/design.md, "Setting a backlog aside").
	// Nothing is charged for them: they decide when they come back.
	// Likewise, when a fair concurrency rule refuses a task, the tasks of
	// the rule's other flows enqueued behind it are moved to the head of
	// the pending list, so that those flows get their turn (the scout,
	// docs/design.md 1.5). KeepOrder turns both off. Default false.
	KeepOrder bool
	// Clock is where the middleware reads the time. Default: the wall
	// clock. Waits in the worker still pass in real time.
	Clock Clock
	// ShedProbe, if set, is the signal of a policy shed section whose
	// signal is probe (ShedProbe): a share of pressure in [0, 1] (values
	// outside are clipped), read twice a second on one goroutine; it must
	// be quick. Required by such a policy; unused otherwise.
	ShedProbe func() float64
}

// Middleware makes asynq tasks respect the rules of a Policy across every
// worker process that shares the Redis. Build one with New; it is safe for
// concurrent use.
type Middleware struct {
	cfg     Config
	limits  admission.Limits // what admission.Plan reads of cfg; Mode is the policy's
	policy  atomic.Pointer[policy.Policy]
	local   quotas.Decider // the FailLocal fallback: a quotas.Model on Config.Clock
	down    atomic.Int64   // until when (Unix ns) Redis counts as unreachable
	prefix  string
	pace    *pacer
	sweep   *sweeper // nil: Config.KeepOrder
	scout   *scout   // nil: Config.KeepOrder
	limiter *quotas.Limiter
	splits  sync.Map   // *Binding -> *split
	skew    clock.Skew // of the server's clock, from the last decision
	jumps   jumpWatch  // of the server's clock against the local one
	shed    *shedder
	renew   *renewer
	parked  parkedSet   // tasks parked in the last minute (asynqlog.go)
	pauses  pauses      // operators' pauses of rules (PauseRule)
	plans   planNotes   // the payloads' plans noted for worker status
	waiters fairWaiters // tasks waiting for fair concurrency rules' slots
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
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = gcra.DefaultPrefix
	}
	if err := checkShed(&cfg, cfg.Policy); err != nil {
		return nil, err
	}
	if cfg.LimitsClient == nil {
		cfg.LimitsClient = cfg.Client
	}
	l, err := quotas.New(quotas.Config{Client: cfg.LimitsClient, Prefix: cfg.Prefix})
	if err != nil {
		return nil, fmt.Errorf("taskrl: %w", err)
	}
	m := &Middleware{cfg: cfg, local: quotas.NewModelOn(cfg.Clock.Now), limits: admission.Limits{MaxHold: cfg.MaxHold, Budget: cfg.ThrottleBudget}, prefix: cfg.Prefix, limiter: l}
	m.pauses.m = m
	m.plans.sem = make(chan struct{}, planWriters)
	m.policy.Store(cfg.Policy)
	m.pace = newPacer(pacerDeps{client: cfg.Client, logger: cfg.Logger, clock: cfg.Clock, skew: &m.skew, prefix: cfg.Prefix})
	if !cfg.KeepOrder {
		m.sweep = newSweeper(m)
		m.scout = newScout(m)
	}
	m.renew = newRenewer(m)
	m.shed = newShedder(m)
	m.shed.capacity.Store(int64(runtime.NumCPU())) // asynq's default Concurrency
	if shedOf(cfg.Policy) != nil {
		m.shed.loop.start()
	}
	return m, nil
}

// SetPolicy makes p the policy of every task that starts from now on;
// tasks already started finish under the policy they started with. Rules
// are kept in Redis by name, so a rule that keeps its name keeps its state
// and its bookings, whatever its limit becomes; a rule removed is no longer
// decided (its keys expire). Use it to reload a policy file without a
// restart. It returns an error, and keeps the current policy, when p is
// nil or has a shed section whose signal is probe without a
// Config.ShedProbe. Safe for concurrent use.
func (m *Middleware) SetPolicy(p *policy.Policy) error {
	if p == nil {
		return errors.New("taskrl: SetPolicy: nil policy")
	}
	if err := checkShed(&m.cfg, p); err != nil {
		return err
	}
	m.policy.Store(p)
	m.splits.Clear() // the old policy's bindings are not asked for again
	if shedOf(p) != nil {
		m.shed.loop.poke()
	}
	return nil
}

// Policy returns the policy tasks start under now: Config.Policy or the
// last one given to SetPolicy. Safe for concurrent use.
func (m *Middleware) Policy() *policy.Policy { return m.policy.Load() }

// Close stops the middleware's pacer, sweeper and shed loop, and gives the
// units of quota rules this process took ahead (prefetch) back to their
// windows (within 5 seconds). Call it after the asynq server has shut
// down; rescheduled tasks then still run, up to a few seconds late. It
// returns the error of giving units back, if any: they then stay counted
// until their windows end.
func (m *Middleware) Close() error {
	m.plans.wg.Wait()
	m.renew.loop.close()
	m.shed.loop.close()
	m.pace.close()
	if m.sweep != nil {
		m.sweep.close()
		m.scout.loop.close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return m.limiter.GiveBack(ctx)
}

// split is a binding's rules in two sets: the rate and window rules, which
// are booked ahead, and the concurrency rules, taken when the task runs.
type split struct {
	rates, slots     *quotas.Set
	local            [2]*quotas.Set // rates and slots at LocalShare (FailLocal)
	rateIdx, slotIdx []int          // positions in the binding's set
	throttle         *quotas.Set    // the rules an upstream throttle blocks
	throttleIdx      []int          // their positions in the binding's set
	lease            time.Duration  // the longest lease of the slots
	critical         bool           // the binding's tasks may use reserved slots
	fair             bool           // a rate rule is fair
	adaptive         bool           // a rate rule is adaptive
	horizon          time.Duration  // how far ahead the rate rules are booked
	shadow           *quotas.Set    // the shadow rules, decided but not enforced
	shadowIdx        []int          // their positions in the binding's set
	digest           string         // of the rate rules' limits (HeaderLimits)
	spacing          time.Duration  // between two tasks at the tightest rate rule; 0: not swept
	names            []string       // the binding's rules' names (Event.Keys)
	fairSlots        []fairSlot     // the fair concurrency rules among the slots
}

// fairSlot is a fair concurrency rule of a split's slots: its position
// there and its name.
type fairSlot struct {
	i    int
	name string
}

// nextSlot reports whether d is a denial by a fair concurrency rule that gives
// the task's flow the next slot that frees (quotas.RuleStatus.Next).
func nextSlot(d quotas.Decision) bool {
	return !d.Allowed && slices.ContainsFunc(d.Rules, func(r quotas.RuleStatus) bool { return r.Next && r.Name == d.Rule })
}

// behindSlot reports whether d is a denial by a fair concurrency rule that
// serves another waiting flow before the task's (quotas.RuleStatus.Behind).
func behindSlot(d quotas.Decision) bool {
	return !d.Allowed && slices.ContainsFunc(d.Rules, func(r quotas.RuleStatus) bool { return r.Behind && r.Name == d.Rule })
}

// nextHold is how long a task whose flow gets the next slot of a fair
// concurrency rule (RuleStatus.Next) waits for it in the worker after
// each such answer, at least; nextMax how long after the first such
// answer it stops waiting so.
const (
	nextHold = 2 * time.Second
	nextMax  = 10 * time.Second
)

// earlier returns the earlier of a and b.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// adaptiveReserve: see admission.AdaptiveReserve.
const adaptiveReserve = admission.AdaptiveReserve

func (m *Middleware) split(b *policy.Binding) (*split, error) {
	if v, ok := m.splits.Load(b); ok {
		return v.(*split), nil
	}
	sp := &split{critical: b.Critical(), horizon: m.cfg.MaxReserve}
	var rates, slots, adaptive []quotas.Rule
	var scoped []quotas.Rule
	var adaptiveIdx []int
	var shadow []quotas.Rule
	listed := false // a rule of the policy's throttle list governs the task
	for i, r := range b.Rules() {
		sp.names = append(sp.names, r.Name)
		listed = listed || b.Throttled(i) && !b.Rule(i).Shadow && !m.cfg.Shadow
		if b.Exempt(i) {
			continue // an unlimited override: the rule does not apply
		}
		if m.cfg.Shadow || b.Rule(i).Shadow {
			shadow, sp.shadowIdx = append(shadow, r), append(sp.shadowIdx, i)
			continue
		}
		if b.Throttled(i) {
			scoped, sp.throttleIdx = append(scoped, r), append(sp.throttleIdx, i)
		}
		if c, ok := r.Limit.(quotas.Concurrency); ok {
			if r.Fair {
				sp.fairSlots = append(sp.fairSlots, fairSlot{len(slots), r.Name})
			}
			slots, sp.slotIdx = append(slots, r), append(sp.slotIdx, i)
			sp.lease = max(sp.lease, c.Lease)
			continue
		}
		rates, sp.rateIdx = append(rates, r), append(sp.rateIdx, i)
		sp.fair = sp.fair || r.Fair
		if _, ok := r.Limit.(quotas.Adaptive); ok {
			adaptive, adaptiveIdx = append(adaptive, r), append(adaptiveIdx, i)
		}
	}
	if len(adaptive) > 0 {
		sp.adaptive, sp.horizon = true, min(sp.horizon, adaptiveReserve)
	}
	if !sp.critical {
		sp.spacing = spacing(rates)
	}
	switch {
	case len(scoped) > 0 || listed:
		// A throttle blocks the listed rules, none if the task's key is
		// exempt from them all: never the shared ones instead.
	case len(adaptive) > 0:
		// No rule of the task in the policy's throttle list: a throttle
		// teaches its adaptive rules...
		scoped, sp.throttleIdx = adaptive, adaptiveIdx
	case len(rates) > 0:
		// ... or, without any, blocks all its rate and window rules...
		scoped, sp.throttleIdx = rates, sp.rateIdx
	default:
		// ... or, without any, its concurrency rules.
		scoped, sp.throttleIdx = slots, sp.slotIdx
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%+v", rates)
	sp.digest = strconv.FormatUint(h.Sum64(), 36)
	rates, slots = withAutoPrefetch(b, rates, sp.rateIdx), withAutoPrefetch(b, slots, sp.slotIdx)
	for i, rules := range [][]quotas.Rule{rates, slots} {
		if len(rules) == 0 {
			continue
		}
		set, err := quotas.NewSet(rules...)
		if err != nil {
			return nil, err
		}
		shares := make([]quotas.Rule, len(rules))
		for k, r := range rules {
			shares[k] = atShare(r, m.cfg.LocalShare)
		}
		if sp.local[i], err = quotas.NewSet(shares...); err != nil {
			// A share past a limit's bounds (a GCRA burst at its floor
			// of 1 over 35 years): the whole limit in each process.
			sp.local[i] = set
		}
		if i == 0 {
			sp.rates = set
		} else {
			sp.slots = set
		}
	}
	for _, x := range []struct {
		rules []quotas.Rule
		set   **quotas.Set
	}{{scoped, &sp.throttle}, {shadow, &sp.shadow}} {
		if len(x.rules) > 0 {
			var err error
			if *x.set, err = quotas.NewSet(x.rules...); err != nil {
				return nil, err
			}
		}
	}
	if b.Transient() {
		return sp, nil
	}
	v, _ := m.splits.LoadOrStore(b, sp)
	return v.(*split), nil
}

// autoLease is how far ahead a quota rule prefetches by itself, how long a
// concurrency rule keeps a released slot, and the most a GCRA rule
// prefetches by itself (autoGCRA).
const autoLease = 10 * time.Millisecond

// autoGCRA is how far ahead a GCRA rule l prefetches by itself: autoLease,
// or less so that a batch is charged at most a quarter of its burst ahead
// (limits.Ahead); 0 (none) when that is under autoGCRAMin or under 4 of
// the rule's intervals (a rate under 400/s: a batch would rarely serve a
// second task), as for every rule of a burst under 4.
func autoGCRA(l quotas.GCRA) time.Duration {
	most := int64(l.Burst / 4)
	p := min(autoLease, time.Duration(most)*l.Interval()).Truncate(time.Microsecond)
	if p < autoGCRAMin || p < 4*l.Interval() {
		return 0
	}
	return p
}

// autoGCRAMin is the shortest prefetch a GCRA rule takes by itself: below
// it a batch would rarely serve a second task.
const autoGCRAMin = time.Millisecond

// autoMin is the smallest limit of a quota rule that prefetches by itself:
// batches of 4 (limits.WindowBatch).
const autoMin = 128

// autoSlots is the smallest max of a concurrency rule that keeps its slots
// by itself: a slot is kept while 4 (a max of 32 over 8) are free besides
// (quotas.Rule.Prefetch).
const autoSlots = 32

// withAutoPrefetch returns rules with a prefetch for those among them
// (their positions in b at idx) that have no prefetch, no cost and no
// NoPrefetch, and that are quota rules of a limit of at least autoMin or
// concurrency rules of a max of at least autoSlots (autoLease), or GCRA
// rules that are not fair and whose burst covers a batch's charge ahead
// four times (autoGCRA): exact (see limits.Rule.Prefetch), so a binding's
// rates and windows lease their units, and its concurrency rules keep
// their slots, without a policy change. A set prefetches (or keeps) when
// all its rules do; a task admitted from units in hand takes its slots in
// one call of their own (quotas.Limiter.ReserveAndAllow).
func withAutoPrefetch(b *policy.Binding, rules []quotas.Rule, idx []int) []quotas.Rule {
	rules = slices.Clone(rules)
	for k, r := range rules {
		var auto time.Duration
		switch l := r.Limit.(type) {
		case quotas.FixedWindow:
			auto = autoIf(l.Limit >= autoMin)
		case quotas.CalendarWindow:
			auto = autoIf(l.Limit >= autoMin)
		case quotas.Concurrency:
			// A fair rule's slots go to the flows in turn, never kept;
			// an adaptive rule's slot teaches it at its release.
			auto = autoIf(l.Max >= autoSlots && !r.Fair && !l.Adaptive)
		case quotas.GCRA:
			if !r.Fair {
				auto = autoGCRA(l)
			}
		}
		if pr := b.Rule(idx[k]); auto > 0 && r.Prefetch == 0 && pr.Prefetch == 0 && pr.Cost == "" {
			rules[k].Prefetch = auto
		}
	}
	return rules
}

// autoIf is autoLease if ok, else 0.
func autoIf(ok bool) time.Duration {
	if ok {
		return autoLease
	}
	return 0
}

// atShare returns r with its limit divided among share processes, each at
// least 1: what one process enforces alone in the policy.FailLocal mode, where
// nothing is prefetched.
func atShare(r quotas.Rule, share int) quotas.Rule {
	r.Prefetch = 0
	part := func(n int) int { return max(1, n/share) }
	switch l := r.Limit.(type) {
	case quotas.GCRA:
		l.Rate /= float64(share)
		l.Burst = part(l.Burst)
		r.Limit = l
	case quotas.Adaptive:
		// A share of the bounds; what the fleet learned is in Redis.
		l.Max, l.Min, l.Start = l.Max/float64(share), l.Min/float64(share), l.Start/float64(share)
		l.Burst = part(max(l.Burst, 1))
		r.Limit = l
	case quotas.FixedWindow:
		l.Limit = part(l.Limit)
		r.Limit = l
	case quotas.CalendarWindow:
		l.Limit = part(l.Limit)
		r.Limit = l
	case quotas.SlidingWindow:
		l.Limit = part(l.Limit)
		r.Limit = l
	case quotas.Concurrency:
		l.Max = part(l.Max)
		l.Reserved = min(l.Reserved/share, l.Max-1)
		if l.Adaptive {
			// A share of the bounds; what the fleet learned is in Redis.
			l.Min = min(part(l.Min), l.Max)
		}
		r.Limit = l
	}
	return r
}

func pick[T any](keys []T, idx []int) []T {
	if keys == nil {
		return nil
	}
	out := make([]T, len(idx))
	for i, j := range idx {
		out[i] = keys[j]
	}
	return out
}

// Handler wraps next. Tasks no rule matches go straight to next, without a
// Redis call; if the remote side throttles one (Throttled), it is
// rescheduled too, so that it never spends a retry or is archived for it.
func (m *Middleware) Handler(next asynq.Handler) asynq.Handler {
	run := m.once(next) // made once, not per task
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) (err error) {
		growStack(0) // the task's stack grows here, once (stack.go)
		m.shed.inflight.Add(1)
		defer m.shed.inflight.Add(-1)
		w := takeParked(t)
		if w.round > 0 {
			ctx = context.WithValue(ctx, parkedKey{}, w.name())
		}
		queue, _ := asynq.GetQueueName(ctx)
		p := m.policy.Load()
		if sh := shedOf(p); sh != nil {
			if w.booked.IsZero() && m.shed.deferring() {
				if d, ok := m.shed.deferFor(sh, p.ShedClass(t.Type(), queue)); ok {
					j := m.newJob(ctx, t, queue, p, w)
					j.observe(Event{Outcome: Deferred, Wait: d})
					return j.reschedule("", d, time.Time{}, "")
				}
			}
			if sh.Signal == policy.ShedUpstreamErrors {
				defer func() { m.shed.ended(err, m.cfg.Clock.Now()) }()
			}
		}
		if !w.due.IsZero() {
			// A task the pacer moved ahead of its due time waits for it
			// here; one far earlier (run by hand) waits again.
			switch d := w.due.Sub(m.serverNow()); {
			case d > admission.EarlyBooking(m.pace.leadTime(), m.cfg.MaxHold):
				return m.newJob(ctx, t, queue, p, w).reschedule("", d, time.Time{}, "")
			case d > 0:
				if err := hold(ctx, d); err != nil {
					return err
				}
			}
		}
		b := p.Bind(t.Type(), queue)
		if b == nil {
			// No job for a task no rule governs unless it is throttled.
			err := run.ProcessTask(ctx, t)
			if te := (*ThrottledError)(nil); errors.As(err, &te) {
				return m.newJob(ctx, t, queue, p, w).backOff(te)
			}
			return err
		}
		return m.newJob(ctx, t, queue, p, w).process(b, run)
	})
}

// parkedKey is the context key of the name of the wait a task runs after
// (parked.name), for once.
type parkedKey struct{}

// onceTimeout is how long once waits for Redis to mark a run.
const onceTimeout = 100 * time.Millisecond

// once wraps next so that a task's run after a wait happens once: asynq
// may deliver the task twice (a Redis failover loses the pacer's move to
// pending, and the task is moved again on the new primary), and both
// deliveries would wait for the same slot and call at once. Just before
// the run, it marks the task's ID and wait (SET NX, one minute); a
// delivery that finds the mark ends without running, as done. If Redis
// cannot say within onceTimeout, or failed a moment ago, the run goes on.
// Tasks that did not wait are not marked: asynq gives those to one worker
// at a time.
func (m *Middleware) once(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		// Real time: whether Redis failed a moment ago (guard).
		if wait, ok := ctx.Value(parkedKey{}).(string); ok && time.Now().UnixNano() >= m.down.Load() {
			id, _ := asynq.GetTaskID(ctx)
			queue, _ := asynq.GetQueueName(ctx)
			mctx, cancel := context.WithTimeout(ctx, onceTimeout)
			first, err := m.cfg.Client.SetNX(mctx, keys.Ran(m.prefix, queue, id, wait), 1, time.Minute).Result()
			cancel()
			if err == nil && !first {
				m.cfg.Logger.Info("taskrl: a second delivery of a task after its wait ends without running; another worker started it", "task", id)
				return nil
			}
		}
		return next.ProcessTask(ctx, t)
	})
}

// failMode is a policy's failure mode as admission.Plan reads it.
func failMode(f policy.FailureMode) admission.Mode {
	switch f {
	case policy.FailOpen:
		return admission.FailOpen
	case policy.FailLocal:
		return admission.FailLocal
	}
	return admission.FailClosed
}

// newJob returns the job of a delivery of t from queue under policy p; its
// context carries it, for Pause.
func (m *Middleware) newJob(ctx context.Context, t *asynq.Task, queue string, p *policy.Policy, w parked) *job {
	j := &job{m: m, t: t, queue: queue, lim: m.limits, policy: p, w: w}
	j.lim.Mode = failMode(p.FailureMode())
	j.lim.Early = admission.EarlyBooking(m.pace.leadTime(), j.lim.MaxHold)
	j.ctx = context.WithValue(ctx, jobKey{}, j)
	j.id, _ = asynq.GetTaskID(ctx)
	return j
}

// ServerConfig returns cfg with its Logger wrapped, and starts pacing its
// queues now rather than when a task of theirs is first rescheduled here.
// The wrapped Logger (asynq's default logger when cfg.Logger is nil) drops
// one line asynq writes for each task the middleware makes wait: asynq's
// own write after the handler finds the task waiting rather than active,
// which it must (the task's record stays as it is), and asynq logs "Could
// not remove task id=... NOT FOUND"; every other line passes. It reads
// cfg.TaskCheckInterval (asynq's default 1s when zero): an idle worker
// looks for pending tasks after sleeping up to 1.5 times that, so a task
// rescheduled to a booked slot is moved to pending that long and 100ms
// before its slot (admission.PaceLead: 1.6s by default) and waits for it
// in the worker that picks it up, holding one of its Concurrency slots
// meanwhile. A shorter interval gives a shorter lead, at the price of
// idle polling (each look costs Redis three commands per queue).
func (m *Middleware) ServerConfig(cfg asynq.Config) asynq.Config {
	if cfg.Concurrency > 0 {
		m.shed.capacity.Store(int64(cfg.Concurrency))
	}
	m.pace.setLead(admission.PaceLead(cfg.TaskCheckInterval))
	for q := range cfg.Queues {
		m.pace.serve(q)
	}
	if _, ok := cfg.Logger.(asynqLogger); !ok {
		next := cfg.Logger
		if next == nil {
			next = newStderrLogger()
		}
		cfg.Logger = asynqLogger{next: next, parked: &m.parked}
	}
	return cfg
}

// process runs a task that binding b governs: admitted under its rate
// rules, then its concurrency slots, then handed to next; an upstream 429
// from next backs its rules off.
func (j *job) process(b *policy.Binding, next asynq.Handler) error {
	rq, err := b.Request(j.t.Payload())
	if err != nil {
		// No key, no limit to apply: archived with the reason.
		var mf *policy.MissingFieldError
		var ce *policy.CostError
		if errors.As(err, &mf) {
			j.observe(Event{Outcome: Refused, Rule: mf.Rule})
		} else if errors.As(err, &ce) {
			j.observe(Event{Outcome: Refused, Rule: ce.Rule})
		}
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	b = b.ForPayload(rq.Keys, j.t.Payload())
	j.m.notePlans(b, rq.Keys)
	if j.sp, err = j.m.split(b); err != nil {
		return err
	}
	if err := checkCosts(j.sp.rates, pick(rq.Costs, j.sp.rateIdx)); err != nil {
		// A cost above what an enforced rule admits at once (after
		// overrides): no wait would ever admit it; nothing is charged.
		j.observe(Event{Outcome: Refused, Rule: err.(*policy.CostError).Rule, Wait: quotas.Never})
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	j.keys, j.flows, j.weights, j.levels = rq.Keys, rq.Fair, rq.Weights, rq.Priorities
	// A task booked for after the pause's end keeps its slot: a refund of
	// a GCRA charge that others follow gives little back, so the task
	// would decide anew behind them.
	if p, ok := j.m.pauses.held(j.ctx, b, rq.Keys); ok && (p.Until.IsZero() || j.w.booked.Before(p.Until)) {
		if j.sp.rates != nil && !j.w.booked.IsZero() && j.w.limits == j.sp.digest {
			// The booking's charge goes back (if made under these
			// limits: admitRates' Stale): the task decides anew.
			j.rates = quotas.Request{Keys: pick(j.keys, j.sp.rateIdx), Costs: pick(rq.Costs, j.sp.rateIdx)}
			d, _ := quotas.ParseReceipt(j.w.charge)
			j.refund(d)
		}
		return j.hold(p)
	}
	if j.sp.shadow != nil {
		// Decided when the task runs: once per run, at its moment.
		inner := next
		next = asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			defer j.shadowDecide(rq)()
			return inner.ProcessTask(ctx, t)
		})
	}
	var admit Event // reported when the task is sure to run
	if j.sp.rates != nil {
		j.rates = quotas.Request{Keys: pick(j.keys, j.sp.rateIdx), Critical: j.sp.critical, Fair: pick(rq.Fair, j.sp.rateIdx), Weights: pick(rq.Weights, j.sp.rateIdx), Priorities: pick(rq.Priorities, j.sp.rateIdx), Costs: pick(rq.Costs, j.sp.rateIdx)}
		if st := j.newSettlement(b); st != nil {
			// The handler may report the actual cost (Settle); it is
			// applied when the handler returns, unless the remote side
			// throttled the call (backOff refunds the charge whole).
			inner := next
			next = asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
				err := inner.ProcessTask(context.WithValue(ctx, settleKey{}, st), t)
				if errors.As(err, new(*ThrottledError)) {
					st.mu.Lock()
					st.done = true
					st.mu.Unlock()
				} else {
					j.settle(st)
				}
				return err
			})
		}
		if done, err := j.admitRates(&admit); done {
			return err
		}
	}
	if p, ok := j.m.pauses.held(j.ctx, b, rq.Keys); ok {
		// Paused while the task waited for its turn in the worker.
		if j.sp.rates != nil {
			j.refund(j.charge)
		}
		j.releaseSlots()
		return j.hold(p)
	}
	if j.sp.slots == nil {
		if admit.Outcome != "" {
			j.observe(admit)
		}
		err = next.ProcessTask(j.ctx, j.t)
	} else {
		err = j.runHolding(admit, next)
	}
	var te *ThrottledError
	if !errors.As(err, &te) {
		j.paused()
		return err
	}
	return j.backOff(te)
}

// errRedisDown is the error of a decision not tried because Redis failed a
// moment ago.
var errRedisDown = errors.New("taskrl: Redis failed less than a second ago; not tried")

// guard runs a limiter call unless Redis failed less than a second ago, so
// that while Redis is down each task pays the client's timeouts and retries
// at most once a second per process, not every time.
func guard(m *Middleware, call func() (quotas.Decision, error)) (quotas.Decision, error) {
	// Real time: this is about the client's timeouts, not the limits.
	if time.Now().UnixNano() < m.down.Load() {
		return quotas.Decision{}, errRedisDown
	}
	d, err := call()
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		m.down.Store(time.Now().Add(time.Second).UnixNano())
	}
	return d, err
}
