package quotas

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/limits"
)

// Model is an in-memory twin of Limiter: the same rule sets, requests and
// decisions, computed in Go on its own clock instead of in Redis on the
// server's. It is the reference the Redis scripts are tested against
// (every rule kind, bookings, fair sharing, leases), and it serves
// simulations, such as estimating how long a campaign takes under a set of
// rules, and the middleware's in-process fallback. Like Limiter it is a
// Decider: its methods take a context and decide at its clock's time
// (NewModelOn); each has an explicit-time twin (AllowAt for Allow, and so
// on) that takes the decision time instead. A Decision or Lease from a
// Model is used with the same Model, as one from a Limiter with that
// Limiter.
//
// Times must not go backwards: state is kept and forgotten as the scripts
// keep and expire their keys, relative to the latest time seen. Calendar
// windows come straight from the schedule. Create a Model with NewModel
// (the zero value is not usable); it starts with every rule idle and keeps
// state for every key it has seen until the key's state no longer matters.
// A Model is safe for concurrent use.
type Model struct {
	clock func() time.Time
	mu    sync.Mutex
	// l binds requests to keys, as a Limiter with the default prefix; only
	// its prefix is used.
	l *Limiter
	m *model
}

// NewModel returns a Model with every rule idle whose context methods
// decide at time.Now.
func NewModel() *Model { return NewModelOn(time.Now) }

// NewModelOn returns a Model with every rule idle whose context methods
// decide at clock(): a virtual clock for a simulation, or the clock the
// caller keeps. clock must not go backwards (see Model); nil means
// time.Now.
func NewModelOn(clock func() time.Time) *Model {
	if clock == nil {
		clock = time.Now
	}
	return &Model{clock: clock, l: &Limiter{prefix: gcra.DefaultPrefix + "q:"}, m: newModel()}
}

// now is the model's clock, or ctx's error when ctx is done: a Model
// decides at once, but like a Limiter it does nothing for a context that
// has ended.
func (m *Model) now(ctx context.Context) (time.Time, error) {
	return m.clock(), ctx.Err()
}

// Allow is AllowAt at the model's clock.
func (m *Model) Allow(ctx context.Context, s *Set, req Request) (Decision, error) {
	now, err := m.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	return m.AllowAt(now, s, req)
}

// Reserve is ReserveAt at the model's clock.
func (m *Model) Reserve(ctx context.Context, s *Set, req Request, horizon time.Duration) (Decision, error) {
	now, err := m.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	return m.ReserveAt(now, s, req, horizon)
}

// Status is StatusAt at the model's clock.
func (m *Model) Status(ctx context.Context, s *Set, req Request) (Decision, error) {
	now, err := m.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	return m.StatusAt(now, s, req)
}

// Refund is RefundAt at the model's clock.
func (m *Model) Refund(ctx context.Context, s *Set, req Request, d Decision) error {
	now, err := m.now(ctx)
	if err != nil {
		return err
	}
	return m.RefundAt(now, s, req, d)
}

// Settle is SettleAt at the model's clock.
func (m *Model) Settle(ctx context.Context, s *Set, req Request, d Decision, actual []int) error {
	now, err := m.now(ctx)
	if err != nil {
		return err
	}
	return m.SettleAt(now, s, req, d, actual)
}

// Held is HeldAt at the model's clock.
func (m *Model) Held(ctx context.Context, s *Set, req Request, d Decision) (bool, error) {
	now, err := m.now(ctx)
	if err != nil {
		return false, err
	}
	return m.HeldAt(now, s, req, d)
}

// Block is BlockAt at the model's clock.
func (m *Model) Block(ctx context.Context, s *Set, req Request, until time.Time) (Decision, error) {
	now, err := m.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	return m.BlockAt(now, s, req, until)
}

// BlockCall is BlockCallAt at the model's clock.
func (m *Model) BlockCall(ctx context.Context, s *Set, req Request, until, decided time.Time) (Decision, error) {
	now, err := m.now(ctx)
	if err != nil {
		return Decision{}, err
	}
	return m.BlockCallAt(now, s, req, until, decided)
}

// Renew is RenewAt at the model's clock.
func (m *Model) Renew(ctx context.Context, lease Lease) (bool, error) {
	now, err := m.now(ctx)
	if err != nil {
		return false, err
	}
	return m.RenewAt(now, lease)
}

// Release is ReleaseAt at the model's clock.
func (m *Model) Release(ctx context.Context, lease Lease) (bool, error) {
	now, err := m.now(ctx)
	if err != nil {
		return false, err
	}
	return m.ReleaseAt(now, lease)
}

// AllowAt decides req at time now as Limiter.Allow does: it admits it if
// every rule of s admits it then, and charges every rule (concurrency rules
// hand out a Lease each); otherwise it charges nothing and names the rule
// with the longest wait.
func (m *Model) AllowAt(now time.Time, s *Set, req Request) (Decision, error) {
	return m.decide(now, s, req, opAllow, 0)
}

// ReserveAt books, at time now, the earliest moment at most horizon away at
// which every rule of s except concurrency rules admits req, as
// Limiter.Reserve does.
func (m *Model) ReserveAt(now time.Time, s *Set, req Request, horizon time.Duration) (Decision, error) {
	return m.decide(now, s, req, opReserve, max(horizon, 0))
}

// StatusAt reports every rule's state at time now without charging anything,
// as Limiter.Status does.
func (m *Model) StatusAt(now time.Time, s *Set, req Request) (Decision, error) {
	return m.decide(now, s, req, opStatus, 0)
}

func (m *Model) decide(now time.Time, s *Set, req Request, op int, horizon time.Duration) (Decision, error) {
	us, err := micros(now)
	if err != nil {
		return Decision{}, err
	}
	calls, err := m.l.bind(s, req, op == opAllow)
	if err != nil {
		return Decision{}, err
	}
	p := params{op: op, req: req, n: max(req.Cost, 1), horizon: horizon}
	if op == opStatus {
		p.n = 0
	}
	if s.named && op != opStatus {
		p.nonce = requestNonce(s, calls)
	}
	m.mu.Lock()
	r := m.m.decide(calls, op, us, int64(p.n), horizon.Microseconds(), 0, req.Holder, req.Critical, p.nonce)
	m.mu.Unlock()
	return m.l.assemble(s, [][]call{calls}, []reply{r}, params{req: req, n: p.n, nonce: p.nonce}), nil
}

