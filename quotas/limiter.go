package quotas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/batch"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
)

// Never is the RetryAfter of a request that no wait can admit: its cost
// exceeds a rule's burst or limit.
const Never = gcra.Never

// Config configures a Limiter.
type Config struct {
	// Client is the Redis connection: a *redis.Client, *redis.ClusterClient
	// or *redis.Ring. Required.
	Client redis.UniversalClient
	// Prefix starts every key. Default "taskrl:". At most 64 printable ASCII
	// bytes without spaces, '{' or '}'.
	Prefix string
	// Now, when set, supplies the time of every decision instead of the
	// Redis server's TIME: for tests and simulations only.
	Now func() time.Time
	// MaxBatch is how many concurrent requests one script call may carry
	// on a single Redis (a *redis.Client). While a few calls are in
	// flight, requests wait and go together in the next call, one round
	// trip for all of them; each request is still decided atomically, in
	// arrival order. A lone request never waits. A Redis error (such as
	// a timeout) fails every request of the call. 0 means 32; 1 sends
	// every request in its own call. On Redis Cluster and Ring every
	// request has its own calls.
	MaxBatch int
}

// Limiter decides rule sets against Redis. A Limiter is safe for concurrent
// use.
type Limiter struct {
	client  redis.UniversalClient
	prefix  string
	now     func() time.Time
	sharded bool
	// skew centres the calendar ticks sent with a request on the server's
	// clock.
	skew  clock.Skew
	batch *batch.Batcher
	// leases sends renewals and releases, joined as batch does decisions.
	leases *batch.Batcher
	// started and pools: units taken ahead (Rule.Prefetch); slots: slots
	// kept.
	started time.Time
	pools   pools
	slots   slotPools
}

// New validates cfg and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("quotas: Config.Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = gcra.DefaultPrefix
	}
	if err := keys.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("quotas: Config.Prefix: %w", err)
	}
	switch {
	case cfg.MaxBatch < 0:
		return nil, fmt.Errorf("quotas: Config.MaxBatch must not be negative, got %d", cfg.MaxBatch)
	case cfg.MaxBatch == 0:
		cfg.MaxBatch = 32
	}
	_, single := cfg.Client.(*redis.Client)
	return &Limiter{client: cfg.Client, prefix: cfg.Prefix + keys.Rules, now: cfg.Now, sharded: !single,
		batch:  batch.New(cfg.Client, setProgram, joinRequests, "quotas", cfg.MaxBatch),
		leases: batch.New(cfg.Client, leaseProgram, joinLeases, "quotas", cfg.MaxBatch), started: time.Now()}, nil
}

// RuleStatus is the state of one rule's key after a decision.
type RuleStatus struct {
	// Name and Key identify the rule and the entity.
	Name, Key string
	// Used and Remaining are units in the current window (windows), in the
	// bucket (GCRA: Burst−Remaining) or slots held (concurrency).
	Used, Remaining int
	// ResetAfter is the time until the window ends, the bucket is full
	// again, the oldest sliding entry leaves, or the first lease expires.
	ResetAfter time.Duration
	// Interval is, for a GCRA or Adaptive rule, the emission interval the
	// decision used: for an Adaptive rule, the learned one (the rate is
	// one unit per Interval). Zero for other kinds.
	Interval time.Duration
	// Slots is, for an adaptive Concurrency rule, the number of slots it
	// has learned (limits.Concurrency.Adaptive); 0 for other rules.
	Slots int
	// Next, for a fair Concurrency rule that refused the request with no
	// slot free and no Block in force, says that the request's flow is the
	// next to get one of several flows waiting: a task of it had better
	// wait in its worker and ask again soon. False otherwise, and for a
	// Critical request.
	Next bool
	// Behind, for a fair Concurrency rule that refused the request with no
	// Block in force, says that another flow waiting ranks below the
	// request's: slots go to it first, and more tasks of the request's flow
	// waiting in workers would only keep them from other flows' tasks.
	// False otherwise, and for a Critical request.
	Behind bool
}