// RefundAt undoes, at time now, the charges of an admitted or booked Decision
// d that m made for req, as Limiter.Refund does. Refunding a denied
// decision does nothing.
func (m *Model) RefundAt(now time.Time, s *Set, req Request, d Decision) error {
	if !d.Allowed {
		return nil
	}
	calls, us, err := m.charged(now, s, req, d, true)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	withCosts(calls, d)
	m.m.refund(calls, us, int64(d.cost), d.ats, d.undo, req.Holder, d.nonce, d.decided())
	return nil
}

// SettleAt changes, at time now, the charges of an admitted or booked
// Decision d that m made for req to the actual costs per rule, as
// Limiter.Settle does.
func (m *Model) SettleAt(now time.Time, s *Set, req Request, d Decision, actual []int) error {
	if !d.Allowed {
		return nil
	}
	calls, us, err := m.charged(now, s, req, d, false)
	if err != nil {
		return err
	}
	p, err := settleParams(calls, req, d, actual)
	if err != nil || p.op < 0 {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.settle(calls, us, p.acts, d.ats, d.undo, d.nonce, d.decided())
	return nil
}

// HeldAt reports, at time now, whether the booking an admitted or booked
// Decision d made for req on the first fair rule of s is still its own, as
// Limiter.Held does. With no fair rule in s it reports true.
func (m *Model) HeldAt(now time.Time, s *Set, req Request, d Decision) (bool, error) {
	if !d.Allowed || !s.fair && !s.adaptive {
		return true, nil
	}
	calls, us, err := m.charged(now, s, req, d, false)
	if err != nil {
		return false, err
	}
	withCosts(calls, d)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.learnLoad(calls, us, false)
	if !m.m.uncut(calls, us, d.ats, d.decided()) {
		return false, nil
	}
	return m.m.held(calls, d.ats, d.undo, d.nonce), nil
}

// charged binds req for an operation on the charges of d.
func (m *Model) charged(now time.Time, s *Set, req Request, d Decision, needHolder bool) ([]call, int64, error) {
	us, err := micros(now)
	if err != nil {
		return nil, 0, err
	}
	calls, err := m.l.bind(s, req, needHolder)
	if err != nil {
		return nil, 0, err
	}
	if len(d.ats) != len(calls) {
		return nil, 0, errors.New("quotas: the Decision is not from this Set")
	}
	return calls, us, nil
}

// BlockAt makes the rules of s admit nothing for req's keys until until, as
// Limiter.Block does at time now, and reports every rule's state after it.
func (m *Model) BlockAt(now time.Time, s *Set, req Request, until time.Time) (Decision, error) {
	return m.BlockCallAt(now, s, req, until, time.Time{})
}

// BlockCallAt is BlockAt for a throttle of a call decided at decided, as
// Limiter.BlockCall does.
func (m *Model) BlockCallAt(now time.Time, s *Set, req Request, until, decided time.Time) (Decision, error) {
	us, err := micros(now)
	if err != nil {
		return Decision{}, err
	}
	calls, err := m.l.bind(s, req, false)
	if err != nil {
		return Decision{}, err
	}
	m.mu.Lock()
	var dec int64
	if !decided.IsZero() {
		dec = decided.UnixMicro()
	}
	m.m.block(calls, us, until.UnixMicro(), dec)
	r := m.m.decide(calls, opStatus, us, 0, 0, 0, req.Holder, req.Critical, "")
	m.mu.Unlock()
	return m.l.assemble(s, [][]call{calls}, []reply{r}, params{req: req}), nil
}

// RenewAt extends lease, taken from m, to its Duration from now if its
// holder still holds it under its token, as Limiter.Renew does.
func (m *Model) RenewAt(now time.Time, lease Lease) (bool, error) {
	return m.lease(now, lease, false)
}

// ReleaseAt gives lease's slot, taken from m, back at time now if its holder
// still holds it under its token, as Limiter.Release does.
func (m *Model) ReleaseAt(now time.Time, lease Lease) (bool, error) {
	return m.lease(now, lease, true)
}

func (m *Model) lease(now time.Time, ls Lease, release bool) (bool, error) {
	if ls.zkey == "" {
		return false, errors.New("quotas: not a lease from a Decision")
	}
	us, err := micros(now)
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.expire(ls.zkey, us)
	if release {
		inflight := int64(len(m.m.holders[ls.zkey]))
		done := m.m.release(ls.zkey, ls.Holder, ls.Token)
		if done && ls.amin > 0 && (ls.lat > 0 || ls.over) {
			// (A release that reports nothing leaves the state as it is,
			// absent included: rules.lua's cl_sample writes nothing.)
			st, ok := m.m.slotLearns[ls.lkey]
			if !ok {
				st = slotStart(ls.amin)
			}
			next := st.sample(ls.amin, ls.amax, ls.lat, ls.over, inflight, us)
			switch {
			case next.l > st.l:
				m.m.slotRaised++
			case next.l < st.l:
				m.m.slotCut++
			}
			m.m.slotLearns[ls.lkey] = next
		}
		return done, nil
	}
	return m.m.renew(ls.zkey, ls.Holder, ls.Token, ls.Duration.Microseconds(), us), nil
}

// model is Model's state and decisions, without locking: the same
// decisions as the Lua rule-set script, computed in Go over in-memory
// state, on explicit times (µs), for calls bound as a Limiter binds them.
type model struct {
	// GCRA: per TAT key, the TAT (absent: none), the latest booking end
	// ever added (0: none), the bookings in end order, and the keys whose
	// TAT was set in this operation, with the time it was set at (booked.lua
	// writes them back at the end of a call).
	tats    map[string]int64
	lasts   map[string]int64
	books   map[string][]booking
	changed map[string]int64
	// Fair GCRA rules: blocks per TAT key, virtual finishes per flows key
	// and flow, and the current request's tag per TAT key (gc_load).
	blocks map[string]int64
	flows  map[string]map[string]int64
	// returned: per returned key and flow, the tags of bookings taken
	// over, in order (gc_return).
	returned map[string]map[string][]int64
	tags     map[string]fairTag
	steals   int // bookings taken over
	leaps    int // of which by a request of a higher priority than the owner's
	// yielded counts the allows a fair concurrency rule refused while it
	// had a slot free (left for flows before the request's).
	yielded int
	// aged counts the denials at a fair concurrency rule with priorities
	// whose flow waits at an earlier level than its own (for tests).
	aged    int
	victim  string // the owner of the last booking taken over
	wins    map[string]map[int64]int64
	logs    map[string][]logEntry
	holders map[string]map[string]int64 // key -> holder -> lease expiry
	tokens  map[string]map[string]int64
	seq     map[string]int64
	// Fair concurrency rules, per holders key: each holder's flow, the
	// slots each flow holds, and the flows waiting (rules.lua, cc_wait).
	flowOf  map[string]map[string]string
	slotsOf map[string]map[string]int64
	waits   map[string]map[string]ccWait
	// Other kinds than GCRA: per block key, until when a Block holds.
	tills map[string]int64
	// Adaptive rules: per learn key, the learned state.
	learns map[string]learned
	// Adaptive concurrency rules: per learn key, the learned state, and
	// how many releases raised and lowered a learned limit (for tests).
	slotLearns          map[string]slotLearned
	slotRaised, slotCut int
}

// slotCap is concurrency rule c's number of slots: Max, or for an
// adaptive rule the learned number (rules.lua's cl_load).
func (m *model) slotCap(c call) int64 {
	if c.c.amin == 0 {
		return c.c.max
	}
	st, ok := m.slotLearns[c.keys[2]]
	if !ok {
		st = slotStart(c.c.amin)
	}
	return st.slots(c.c.amin, c.c.max)
}

// booking is an interval [x, e) of a GCRA rule's virtual time booked by a
// request named owner for real time t, with its fair-share tag and the
// digest g of its global rules.
type booking struct {
	x, e, tag, t int64
	g, owner     string
}

// fairTag is what a request brings to a fair rule: its tag, the waiting
// flows' weights (booked.lua's W), its flow's weight, its priority's lead
// (leadOf), whether it is critical, and whether the tag is one returned to
// its flow (gc_load).
type fairTag struct {
	tag, nact, weight, lead int64
	critical, returned      bool
}

// returnedMax mirrors booked.lua's returned_max: how many tags a flow keeps
// returned.
const returnedMax = 64

// leadOf mirrors booked.lua's gc_lead: how much earlier than its finish a
// request of flow (its level after '!') is tagged at a rule aging aging µs
// per level.
func leadOf(aging int64, flow string) int64 {
	if aging == 0 {
		return 0
	}
	return (limits.DefaultPriority - levelOf(flow)) * aging
}

// levelOf is the priority of the requests of flow: its level after '!',
// or the default.
func levelOf(flow string) int64 {
	p := int64(limits.DefaultPriority)
	if i := strings.LastIndexByte(flow, '!'); i >= 0 {
		p, _ = strconv.ParseInt(flow[i+1:], 10, 64)
	}
	return p
}

// round mirrors booked.lua's gc_round: how far a charge of n moves the
// flow's finish.
func (ft fairTag) round(n, em int64) int64 { return n * em * ft.nact / ft.weight }

// blockKey is the key under which the model keeps until when a Block
// holds rule c (not GCRA): a concurrency rule's tokens hash, else its last
// key, as the Lua keeps it.
func blockKey(c call) string {
	if c.c.kind == kindConcurrency {
		return c.keys[1]
	}
	return c.keys[len(c.keys)-1]
}

// ccWait is a flow waiting at a fair concurrency rule: until when, and its
// weight then; with priorities, since when it waits (-1: rules.lua's "s"
// field absent) and the level part of its rank.
type ccWait struct{ until, weight, since, level int64 }

// ccRank mirrors rules.lua's cc_rank: the rank of a flow holding held
// slots at weight w.
func ccRank(held, w int64) int64 { return (held + 1) * 1000000 / w }

// ccLevel mirrors rules.lua's CC_LEVEL: a level's part of a waiting flow's
// rank.
const ccLevel = 10000000000000

// ccBase mirrors rules.lua's cc_base: the level part of the rank of flow
// (its level after '!') at concurrency rule c, 0 without priorities.
func ccBase(c call, flow string) int64 {
	if c.c.aging == 0 {
		return 0
	}
	return levelOf(flow) * ccLevel
}

// waitLevel mirrors cc_load's reading of the level c's flow waits at now,
// and since when it waits (rules.lua, Priorities).
func (m *model) waitLevel(c call, now int64) (level, since int64) {
	if c.c.aging == 0 {
		return 0, now
	}
	since = now
	if w, ok := m.waits[c.keys[0]][c.flow]; ok && w.until > now && w.since >= 0 {
		since = w.since
	}
	since = min(since, now-c.before)
	return max(ccLevel, ccBase(c, c.flow)-(now-since)/c.c.aging*ccLevel), since
}

// ccWaitFor and ccRetry mirror rules.lua's CC_WAIT and CC_RETRY (µs).
const (
	ccWaitFor = 1000000
	ccRetry   = 100000
)

type logEntry struct {
	at int64
	id string
}

func newModel() *model {
	return &model{tats: map[string]int64{}, lasts: map[string]int64{}, books: map[string][]booking{}, changed: map[string]int64{},
		blocks: map[string]int64{}, flows: map[string]map[string]int64{}, returned: map[string]map[string][]int64{}, tags: map[string]fairTag{}, wins: map[string]map[int64]int64{}, logs: map[string][]logEntry{},
		holders: map[string]map[string]int64{}, tokens: map[string]map[string]int64{}, seq: map[string]int64{}, tills: map[string]int64{},
		flowOf: map[string]map[string]string{}, slotsOf: map[string]map[string]int64{}, waits: map[string]map[string]ccWait{},
		learns: map[string]learned{}, slotLearns: map[string]slotLearned{}}
}

func (m *model) window(c call, t int64) (int64, int64) {
	if c.c.kind == kindFixed {
		s := t - t%c.c.every
		return s, s + c.c.every
	}
	s, e := c.c.sched.Window(time.UnixMicro(t))
	return s.UnixMicro(), e.UnixMicro()
}

// winEarliest mirrors rules.lua's win_earliest: the earliest t' >= t at
// which a window rule has room for n, regardless of a block.
func (m *model) winEarliest(c call, t, n int64) int64 {
	if n > c.c.limit {
		return -1
	}
	for i := 0; i < 64; i++ {
		s, e := m.window(c, t)
		if m.wins[c.keys[0]][s]+n <= c.c.limit {
			return t
		}
		t = e
	}
	return t
}

func (m *model) earliest(c call, t, n, now, ahead int64, holder string, critical bool) int64 {
	k := c.keys[0]
	if c.c.kind != kindGCRA {
		t = max(t, m.tills[blockKey(c)])
	}
	switch c.c.kind {
	case kindGCRA:
		a, _, _ := m.fit(c, t, n, now, ahead)
		return a
	case kindFixed, kindCalendar:
		return m.winEarliest(c, t, n)
	case kindSliding:
		return m.slidingEarliest(c, t, n)
	}
	if m.slotFree(c, now, holder, critical) {
		return t
	}
	hs := m.holders[k]
	if len(hs) == 0 {
		return t + ccRetry
	}
	first := int64(1) << 62
	for _, e := range hs {
		first = min(first, e)
	}
	return max(t, first)
}

// slotFree mirrors rules.lua's cc_earliest: whether concurrency rule c
// gives holder a slot (one it holds is replaced).
func (m *model) slotFree(c call, now int64, holder string, critical bool) bool {
	capacity := m.slotCap(c)
	if !critical {
		capacity -= c.c.reserved
	}
	hs := m.holders[c.keys[0]]
	_, ok := hs[holder]
	return ok || int64(len(hs)) < capacity && (!c.c.cfair || critical || !m.ahead(c, capacity-int64(len(hs)), now))
}

// ahead mirrors rules.lua's cc_ahead: whether at least free flows other
// than c's wait at its fair concurrency rule ranking below c's flow, or
// one of an earlier level.
func (m *model) ahead(c call, free, now int64) bool {
	k := c.keys[0]
	lvl, _ := m.waitLevel(c, now)
	p, n := ccRank(m.slotsOf[k][c.flow], c.weight)+lvl, int64(0)
	for f, w := range m.waits[k] {
		if f != c.flow && w.until > now && ccRank(m.slotsOf[k][f], w.weight)+w.level < p {
			if w.level < lvl {
				return true // an earlier level takes every free slot first
			}
			n++
		}
	}
	return n >= free
}

// others reports whether a flow other than c's waits at its fair
// concurrency rule (rules.lua's cc_ahead of any rank).
func (m *model) others(c call, now int64) bool {
	for f, w := range m.waits[c.keys[0]] {
		if f != c.flow && w.until > now {
			return true
		}
	}
	return false
}

// dropFlow takes holder's slot at concurrency key k from the flow it was
// with, if any.
func (m *model) dropFlow(k, holder string) {
	if old, ok := m.flowOf[k][holder]; ok {
		if m.slotsOf[k][old]--; m.slotsOf[k][old] <= 0 {
			delete(m.slotsOf[k], old)
		}
		delete(m.flowOf[k], holder)
	}
}

// moveFlow gives holder's slot at concurrency key k to flow, taking it
// from the flow it was with.
func (m *model) moveFlow(k, holder, flow string) {
	m.dropFlow(k, holder)
	if m.flowOf[k] == nil {
		m.flowOf[k], m.slotsOf[k] = map[string]string{}, map[string]int64{}
	}
	m.flowOf[k][holder] = flow
	m.slotsOf[k][flow]++
}

// slidingEarliest mirrors rules.lua's sl_earliest: the earliest t' >= t at
// which every window a request at t' counts in keeps n units of room.
func (m *model) slidingEarliest(c call, t, n int64) int64 {
	limit, every := c.c.limit, c.c.every
	if n > limit {
		return -1
	}
	room := limit - n
	if int64(len(m.logs[c.keys[0]])) <= room {
		return t
	}
	for range 64 {
		log := m.logs[c.keys[0]]
		lo := sort.Search(len(log), func(i int) bool { return log[i].at > t-every })
		hi := lo + sort.Search(len(log)-lo, func(i int) bool { return log[lo+i].at >= t+every })
		ts := make([]int64, hi-lo)
		for i, e := range log[lo:hi] {
			ts[i] = e.at
		}
		if int64(len(ts)) <= room {
			return t
		}
		// The count of the window ending at x, from t on, and where the
		// last stretch of windows without room ends.
		var count, last int64
		full, found := false, false
		j, k := 0, 0
		for j < len(ts) && ts[j] <= t {
			count, j = count+1, j+1
		}
		full = count > room
		for k < j || j < len(ts) {
			x := int64(-1)
			if k < j {
				x = ts[k] + every
			}
			if j < len(ts) && (x < 0 || ts[j] < x) {
				x = ts[j]
			}
			for k < j && ts[k]+every <= x {
				count, k = count-1, k+1
			}
			for j < len(ts) && ts[j] <= x {
				count, j = count+1, j+1
			}
			if full && count <= room {
				full, last, found = false, x, true
			} else if count > room {
				full = true
			}
		}
		if !found {
			return t
		}
		t = last
	}
	return t
}

func (m *model) status(c call, now int64) (used, rem, reset int64) {
	k := c.keys[0]
	switch c.c.kind {
	case kindGCRA:
		em := c.em
		g1, till, rem := now, now+em*c.c.burst, int64(0)
		if tat, ok := m.tats[k]; ok && tat > now {
			g1 = tat
		}
		// As booked.lua's walk: at most 64 bookings from the first gap on,
		// the time beyond them counted as taken.
		from, seen := g1, 0
		for _, b := range m.booked(k, from) {
			if b.x >= till {
				break
			}
			if b.x > g1 {
				rem += (b.x - g1) / em
			}
			g1 = max(g1, b.e)
			if seen++; seen == 64 {
				if m.lasts[k] > from {
					g1 = till
				}
				break
			}
		}
		if g1 < till {
			rem += (till - g1) / em
		}
		return c.c.burst - rem, rem, max(g1, m.lasts[k], now) - now
	case kindFixed, kindCalendar:
		s, e := m.window(c, now)
		used = m.wins[k][s]
		return used, max(0, c.c.limit-used), e - now
	case kindSliding:
		log := m.logs[k]
		used = int64(len(log))
		if len(log) > 0 {
			reset = max(0, log[0].at+c.c.every-now)
		}
		return used, max(0, c.c.limit-used), reset
	}
	hs := m.holders[k]
	if len(hs) > 0 {
		first := int64(1) << 62
		for _, e := range hs {
			first = min(first, e)
		}
		reset = first - now
	}
	return int64(len(hs)), max(0, m.slotCap(c)-int64(len(hs))), reset
}

func (m *model) housekeep(calls []call, now int64) {
	for _, c := range calls {
		k := c.keys[0]
		switch c.c.kind {
		case kindConcurrency:
			m.expire(k, now)
			for f, w := range m.waits[k] {
				if w.until <= now {
					delete(m.waits[k], f) // ended: as absent (cc_ahead)
				}
			}
		case kindSliding:
			// The log is in time order: the entries out of every window
			// from now on are its start.
			log := m.logs[k]
			m.logs[k] = log[sort.Search(len(log), func(i int) bool { return log[i].at > now-c.c.every }):]
		}
	}
}

// expire forgets the holders of concurrency key k whose leases ended by
// now.
func (m *model) expire(k string, now int64) {
	for h, e := range m.holders[k] {
		if e <= now {
			delete(m.holders[k], h)
			delete(m.tokens[k], h)
			m.dropFlow(k, h)
		}
	}
}

// decide mirrors lua/quotas.lua's decide for one group of calls: op allow,
// reserve or status. It returns the reply the script would give.
func (m *model) decide(calls []call, op int, now, n, horizon, notBefore int64, holder string, critical bool, nonce string) reply {
	// cost is the units rule c is charged: its call's (Request.Costs), else n.
	cost := func(c call) int64 {
		if c.n > 0 {
			return c.n
		}
		return n
	}
	m.housekeep(calls, now)
	m.learnLoad(calls, now, op != opStatus)
	m.load(calls, now, critical)
	// next: per call, for a fair concurrency rule that refused with no
	// block in force, 2 if another waiting flow ranks below the request's,
	// else 1 if no slot is free and the request's flow is the next of
	// several waiting (rules.lua's cc_earliest, r.behind and r.next).
	next := make([]int64, len(calls))
	out := func(st, wait, rule, t int64, undo map[int][2]int64) reply {
		r := reply{status: st, wait: wait, rule: rule, now: now, at: t}
		for j, c := range calls {
			u, rem, reset := m.status(c, now)
			var em int64
			switch {
			case c.c.kind == kindGCRA:
				em = c.em
			case c.c.amin > 0:
				em = m.slotCap(c)
			default:
				em = next[j]
			}
			r.rules = append(r.rules, [replyRule]int64{u, rem, reset, undo[j][0], undo[j][1], em})
		}
		return r
	}
	if op == opStatus {
		return out(stAdmitted, 0, 0, now, nil)
	}
	// An allow's horizon is how far ahead a batch's GCRA charge is placed
	// (booked.lua's ahead).
	var ahead int64
	if op == opAllow {
		ahead = horizon
	}
	t, wait, worst, agreed := now, int64(0), int64(0), false
	if op == opReserve {
		t = max(now, notBefore)
	}
	for iter := 0; iter < 16; iter++ {
		nt := t
		for i, c := range calls {
			if op == opReserve && c.c.kind == kindConcurrency {
				continue
			}
			e := m.earliest(c, t, cost(c), now, ahead, holder, critical)
			if e < 0 {
				return out(stDenied, -1, int64(i+1), now, nil)
			}
			if c.c.cfair && !critical && !m.slotFree(c, now, holder, critical) && m.tills[blockKey(c)] <= now {
				switch {
				case m.ahead(c, 1, now):
					next[i] = 2
				case int64(len(m.holders[c.keys[0]])) >= c.c.max-c.c.reserved && m.others(c, now):
					next[i] = 1
				}
			}
			if op == opAllow {
				if e-now > wait {
					wait, worst = e-now, int64(i+1)
				}
			} else if e > nt {
				nt, worst = e, int64(i+1)
			}
		}
		if op == opAllow || nt == t {
			agreed = true
			break
		}
		t = nt
	}
	if op == opAllow && worst > 0 {
		// The flows a fair concurrency rule refused wait for its slots
		// (quotas.lua's decide, cc_wait).
		for _, c := range calls {
			if c.c.cfair && !m.slotFree(c, now, holder, critical) {
				if int64(len(m.holders[c.keys[0]])) < c.c.max-c.c.reserved {
					m.yielded++
				}
				if m.waits[c.keys[0]] == nil {
					m.waits[c.keys[0]] = map[string]ccWait{}
				}
				lvl, since := m.waitLevel(c, now)
				if lvl < ccBase(c, c.flow) {
					m.aged++
				}
				m.waits[c.keys[0]][c.flow] = ccWait{until: now + ccWaitFor, weight: c.weight, since: since, level: lvl}
			}
		}
		return out(stDenied, wait, worst, now, nil)
	}
	// A reserve books t unless denied (deny: the wait and rule); a set with
	// a fair rule may take a booking over instead.
	var deny *[2]int64
	if op == opReserve && (!agreed || t-now > horizon) {
		deny = &[2]int64{t - now, worst}
	} else if op == opReserve {
		// Never across the reset of a full window longer than the horizon.
		from := max(now, notBefore)
		for i, c := range calls {
			if c.c.kind != kindFixed && c.c.kind != kindCalendar {
				continue
			}
			start, stop := m.window(c, from)
			if t >= stop && stop-start > horizon && m.winEarliest(c, from, cost(c)) >= stop {
				deny = &[2]int64{t - now, int64(i + 1)}
				break
			}
		}
	}
	fair := slices.IndexFunc(calls, func(c call) bool { return c.c.fair })
	victim := -1 // the index of the booking taken over
	if op == opReserve && fair >= 0 {
		limit := now + horizon + 1
		if deny == nil {
			limit = t
		}
		m.takeable(calls[fair], max(now, notBefore), cost(calls[fair]), now, func(bt, x int64, i int) bool {
			if bt >= limit {
				return true
			}
			for _, c := range calls {
				if own(c) && c.c.kind != kindConcurrency && m.earliest(c, bt, cost(c), now, 0, holder, critical) != bt {
					return false
				}
			}
			t, deny, victim = bt, nil, i
			return true
		})
	}
	if deny != nil {
		return out(stDenied, deny[0], deny[1], now, nil)
	}
	owner := ""
	if victim >= 0 {
		owner = m.books[calls[fair].keys[0]][victim].owner
		m.victim = owner
		m.steals++
		if c := calls[fair]; leadOf(c.c.aging, c.flow) > leadOf(c.c.aging, owner) {
			m.leaps++
		}
	}
	undo := map[int][2]int64{}
	for j, c := range calls {
		k, n := c.keys[0], cost(c)
		if victim >= 0 && j != fair && !own(c) {
			// Inherited from the booking's owner.
			switch c.c.kind {
			case kindGCRA:
				till := t + c.c.burst*c.em
				for i, b := range m.books[k] {
					if b.e <= t {
						continue
					}
					if b.x >= till {
						break
					}
					if b.t == t && b.owner == owner {
						m.books[k][i].owner, m.books[k][i].g = nonce, c.digest
						undo[j] = [2]int64{-b.x, b.tag}
						break
					}
				}
			case kindSliding:
				for i := range m.logs[k] {
					if m.logs[k][i].id == owner {
						m.logs[k][i].id = nonce
					}
				}
			}
			continue
		}
		switch c.c.kind {
		case kindGCRA:
			var x int64
			var front bool
			if m.tags[k].returned {
				// Charged at a tag returned to its flow, which its finish
				// already counts (booked.lua's gc_charge).
				back := m.returned[c.keys[3]]
				if back[c.flow] = back[c.flow][1:]; len(back[c.flow]) == 0 {
					delete(back, c.flow)
				}
			}
			if j == fair && victim >= 0 {
				v := m.books[k][victim]
				x = v.x
				m.books[k] = append(m.books[k][:victim:victim], m.books[k][victim+1:]...)
				// The owner's flow gets its round back (booked.lua): with
				// priorities one round off its finish, else the lost
				// booking's tag for its next charge.
				if fs, parts := m.flows[c.keys[2]], strings.Split(v.owner, ":"); len(parts) >= 3 {
					vw, _ := strconv.ParseInt(parts[len(parts)-2], 10, 64)
					vf := parts[len(parts)-1]
					if c.c.aging == 0 {
						m.giveBack(c.keys[3], vf, v.tag)
					} else if to, ok := fs[vf]; ok {
						to -= n * c.em * m.tags[k].nact / vw
						for i := int64(1); i <= vw; i++ {
							m := vf
							if i > 1 {
								m += "#" + strconv.FormatInt(i, 10)
							}
							if _, in := fs[m]; in {
								fs[m] = to
							}
						}
					}
				}
			} else {
				_, x, front = m.fit(c, t, n, now, ahead)
			}
			e := x + n*c.em
			if front && !c.c.fair {
				undo[j] = [2]int64{e, m.tats[k]}
				m.setTAT(k, e, now)
				continue
			}
			ft := m.tags[k]
			// Bookings never overlap: their ends are distinct and order them.
			bs := m.books[k]
			bs = slices.Insert(bs, len(bs)-len(m.booked(k, e)), booking{x: x, e: e, tag: ft.tag, t: t, g: c.digest, owner: nonce})
			if m.lasts[k] > now {
				// Bookings that ended more than keep ago are dropped.
				bs = bs[sort.Search(len(bs), func(i int) bool { return bs[i].e > now-keep }):]
			}
			m.books[k] = bs
			if front {
				m.setTAT(k, e, now)
			}
			if e > m.lasts[k] {
				m.lasts[k] = e
				tat, ok := m.tats[k]
				if !ok {
					tat = now
				}
				m.setTAT(k, tat, now)
			}
			if c.c.fair && !ft.critical && !ft.returned {
				fs := m.flows[c.keys[2]]
				if fs == nil {
					fs = map[string]int64{}
					m.flows[c.keys[2]] = fs
				}
				f := ft.tag + ft.lead + ft.round(n, c.em)
				fs[c.flow] = f
				for i := int64(2); i <= ft.weight; i++ {
					fs[c.flow+"#"+strconv.FormatInt(i, 10)] = f
				}
				for f, v := range fs {
					if v <= now {
						delete(fs, f)
					}
				}
			}
			undo[j] = [2]int64{-x, ft.tag}
		case kindFixed, kindCalendar:
			s, _ := m.window(c, t)
			if m.wins[k] == nil {
				m.wins[k] = map[int64]int64{}
			}
			m.wins[k][s] += n
			if m.wins[k][s] == n { // a new window: forget ended ones
				cur, _ := m.window(c, now)
				for ws := range m.wins[k] {
					if ws < cur {
						delete(m.wins[k], ws)
					}
				}
			}
		case kindSliding:
			// After the entries at or before t, keeping the log in order.
			log := m.logs[k]
			i := sort.Search(len(log), func(i int) bool { return log[i].at > t })
			m.logs[k] = slices.Insert(log, i, slices.Repeat([]logEntry{{at: t, id: nonce}}, int(n))...)
		case kindConcurrency:
			if op != opAllow {
				continue
			}
			if m.holders[k] == nil {
				m.holders[k], m.tokens[k] = map[string]int64{}, map[string]int64{}
			}
			m.holders[k][holder] = now + c.c.lease
			if c.c.cfair {
				if w, ok := m.waits[k][c.flow]; ok && c.c.aging > 0 && w.until > now && w.since >= 0 {
					// The slot ends the flow's wait (rules.lua's
					// cc_acquire).
					w.since, w.level = -1, ccBase(c, c.flow)
					m.waits[k][c.flow] = w
				}
				m.moveFlow(k, holder, c.flow)
			}
			m.seq[k] = max(m.seq[k]+1, now)
			m.tokens[k][holder] = m.seq[k]
			undo[j] = [2]int64{m.seq[k], 0}
		}
	}
	for j, c := range calls {
		if p := c.c.learn; p != nil && !(victim >= 0 && j != fair && !own(c)) {
			// learn.lua's ad_grow, after the charge.
			m.learns[learnKey(c)] = p.grow(m.learned(c, now), now, m.tats[c.keys[0]])
		}
	}
	m.flush()
	return out(stAdmitted, t-now, 0, t, undo)
}

// load mirrors booked.lua's gc_load for fair rules: the request's tag and
// the waiting flows' weights.
func (m *model) load(calls []call, now int64, critical bool) {
	clear(m.tags)
	for _, c := range calls {
		if !c.c.fair {
			continue
		}
		if critical {
			m.tags[c.keys[0]] = fairTag{tag: 0, nact: 1, weight: 1, critical: true}
			continue
		}
		fs := m.flows[c.keys[2]]
		var n int64
		for _, f := range fs {
			if f > now {
				n++
			}
		}
		f := fs[c.flow]
		if f <= now {
			f, n = now, n+c.weight
		}
		lead := leadOf(c.c.aging, c.flow)
		ft := fairTag{tag: f - lead, nact: n, weight: c.weight, lead: lead}
		if back := m.returned[c.keys[3]][c.flow]; c.c.aging == 0 && len(back) > 0 {
			ft.tag, ft.returned = back[0], true
		}
		m.tags[c.keys[0]] = ft
	}
}

// freeze and keep are booked.lua's: how far ahead a booking must start to
// be taken over, and how long it is kept after it ended.
const freeze, keep = 250000, 10000000

// takeable mirrors booked.lua's gc_takeable: it calls visit with the
// moment, start and index of each booking of fair rule c that a reserve of
// cost n and digest g may take over, in order, until visit returns true.
func (m *model) takeable(c call, t0, n, now int64, visit func(t, x int64, i int) bool) {
	k := c.keys[0]
	need, ft := n*c.em, m.tags[k]
	low, over := max(t0, now+freeze), ft.tag+ft.round(n, c.em)
	seen, skip := 0, len(m.books[k])-len(m.booked(k, low+need))
	for i, b := range m.booked(k, low+need) {
		i += skip
		if seen++; seen > 256 {
			return
		}
		// At a rule with priorities, not a booking of its own flow and
		// level (booked.lua's gc_takeable).
		own := !ft.critical && c.c.aging > 0 && strings.HasSuffix(b.owner, ":"+c.flow)
		if b.e-b.x == need && b.t >= low && b.g == c.digest && b.tag > over && !own && visit(b.t, b.x, i) {
			return
		}
	}
}

// fit mirrors booked.lua's gc_fit (gc_gap): the earliest time a >= t0 at
// which a GCRA request of cost n fits in free virtual time at or after
// now+ahead (a batch's), its start x, and whether it extends the TAT.
func (m *model) fit(c call, t0, n, now, ahead int64) (a, x int64, front bool) {
	em, burst := c.em, c.c.burst
	if n > burst {
		return -1, 0, false
	}
	need, slack := n*em, (burst-n)*em
	k := c.keys[0]
	g1, first := now+ahead, true
	if tat, ok := m.tats[k]; ok && tat > g1 {
		g1 = tat
	}
	try := func(g2 int64, bounded bool) bool {
		a = max(t0, g1+need-burst*em)
		x = g1
		if a > g1 {
			x = a
			if slack > 0 {
				x = (a + em - 1) / em * em
			}
		}
		if bounded && x+need > g2 {
			return false
		}
		front = first && x-g1 < em
		return true
	}
	for _, b := range m.booked(k, max(t0, g1)) {
		if b.x > g1 {
			if try(b.x, true) {
				return a, x, front
			}
			first = false
		}
		g1 = max(g1, b.e)
	}
	try(0, false)
	return a, x, front
}

// booked returns GCRA key k's bookings that end at or after from, in
// order: the bookings before them end earlier, as none overlap.
func (m *model) booked(k string, from int64) []booking {
	bs := m.books[k]
	return bs[sort.Search(len(bs), func(i int) bool { return bs[i].e >= from }):]
}

// own reports whether a request is charged rule c on its own, not sharing
// it with a request whose booking it takes over: a keyed rule, not fair.
func own(c call) bool { return c.key != "" && !c.c.fair }

// setTAT records key's new TAT, as booked.lua's tat_set.
func (m *model) setTAT(k string, tat, now int64) {
	m.tats[k] = tat
	m.changed[k] = now
	m.flush()
}

// flush mirrors booked.lua's gc_flush: a key lives while its TAT or latest
// booking end is ahead, and forgets its latest booking end once passed.
func (m *model) flush() {
	for k, now := range m.changed {
		if m.blocks[k] <= now {
			delete(m.blocks, k)
		}
		if max(m.tats[k], m.lasts[k]) <= now {
			delete(m.tats, k)
			delete(m.lasts, k)
			delete(m.blocks, k)
			continue
		}
		if m.lasts[k] <= now {
			delete(m.lasts, k)
		}
	}
	clear(m.changed)
}

// back mirrors booked.lua's gc_back: the TAT of c's key (cur, 0 if none)
// after giving back up to back µs of a charge made at t that extended it,
// when charges were made since.
func (m *model) back(c call, cur, t, back, now int64) int64 {
	tat := max(cur, now)
	if tat > now+c.em*c.c.burst {
		return tat
	}
	low := tat - max(0, back-(now-t))
	for _, b := range m.books[c.keys[0]] {
		if b.e > low && b.x < tat {
			low = max(low, b.e)
		}
	}
	return min(tat, low)
}

// uncount takes n units off the window of c that holds t (win_refund).
func (m *model) uncount(c call, t, n int64) {
	k := c.keys[0]
	s, _ := m.window(c, t)
	if m.wins[k][s] <= n {
		delete(m.wins[k], s)
	} else {
		m.wins[k][s] -= n
	}
}

// unlog removes n of the sliding log k's entries named nonce (sl_refund).
func (m *model) unlog(k, nonce string, n int64) {
	log := m.logs[k][:0]
	removed := int64(0)
	for _, e := range m.logs[k] {
		if e.id == nonce && removed < n {
			removed++
			continue
		}
		log = append(log, e)
	}
	m.logs[k] = log
}

// refund mirrors lua/quotas.lua's refund of a charge made at ats[rule].
func (m *model) refund(calls []call, now, n int64, ats []int64, undo [][2]int64, holder, nonce string, decided int64) {
	m.housekeep(calls, now)
	m.learnLoad(calls, now, false)
	// A booking taken over gives back only the rules not shared.
	taken := !m.held(calls, ats, undo, nonce)
	for _, c := range calls {
		k, t, u := c.keys[0], ats[c.i], undo[c.i]
		n := n
		if c.n > 0 {
			n = c.n
		}
		if taken && !own(c) || c.c.learn != nil && decided > 0 && m.learned(c, now).d > decided {
			// Taken over; or decided before a cut that reset the rule.
			continue
		}
		switch c.c.kind {
		case kindGCRA:
			if u[0] < 0 {
				x := -u[0]
				bs := m.books[k]
				for i, b := range bs {
					if b.x == x && b.tag == u[1] && b.t == t && b.g == c.digest && b.owner == nonce {
						m.books[k] = append(bs[:i:i], bs[i+1:]...)
						if tat, ok := m.tats[k]; ok && c.c.fair && x < tat {
							m.setTAT(k, max(x, m.blocks[k]), now)
						}
						break
					}
				}
				continue
			}
			tat := u[1]
			if cur, ok := m.tats[k]; !ok || cur != u[0] {
				tat = m.back(c, cur, t, min(n*c.em, u[0]-max(u[1], t)), now)
			}
			m.setTAT(k, tat, now)
		case kindFixed, kindCalendar:
			m.uncount(c, t, n)
		case kindSliding:
			m.unlog(k, nonce, n)
		case kindConcurrency:
			m.release(k, holder, u[0])
		}
	}
	m.flush()
}

// settle mirrors lua/quotas.lua's settle (gc_settle in booked.lua): each
// call's charge (c.n units) becomes acts[c.i] units.
func (m *model) settle(calls []call, now int64, acts []int, ats []int64, undo [][2]int64, nonce string, decided int64) {
	m.housekeep(calls, now)
	m.learnLoad(calls, now, false)
	taken := !m.held(calls, ats, undo, nonce)
	for _, c := range calls {
		k, t, u, n := c.keys[0], ats[c.i], undo[c.i], c.n
		d := n - int64(acts[c.i])
		if d == 0 || c.c.kind == kindConcurrency || taken && !own(c) ||
			d > 0 && c.c.learn != nil && decided > 0 && m.learned(c, now).d > decided {
			continue
		}
		switch c.c.kind {
		case kindGCRA:
			cur, ok := m.tats[k]
			if d < 0 {
				if !ok {
					cur = now
				}
				m.setTAT(k, max(cur, now)-d*c.em, now)
				continue
			}
			if u[0] < 0 {
				x := -u[0]
				bs := m.books[k]
				for i, b := range bs {
					if b.x != x || b.tag != u[1] || b.t != t || b.g != c.digest || b.owner != nonce {
						continue
					}
					ne := x + (b.e-x)/n*(n-d)
					if ne <= x {
						ne = x
						m.books[k] = append(bs[:i:i], bs[i+1:]...)
					} else {
						m.books[k][i].e = ne
					}
					if ok && c.c.fair && ne < cur {
						m.setTAT(k, max(ne, m.blocks[k]), now)
					}
					break
				}
				continue
			}
			back := max(0, min(d*c.em, u[0]-max(u[1], t)))
			tat := u[0] - back
			if !ok || cur != u[0] {
				tat = m.back(c, cur, t, back, now)
			}
			m.setTAT(k, tat, now)
		case kindFixed, kindCalendar:
			if d > 0 {
				m.uncount(c, t, d)
				continue
			}
			s, _ := m.window(c, now)
			if m.wins[k] == nil {
				m.wins[k] = map[int64]int64{}
			}
			m.wins[k][s] -= d
			if m.wins[k][s] == -d { // a new window: forget ended ones
				for ws := range m.wins[k] {
					if ws < s {
						delete(m.wins[k], ws)
					}
				}
			}
		case kindSliding:
			if d > 0 {
				m.unlog(k, nonce, d)
				continue
			}
			log := m.logs[k]
			i := sort.Search(len(log), func(i int) bool { return log[i].at > now })
			m.logs[k] = slices.Insert(log, i, slices.Repeat([]logEntry{{at: now, id: nonce}}, int(-d))...)
		}
	}
	m.flush()
}

// block mirrors lua/quotas.lua's block, for a call decided at decided (µs,
// 0: unknown).
func (m *model) block(calls []call, now, until, decided int64) {
	m.housekeep(calls, now)
	m.learnLoad(calls, now, true)
	for i, c := range calls {
		if p := c.c.learn; p != nil {
			l, cut := p.cut(m.learned(c, now), now, until, decided)
			m.learns[learnKey(c)] = l
			c.em = intervalOf(l.r)
			calls[i].em = c.em
			if cut {
				// learn.lua's ad_reset.
				k := c.keys[0]
				delete(m.books, k)
				delete(m.lasts, k)
				m.setTAT(k, until+c.em*(c.c.burst-1), now)
				continue
			}
		}
		if c.c.kind == kindGCRA {
			k := c.keys[0]
			cur, ok := m.tats[k]
			if !ok {
				cur = now
			}
			if tat := max(cur, until+c.em*(c.c.burst-1)); tat > now {
				if c.c.fair {
					m.blocks[k] = max(m.blocks[k], tat)
				}
				m.setTAT(k, tat, now)
			}
		} else if k := blockKey(c); until > now && until > m.tills[k] {
			m.tills[k] = until
		}
	}
	m.flush()
}

// held mirrors lua/quotas.lua's held: whether the booking of the set's first
// fair rule that a charge made is still its own.
func (m *model) held(calls []call, ats []int64, undo [][2]int64, nonce string) bool {
	for _, c := range calls {
		if !c.c.fair {
			continue
		}
		u, t := undo[c.i], ats[c.i]
		return u[0] >= 0 || slices.ContainsFunc(m.books[c.keys[0]], func(b booking) bool {
			return b.x == -u[0] && b.tag == u[1] && b.t == t && b.g == c.digest && b.owner == nonce
		})
	}
	return true
}

func (m *model) release(k, holder string, token int64) bool {
	if token == 0 || m.tokens[k][holder] != token {
		return false
	}
	delete(m.holders[k], holder)
	delete(m.tokens[k], holder)
	m.dropFlow(k, holder)
	return true
}

func (m *model) renew(k, holder string, token, lease, now int64) bool {
	if m.tokens[k][holder] != token {
		return false
	}
	if e, ok := m.holders[k][holder]; !ok || e <= now {
		return false
	}
	m.holders[k][holder] = now + lease
	return true
}

// uncut mirrors lua/quotas.lua's uncut (OP.HELD) for adaptive rules: false
// if one was cut after the charge was decided and before its time.
func (m *model) uncut(calls []call, now int64, ats []int64, decided int64) bool {
	for _, c := range calls {
		if c.c.learn != nil {
			if d := m.learned(c, now).d; decided > 0 && d > decided && ats[c.i] > d {
				return false
			}
		}
	}
	return true
}

// learnLoad mirrors lua/quotas.lua's learn_load (ad_load): each adaptive
// call's interval is its learned rate's; with credit, the busy time since w
// is counted and the state stored.
func (m *model) learnLoad(calls []call, now int64, credit bool) {
	for i, c := range calls {
		if p := c.c.learn; p != nil {
			l := m.learned(c, now)
			calls[i].em = intervalOf(l.r)
			if credit {
				m.learns[learnKey(c)] = p.credit(l, now, m.tats[c.keys[0]])
			}
		}
	}
}

// learnKey is the key of adaptive call c's learned state.
func learnKey(c call) string { return c.keys[len(c.keys)-1] }

// learned returns adaptive call c's state at now: the rule's start when it
// has none or it is a day old.
func (m *model) learned(c call, now int64) learned {
	if l, ok := m.learns[learnKey(c)]; ok && now-l.w < learnTTL.Microseconds() {
		return l
	}
	return c.c.learn.fresh(now)
}

// giveBack mirrors booked.lua's gc_return: tag, of a booking taken over,
// goes back to flow at returned key k, in order, the latest dropped beyond
// returnedMax.
func (m *model) giveBack(k, flow string, tag int64) {
	if m.returned[k] == nil {
		m.returned[k] = map[string][]int64{}
	}
	back := m.returned[k][flow]
	i := sort.Search(len(back), func(i int) bool { return back[i] > tag })
	back = slices.Insert(back, i, tag)
	m.returned[k][flow] = back[:min(len(back), returnedMax)]
}