// Lease is a concurrency slot taken by an admitted request; Renew keeps it,
// Release gives it back. The zero value is not a lease.
type Lease struct {
	// Rule and Key name the concurrency rule and entity.
	Rule, Key string
	// Holder is the request's Holder (a kept slot's, Rule.Prefetch: the
	// process's own); Token is the fencing token issued at acquisition:
	// only the newest acquisition of a holder can renew or release.
	Holder string
	Token  int64
	// Duration is the rule's lease length.
	Duration   time.Duration
	zkey, hkey string
	wkey, ekey string     // a fair rule's waiting set and waits hash, else ""
	kept       *slotGrant // a kept slot's grant (Rule.Prefetch), or nil
	gen        uint64     // the grant's hand-out this lease is of
	// An adaptive rule's learned state and Min and Max (amin 0: not
	// adaptive), and what Outcome reported: the call's latency, µs, and
	// whether it reported overload.
	lkey       string
	amin, amax int64
	lat        int64
	over       bool
}

// Outcome returns ls carrying what the call made under its slot showed: it
// took latency, and overloaded says the remote side reported overload (it
// throttled the call; a call that ran out of time is a slow one, not an
// overload signal). Releasing the returned
// lease teaches an adaptive Concurrency rule (limits.Concurrency.Adaptive)
// from it; other rules ignore it. A latency of 0 without overload reports
// nothing, as for a slot given back without a call. Call it only for a
// call that was made: a slot given back unused would teach the rule a
// latency no call has.
func (ls Lease) Outcome(latency time.Duration, overloaded bool) Lease {
	ls.lat, ls.over = max(latency.Microseconds(), 0), overloaded
	if latency > 0 && ls.lat == 0 {
		ls.lat = 1
	}
	return ls
}

// keys are the lease script's keys for ls (lease.lua).
func (ls Lease) keys() []string {
	switch {
	case ls.wkey != "":
		return []string{ls.zkey, ls.hkey, ls.wkey, ls.ekey}
	case ls.lkey != "":
		return []string{ls.zkey, ls.hkey, ls.lkey}
	}
	return []string{ls.zkey, ls.hkey}
}

// decided is when d was decided, µs (0: unknown).
func (d Decision) decided() int64 {
	if d.Now.IsZero() {
		return 0
	}
	return d.Now.UnixMicro()
}

// Decision is the outcome of deciding a set. Denied is a result, not an
// error.
type Decision struct {
	// Allowed reports whether every rule admitted (Allow) or the request
	// was booked (Reserve); then every rule was charged, otherwise none.
	Allowed bool
	// RetryAfter, when denied, is the longest wait among the rules that
	// denied (for concurrency, when the first lease expires: a release may
	// come sooner), or Never; for a Reserve not booked, the wait until the
	// earliest moment all rules admit.
	RetryAfter time.Duration
	// Rule names the rule that set RetryAfter.
	Rule string
	// Delay is, for a booked Reserve, how long until the booked moment.
	Delay time.Duration
	// Now is the decision time: the server's TIME or the explicit clock. On
	// Redis Cluster, rules in other slots are decided by their own node's
	// clock in the same round trip; Now is the time of the first rule.
	Now time.Time
	// Rules holds each rule's state after the decision, in set order;
	// read only (decisions admitted from one prefetched batch share it).
	Rules []RuleStatus
	// Leases are the concurrency slots an Allow took.
	Leases []Lease

	pf    *prefetch  // admitted from units taken ahead (Rule.Prefetch)
	split *split     // its global rules admitted from units taken ahead, its keyed ones in Redis (split.go)
	nonce string     // names this request's GCRA bookings and sliding-window entries
	cost  int        // units charged
	costs []int      // per rule, units charged, when they differ from cost; else nil
	ats   []int64    // per rule, µs its group charged at
	undo  [][2]int64 // per rule, what a refund needs to undo the charge
}

// sameCosts reports whether req.Costs charges every rule req.Cost (nil,
// or each 0 or Cost).
func sameCosts(req Request) bool {
	for _, n := range req.Costs {
		if n != 0 && n != max(req.Cost, 1) {
			return false
		}
	}
	return true
}

// withCosts sets each call's cost to what decision d charged its rule.
func withCosts(calls []call, d Decision) {
	for i := range calls {
		calls[i].n = int64(d.cost)
		if d.costs != nil {
			calls[i].n = int64(d.costs[calls[i].i])
		}
	}
}

// Allow admits the request if every rule of the set admits it now, and then
// charges every rule (concurrency rules hand out a Lease each); if any rule
// denies, nothing is charged and the Decision names the rule with the
// longest wait. On a single Redis this is one script call. On Redis Cluster,
// rules whose keys live in different slots are decided by one script per
// slot, sent in one parallel round trip; if some slots admit and another
// denies, the admitted charges are undone in a second round trip, so the set
// never over-admits (a concurrent request may be denied meanwhile). When
// every rule of the set has Rule.Prefetch, Allow and Reserve admit from
// units this Limiter took ahead in a batch while it has some, without a
// call; the Decision is then as of the batch (its Rules are the batch's
// state), and Refund puts the units back while they are usable.
func (l *Limiter) Allow(ctx context.Context, s *Set, req Request) (Decision, error) {
	return l.decide(ctx, s, req, opAllow, 0)
}

// Reserve books the earliest moment, at most horizon away, at which every
// rule except concurrency rules admits the request, charging them for that
// moment only: the caller acts after Decision.Delay, and the capacity
// before the moment stays free for other requests (see GCRA). Concurrency
// is taken when the work starts (Allow), never reserved. If no such moment
// lies within the horizon, nothing is charged and RetryAfter says when it
// would be. Nor is anything booked beyond the reset of a fixed or calendar
// window longer than the horizon that is full until then (a daily quota
// spent an hour before midnight): the request would keep its slot after the
// reset even if refunds freed quota before it, so it is told to come back
// at the reset instead. RetryAfter is then the wait until the moment found,
// and Rule names the window.
func (l *Limiter) Reserve(ctx context.Context, s *Set, req Request, horizon time.Duration) (Decision, error) {
	return l.decide(ctx, s, req, opReserve, max(horizon, 0))
}

// ReserveAndAllow is Reserve of req under s and then, if that admits the
// request now (Allowed, Delay 0), Allow of slots under slotSet at the same
// moment, decided in one script call on a single Redis: the same decisions
// as the two calls made back to back, in one round trip and at one read of
// the server's clock (a call that concurrent decisions may share, as
// Allow's). When s prefetches (Rule.Prefetch) and has units in hand, the
// rates are admitted from them and only the slots are decided, in one
// call. decided reports whether the slots were decided (sd is
// their Decision); if not (the rates did not admit now, or the call cannot
// carry both: Redis Cluster, a calendar rule whose ticks missed the
// clock), rd is Reserve's decision alone and the caller calls Allow itself
// when it wants the slots.
func (l *Limiter) ReserveAndAllow(ctx context.Context, s *Set, req Request, horizon time.Duration, slotSet *Set, slots Request) (rd, sd Decision, decided bool, err error) {
	if l.sharded || s == nil || slotSet == nil || slotSet.prefetch != 0 {
		rd, err = l.Reserve(ctx, s, req, horizon)
		return rd, Decision{}, false, err
	}
	if slotSet.keep != 0 && l.hasKept(slotSet, slots) {
		// A slot kept: the rates alone, then the slot without a call.
		if rd, err = l.Reserve(ctx, s, req, horizon); err != nil || !rd.Allowed || rd.Delay > 0 {
			return rd, Decision{}, false, err
		}
		if sd, err = l.Allow(ctx, slotSet, slots); err != nil {
			_ = l.Refund(context.WithoutCancel(ctx), s, req, rd)
			return Decision{}, Decision{}, false, err
		}
		return rd, sd, true, nil
	}
	var p *pool // the rates' pool, to resume after a decision made as usual
	if s.prefetch != 0 && sameCosts(req) {
		if rd, p, err = l.prefetched(ctx, s, req); err != nil {
			return Decision{}, Decision{}, false, err
		}
		if rd.Allowed {
			sd, err = l.Allow(ctx, slotSet, slots)
			if err != nil {
				l.unfetch(poolKey(s, req), rd)
				return Decision{}, Decision{}, false, err
			}
			return rd, sd, true, nil
		}
	}
	if pt := l.splitOf(s, req, p); pt != nil {
		// The global rates from their pool, the keyed ones beside the
		// slots (split.go).
		gd, greq, kreq, err := l.global(ctx, pt, req)
		if err != nil {
			return Decision{}, Decision{}, false, err
		}
		if gd.Allowed {
			kd, sd, decided, err := l.pair(ctx, pt.k, kreq, 0, slotSet, slots)
			if err == nil && kd.Allowed {
				return joined(s, pt, greq, kreq, gd, kd), sd, decided, nil
			}
			l.unfetch(poolKey(pt.g, greq), gd)
			if err != nil {
				return Decision{}, Decision{}, false, err
			}
			l.pause(p)
		}
	}
	rd, sd, decided, err = l.pair(ctx, s, req, horizon, slotSet, slots)
	if err == nil {
		l.resumed(s, req, p, rd)
	}
	return rd, sd, decided, err
}

// pair is ReserveAndAllow's call: Reserve of req under s, and the slots
// allowed after it, in one job of the decisions' batcher.
func (l *Limiter) pair(ctx context.Context, s *Set, req Request, horizon time.Duration, slotSet *Set, slots Request) (rd, sd Decision, decided bool, err error) {
	rcalls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	scalls, err := l.bind(slotSet, slots, true)
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	tm, err := l.timing()
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	rp := params{op: opReserve, req: req, n: max(req.Cost, 1), horizon: max(horizon, 0)}
	if s.named {
		rp.nonce = requestNonce(s, rcalls)
	}
	start, held := l.local(), slots
	if slotSet.keep != 0 {
		slots.Holder = keptHolder() // kept when released (slots.go)
	}
	sp := params{op: opAllowAfter, req: slots, n: max(slots.Cost, 1)}
	if slotSet.named {
		sp.nonce = newNonce()
	}
	rks, rargv, _ := l.args(rcalls, rp, tm)
	sks, sargv, _ := l.args(scalls, sp, tm)
	if tm.now < 0 {
		sargv[argNow] = prevNow
	}
	// Both requests in one job: in one call, shared with other callers'.
	args := append(append(append(make([]any, 0, len(rargv)+len(sargv)), 2), rargv[1:]...), sargv[1:]...)
	v, err := l.batch.DoN(ctx, append(rks, sks...), args, 2)
	if err != nil {
		if slotSet.keep != 0 {
			l.dropKept(slotSet, slots)
		}
		return Decision{}, Decision{}, false, err
	}
	var rs [2]reply
	for i, n := range []int{len(rcalls), len(scalls)} {
		var x []any
		if len(v) == 2 {
			x, _ = v[i].([]any)
		}
		if x == nil {
			return Decision{}, Decision{}, false, fmt.Errorf("quotas: unexpected script reply %v", v)
		}
		if rs[i], err = parseReply(x, n); err != nil {
			return Decision{}, Decision{}, false, err
		}
	}
	if rs[0].status == stNoTicks {
		// Calendar ticks around the wrong time: nothing was charged. The
		// rates alone, in Redis (a split's keyed part must carry its
		// charges, not units of a pool).
		rd, err = l.decideNow(ctx, s, req, opReserve, horizon)
		return rd, Decision{}, false, err
	}
	if l.now == nil {
		l.skew.Learn(time.UnixMicro(rs[0].now), time.Now())
	}
	rd = l.assemble(s, [][]call{rcalls}, rs[:1], rp)
	if rs[1].status == stSkipped || rs[1].status == stNoTicks {
		// Not decided: the rates did not admit now (or the slots'
		// calendar ticks missed; nothing charged).
		return rd, Decision{}, false, nil
	}
	sp.op = opAllow
	sd = l.assemble(slotSet, [][]call{scalls}, rs[1:], sp)
	if slotSet.keep != 0 && sd.Allowed {
		sd = l.keepGrant(slotSet, held, sd, start)
	}
	return rd, sd, true, nil
}

// Status reports every rule's state without charging anything. Allowed is
// true.
func (l *Limiter) Status(ctx context.Context, s *Set, req Request) (Decision, error) {
	calls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, err
	}
	gs := l.groups(calls)
	rs, err := l.run(ctx, gs, params{op: opStatus, req: req})
	if err != nil {
		return Decision{}, err
	}
	return l.assemble(s, gs, rs, params{req: req}), nil
}

func (l *Limiter) decide(ctx context.Context, s *Set, req Request, op int, horizon time.Duration) (Decision, error) {
	if s != nil && s.keep != 0 && op == opAllow {
		return l.keptAllow(ctx, s, req)
	}
	if s == nil || s.prefetch == 0 || !sameCosts(req) {
		// Per-rule costs that differ are decided one by one, without a
		// pool.
		return l.decideNow(ctx, s, req, op, horizon)
	}
	d, p, err := l.prefetched(ctx, s, req)
	if err != nil || d.Allowed {
		return d, err
	}
	if pt := l.splitOf(s, req, p); pt != nil && (op == opAllow || op == opReserve) {
		if d, done, err := l.splitDecide(ctx, s, pt, req, op, p); done {
			return d, err
		}
	}
	d, err = l.decideNow(ctx, s, req, op, horizon)
	if err == nil {
		l.resumed(s, req, p, d)
	}
	return d, err
}

// decideNow is decide without prefetched units.
func (l *Limiter) decideNow(ctx context.Context, s *Set, req Request, op int, horizon time.Duration) (Decision, error) {
	calls, err := l.bind(s, req, op == opAllow)
	if err != nil {
		return Decision{}, err
	}
	p := params{op: op, req: req, n: max(req.Cost, 1), horizon: horizon}
	gs := l.groups(calls)
	if op == opReserve && len(gs) > 1 {
		return l.reserveAcross(ctx, s, gs, p)
	}
	if s.named {
		p.nonce = requestNonce(s, calls)
	}
	rs, err := l.run(ctx, gs, p)
	if err != nil {
		return Decision{}, err
	}
	d := l.assemble(s, gs, rs, p)
	if len(gs) == 1 || d.Allowed {
		return d, nil
	}
	// Undo what some slots charged, and report the state after that.
	return l.undone(ctx, s, gs, rs, p, d)
}

// denied clears what only an admitted decision carries.
func (d Decision) denied() Decision {
	d.Allowed, d.Delay, d.Leases = false, 0, nil
	return d
}

// Refund undoes the charges of an admitted or booked Decision d made for
// req: GCRA rules get the cost back (exactly, if nothing was charged since;
// otherwise less the time since, as the bucket may have refilled), windows
// un-count it in the window it was charged to, sliding windows drop its
// entries and its leases are released. Use it when an admitted request did
// not happen. Refunding a denied decision does nothing.
func (l *Limiter) Refund(ctx context.Context, s *Set, req Request, d Decision) error {
	if !d.Allowed {
		return nil
	}
	if d.pf != nil {
		l.unfetch(poolKey(s, req), d)
		return nil
	}
	if d.split != nil {
		return l.unsplit(ctx, d.split)
	}
	if len(d.Leases) > 0 && d.Leases[0].kept != nil {
		// Kept slots: released as their holder would.
		var first error
		for _, ls := range d.Leases {
			if _, err := l.releaseKept(ctx, ls); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	calls, err := l.bind(s, req, true)
	if err != nil {
		return err
	}
	if len(d.ats) != len(calls) {
		return errors.New("quotas: the Decision is not from this Set")
	}
	withCosts(calls, d)
	for _, part := range byAt(calls, d.ats) {
		if _, err := l.run(ctx, l.groups(part), params{op: opRefund, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided()}); err != nil {
			return err
		}
	}
	return nil
}

// byAt returns calls in runs of the same charge time (ats, by rule): a
// refund or settle request carries one. Rules whose units were taken ahead
// by another process (time -1 in a Receipt: a GCRA or sliding rule's
// units; see Decision.receiptCharges) are left out: nothing of theirs goes
// back in Redis.
func byAt(calls []call, ats []int64) [][]call {
	var parts [][]call
	for _, c := range calls {
		at := ats[c.i]
		if at < 0 {
			continue
		}
		k := slices.IndexFunc(parts, func(p []call) bool { return ats[p[0].i] == at })
		if k < 0 {
			parts, k = append(parts, nil), len(parts)
		}
		parts[k] = append(parts[k], c)
	}
	return parts
}

// Settle changes the charges of an admitted or booked Decision d made for
// req to what the request actually cost: actual holds, per rule of s in
// order, the units really spent on it (0: nothing was spent); a negative
// value leaves that rule's charge as it is, as do concurrency rules. Where
// the actual cost is lower, the difference is given back as Refund would
// give back a charge of that many units: a GCRA booking of its own shrinks
// (a charge that extended the TAT moves it back, exactly if nothing was
// charged since, otherwise less the time since the charge, and never while
// later charges are booked beyond a burst ahead), a window un-counts it in
// the window it was charged to, a sliding window drops that many of the
// request's entries. Where it is higher, the difference is charged now
// without a conformance check: the units were spent, and later requests
// wait for them (a GCRA rule's TAT moves on from max(TAT, now), a window
// counts them in the window of now, a sliding window logs them now).
// Settle a Decision once, and do not Refund it afterwards: the charge it
// describes has changed. A denied Decision is not settled. A Decision
// admitted from prefetched units (Rule.Prefetch) cannot be settled (an
// error). d may come from ParseReceipt.
func (l *Limiter) Settle(ctx context.Context, s *Set, req Request, d Decision, actual []int) error {
	if !d.Allowed {
		return nil
	}
	if d.pf != nil || d.split != nil {
		return errors.New("quotas: a Decision admitted from prefetched units cannot be settled")
	}
	calls, err := l.bind(s, req, false)
	if err != nil {
		return err
	}
	p, err := settleParams(calls, req, d, actual)
	if err != nil || p.op < 0 {
		return err
	}
	for _, part := range byAt(calls, d.ats) {
		var gs [][]call
		for _, g := range l.groups(part) {
			if slices.ContainsFunc(g, func(c call) bool { return int64(p.acts[c.i]) != c.n }) {
				gs = append(gs, g)
			}
		}
		if len(gs) == 0 {
			continue
		}
		if _, err := l.run(ctx, gs, p); err != nil {
			return err
		}
	}
	return nil
}

// settleParams checks Settle's arguments and returns its params, with op
// -1 when nothing changes.
func settleParams(calls []call, req Request, d Decision, actual []int) (params, error) {
	if len(d.ats) != len(calls) {
		return params{}, errors.New("quotas: the Decision is not from this Set")
	}
	if len(actual) != len(calls) {
		return params{}, fmt.Errorf("quotas: Settle has %d actual costs for %d rules", len(actual), len(calls))
	}
	withCosts(calls, d)
	acts := make([]int, len(calls))
	change := false
	for i, c := range calls {
		acts[i] = actual[i]
		if acts[i] < 0 || c.c.kind == kindConcurrency || d.ats[i] < 0 {
			acts[i] = int(c.n)
		}
		change = change || int64(acts[i]) != c.n
	}
	if !change {
		return params{op: -1}, nil
	}
	return params{op: opSettle, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided(), acts: acts}, nil
}

// Held reports whether the booking an admitted or booked Decision d made
// for req on the set's first fair rule (Rule.Fair) is still its own: false
// once a request of a flow with less than its share took it over. A
// booking's owner asks before it runs; on false it has no slot and should
// refund d (which then gives back only its own, keyed rules: the taker
// inherited the rest) and decide again. A booking of an Adaptive rule is
// no longer held once the rule's rate was cut after d was decided, if its
// slot comes after the cut: it was booked at a rate the remote side
// refused; the owner refunds it (all of it) and decides again at the
// learned rate. With no fair or adaptive rule in the set it reports true
// without a call.
func (l *Limiter) Held(ctx context.Context, s *Set, req Request, d Decision) (bool, error) {
	if !d.Allowed || !s.fair && !s.adaptive {
		return true, nil
	}
	calls, err := l.bind(s, req, false)
	if err != nil {
		return false, err
	}
	if len(d.ats) != len(calls) {
		return false, errors.New("quotas: the Decision is not from this Set")
	}
	withCosts(calls, d)
	var gs [][]call
	for _, g := range l.groups(calls) {
		if slices.ContainsFunc(g, func(c call) bool { return c.c.fair || c.c.learn != nil }) {
			gs = append(gs, g)
		}
	}
	rs, err := l.run(ctx, gs, params{op: opHeld, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided()})
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if r.status != stAdmitted {
			return false, nil
		}
	}
	return true, nil
}

// Block makes the set's rules admit nothing for the request's keys until
// the given time: use it when the remote side answered "429 Too Many
// Requests, retry after ...", so that every worker backs off together.
// GCRA rules then resume at their rate (their TAT moves); window and
// concurrency rules keep the end in a key of their own (NAME:block, which
// lives until then), read by every decision, and their counts and slots
// are left as they are. A block is never shortened by a later, shorter
// one. until is compared with the server's clock (or Config.Now).
//
// An Adaptive rule cuts its learned rate on a Block, once per congestion:
// a Block within a second of its last cut is taken for the same one. When
// the call the remote side refused is known, BlockCall says so better.
func (l *Limiter) Block(ctx context.Context, s *Set, req Request, until time.Time) (Decision, error) {
	return l.BlockCall(ctx, s, req, until, time.Time{})
}

// BlockCall is Block for a throttle of a call whose Decision was made at
// decided (its Now): an Adaptive rule cuts its rate unless the call was
// decided before its last cut (it went out at the rate that cut
// answered); a call decided at or after the cut that is throttled too is
// new evidence, and cuts again at once, however soon. A zero decided is
// Block. Safe for concurrent use.
func (l *Limiter) BlockCall(ctx context.Context, s *Set, req Request, until, decided time.Time) (Decision, error) {
	l.dropPools()
	calls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, err
	}
	gs := l.groups(calls)
	p := params{op: opBlock, req: req, notBefore: until.UnixMicro()}
	if !decided.IsZero() {
		p.decided = decided.UnixMicro()
	}
	rs, err := l.run(ctx, gs, p)
	if err != nil {
		return Decision{}, err
	}
	return l.assemble(s, gs, rs, params{req: req}), nil
}

// Renew extends lease to its Duration from now if its holder still holds
// it under its token. It reports false when the lease was lost (expired and
// reclaimed, or re-acquired by a redelivery of the same holder); a kept
// slot's (Rule.Prefetch) lost lease is not handed out again.
func (l *Limiter) Renew(ctx context.Context, lease Lease) (bool, error) {
	ok, err := l.lease(ctx, lease, leaseRenew)
	if err == nil && lease.kept != nil {
		l.renewedKept(lease, ok)
	}
	return ok, err
}

// Release gives lease's slot back if its holder still holds it under its
// token; it reports whether it did. The slots of a set that keeps them
// (Rule.Prefetch of Concurrency rules) are kept in this process for its
// next request instead, while far from their limit; a lease released
// twice reports false the second time.
func (l *Limiter) Release(ctx context.Context, lease Lease) (bool, error) {
	if lease.kept != nil {
		return l.releaseKept(ctx, lease)
	}
	return l.lease(ctx, lease, leaseRelease)
}

func (l *Limiter) lease(ctx context.Context, ls Lease, op int) (bool, error) {
	if ls.zkey == "" {
		return false, errors.New("quotas: not a lease from a Decision")
	}
	tm, err := l.timing()
	if err != nil {
		return false, err
	}
	keys, args := ls.args(op, tm)
	var v []any
	if l.sharded {
		cmd := append(leaseProgram.Head(len(keys)), toAny(keys)...)
		var vs []any
		if vs, err = leaseProgram.Run(ctx, l.client, append(append(cmd, 1), args...)).Slice(); err == nil && len(vs) == 1 {
			v, _ = vs[0].([]any)
		}
	} else {
		v, err = l.leases.Do(ctx, keys, args, 0)
	}
	if err != nil {
		return false, fmt.Errorf("quotas: %w", err)
	}
	return leaseDone(v)
}

// args are the lease program's keys and arguments for op on ls
// (lease.lua).
func (ls Lease) args(op int, tm timing) ([]string, []any) {
	keys := ls.keys()
	return keys, []any{op, tm.now, tm.floor, holderField(ls.Holder), ls.Token, ls.Duration.Microseconds(), len(keys), ls.amin, ls.amax, ls.lat, b2i(ls.over)}
}

// leaseDone reads one lease's reply: whether it was renewed, released or
// dropped.
func leaseDone(v []any) (bool, error) {
	if len(v) != 1 {
		return false, fmt.Errorf("quotas: unexpected lease reply %v", v)
	}
	n, ok := v[0].(int64)
	if !ok {
		return false, fmt.Errorf("quotas: unexpected lease reply %v", v)
	}
	return n == 1, nil
}

// joinLeases is the batch.Join of the lease program: the number of leases,
// then each lease's arguments.
func joinLeases(cmd []any, jobs []*batch.Job) []any {
	cmd = append(cmd, len(jobs))
	for _, j := range jobs {
		cmd = append(cmd, j.Args...)
	}
	return cmd
}

// toAny returns keys as command arguments.
func toAny(keys []string) []any {
	out := make([]any, len(keys))
	for i, k := range keys {
		out[i] = k
	}
	return out
}
