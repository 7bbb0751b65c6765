package quotas

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Kept slots (Rule.Prefetch of Concurrency rules). A set whose rules are
// all Concurrency rules with Prefetch (Set.keep) takes its slots under a
// holder of the Limiter's own (keptHolder), not the request's. When the
// request's holder releases them they are kept, in a pool per set and
// keys, for Set.keep (keepMost at most), and handed to the next request
// there without a call; Redis holds them all the while, so the rule's
// count is exact. A grant is handed out again only within a second (and a
// twelfth of its shortest lease) of the decision that took it (its fresh): its rules' state (their count, a Block) is then
// at most that old, and its lease has most of its length left when its
// new holder takes it over (the middleware renews a third of a lease after
// that). It is kept only if, when taken, each rule had at least
// keepMargin slots free besides its reserved ones: near its limit a
// rule's slots go back at once, for other processes to take. What is kept
// past its time is given back by a timer on the real clock (on an explicit
// clock, by the next request that finds it), at a Block (dropPools) and at
// GiveBack. A call that fails after Redis may have run it drops the
// holder it took slots under (dropKept): no other request uses it.

// keepMost is how many grants a pool keeps at most; one released when it
// holds that many goes back.
const keepMost = 4

// keepMargin is how many slots a rule of most slots must have free,
// besides its reserved ones, for a slot taken then to be kept.
func keepMargin(most int64) int64 { return max(4, most/8) }

// slotPools holds a Limiter's kept slots; the zero value is ready.
type slotPools struct {
	mu sync.Mutex
	m  map[string]*slotPool
}

// slotPool is one set's and keys' kept slots.
type slotPool struct {
	free    []*slotGrant // kept, the last released last
	timer   *time.Timer  // gives back what is kept past its time (real clock)
	dropped bool         // a Block dropped the pool: grants released go back
}

// slotGrant is one acquisition of a kept set's slots: a lease per rule.
type slotGrant struct {
	leases   []Lease      // as Redis holds them (kept unset)
	rules    []RuleStatus // the rules' state when taken
	now      time.Time    // the decision's time
	at       int64        // local µs of the decision (the call's start)
	fresh    int64        // how long after at it may be handed out, µs
	freed    int64        // local µs: when it last came back to the pool
	gen      uint64       // counts hand-outs: a Lease of an earlier one is stale
	released []bool       // per lease, released since the last hand-out
	keep     bool         // far from the limit when taken: kept when released
	lost     bool         // a renewal found a lease gone: never handed out again
	pool     *slotPool
	s        *Set
}

// keptSeq numbers the holders of a process's kept slots.
var keptSeq atomic.Uint64

// keptHolder returns a holder of this process's own, for a kept grant.
func keptHolder() string {
	return "kept:" + nonceBase + strconv.FormatUint(keptSeq.Add(1), 36)
}

// keptAllow is Allow of a set that keeps slots: a kept grant if there is
// one, else the slots taken under a holder of the Limiter's own.
func (l *Limiter) keptAllow(ctx context.Context, s *Set, req Request) (Decision, error) {
	if req.Holder == "" || req.Keys != nil && len(req.Keys) != len(s.rules) {
		return l.decideNow(ctx, s, req, opAllow, 0) // says what is wrong
	}
	if d, ok := l.takeKept(s, req); ok {
		return d, nil
	}
	start := l.local()
	breq := req
	breq.Holder = keptHolder()
	d, err := l.decideNow(ctx, s, breq, opAllow, 0)
	if err != nil {
		l.dropKept(s, breq)
		return d, err
	}
	if !d.Allowed {
		return d, nil
	}
	return l.keepGrant(s, req, d, start), nil
}

// dropKept releases, in the background, whatever slots of s a call that
// failed may have taken under req's holder, one of the Limiter's own that
// no other request uses: the call may have run in Redis and lost only its
// reply.
func (l *Limiter) dropKept(s *Set, req Request) {
	calls, err := l.bind(s, req, true)
	if err != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, c := range calls {
			if c.c.kind == kindConcurrency {
				_, _ = l.lease(ctx, Lease{Holder: req.Holder, zkey: c.keys[0], hkey: c.keys[1]}, leaseDrop)
			}
		}
	}()
}

// hasKept reports whether s's pool for req has a grant kept.
func (l *Limiter) hasKept(s *Set, req Request) bool {
	if req.Keys != nil && len(req.Keys) != len(s.rules) {
		return false
	}
	l.slots.mu.Lock()
	defer l.slots.mu.Unlock()
	p := l.slots.m[poolKey(s, req)]
	return p != nil && len(p.free) > 0
}

// takeKept hands out the grant kept last in s's pool for req, giving back
// those past their time or no longer fresh.
func (l *Limiter) takeKept(s *Set, req Request) (Decision, bool) {
	l.slots.mu.Lock()
	p := l.slots.m[poolKey(s, req)]
	if p == nil {
		l.slots.mu.Unlock()
		return Decision{}, false
	}
	now := l.local()
	var back []*slotGrant
	p.free = slices.DeleteFunc(p.free, func(g *slotGrant) bool {
		if now-g.freed >= g.s.keep || g.stale(now) {
			back = append(back, g)
			return true
		}
		return false
	})
	var d Decision
	ok := len(p.free) > 0
	if ok {
		g := p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
		d = g.handOut(now)
	}
	l.slots.mu.Unlock()
	l.giveBackGrants(back)
	return d, ok
}

// stale reports whether g may not be handed out again: taken more than its
// fresh ago, or a renewal found a lease of it gone.
func (g *slotGrant) stale(now int64) bool { return now-g.at > g.fresh || g.lost }

// handOut marks g handed out at now and returns its Decision; slots.mu is
// held.
func (g *slotGrant) handOut(now int64) Decision {
	g.gen++
	clear(g.released)
	leases := make([]Lease, len(g.leases))
	for i, ls := range g.leases {
		ls.kept, ls.gen = g, g.gen
		leases[i] = ls
	}
	at := g.now.Add(time.Duration(now-g.at) * time.Microsecond)
	return Decision{Allowed: true, Now: at, Rules: g.rules, Leases: leases}
}

// keepGrant makes d, the slots of s taken for req under a holder of the
// Limiter's own by a call that started at start (local µs), a grant, and
// returns it handed out.
func (l *Limiter) keepGrant(s *Set, req Request, d Decision, start int64) Decision {
	fresh := time.Second
	for _, ls := range d.Leases {
		fresh = min(fresh, ls.Duration/12)
	}
	g := &slotGrant{leases: d.Leases, rules: d.Rules, now: d.Now, at: start, fresh: fresh.Microseconds(), s: s, keep: true,
		released: make([]bool, len(d.Leases))}
	for i, c := range s.comp {
		if i < len(d.Rules) && int64(d.Rules[i].Remaining)-c.reserved < keepMargin(c.max) {
			g.keep = false
		}
	}
	key := poolKey(s, req)
	l.slots.mu.Lock()
	defer l.slots.mu.Unlock()
	if l.slots.m == nil {
		l.slots.m = map[string]*slotPool{}
	}
	p := l.slots.m[key]
	if p == nil {
		if len(l.slots.m) >= maxPools {
			for k, q := range l.slots.m {
				if len(q.free) == 0 {
					q.dropped = true // its grants out go back when released
					delete(l.slots.m, k)
				}
			}
		}
		p = &slotPool{}
		l.slots.m[key] = p
	}
	g.pool = p
	return g.handOut(start)
}

// releaseKept is Release of a lease of a kept grant: when its holder has
// released every lease of the grant, the grant is kept, or given back if
// it may not be (near the limit when taken, lost, too old, its pool
// dropped). It reports false for a lease released already.
func (l *Limiter) releaseKept(ctx context.Context, ls Lease) (bool, error) {
	g := ls.kept
	l.slots.mu.Lock()
	i := g.index(ls)
	if ls.gen != g.gen || i < 0 || g.released[i] {
		l.slots.mu.Unlock()
		return false, nil
	}
	g.released[i] = true
	if slices.Contains(g.released, false) {
		l.slots.mu.Unlock()
		return true, nil
	}
	now := l.local()
	g.gen++ // every lease of this hand-out is released
	p := g.pool
	if !g.keep || p.dropped || len(p.free) >= keepMost || g.stale(now) {
		l.slots.mu.Unlock()
		return true, l.giveBackGrant(ctx, g)
	}
	g.freed = now
	p.free = append(p.free, g)
	if l.now == nil && p.timer == nil {
		p.timer = time.AfterFunc(time.Duration(g.s.keep)*time.Microsecond, func() { l.expireKept(p) })
	}
	l.slots.mu.Unlock()
	return true, nil
}

// index is the position of ls among g's leases, or -1.
func (g *slotGrant) index(ls Lease) int {
	return slices.IndexFunc(g.leases, func(x Lease) bool { return x.zkey == ls.zkey && x.Token == ls.Token })
}

// renewedKept records the outcome of a renewal of ls, a lease of a kept
// grant: one found gone marks the grant lost.
func (l *Limiter) renewedKept(ls Lease, ok bool) {
	if ok {
		return
	}
	l.slots.mu.Lock()
	ls.kept.lost = true
	l.slots.mu.Unlock()
}

// expireKept gives back p's grants kept past their time (the timer of p,
// on the real clock), and sets the timer again for the rest.
func (l *Limiter) expireKept(p *slotPool) {
	l.slots.mu.Lock()
	now := l.local()
	var back []*slotGrant
	p.free = slices.DeleteFunc(p.free, func(g *slotGrant) bool {
		if now-g.freed >= g.s.keep {
			back = append(back, g)
			return true
		}
		return false
	})
	p.timer = nil
	if len(p.free) > 0 {
		g := p.free[0] // the first kept is the first due
		p.timer = time.AfterFunc(time.Duration(g.freed+g.s.keep-now)*time.Microsecond, func() { l.expireKept(p) })
	}
	l.slots.mu.Unlock()
	l.giveBackGrants(back)
}

// giveBackGrants gives grants back to Redis: in the background, or, on an
// explicit clock (tests, simulations), before it returns.
func (l *Limiter) giveBackGrants(gs []*slotGrant) {
	if len(gs) == 0 {
		return
	}
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, g := range gs {
			_ = l.giveBackGrant(ctx, g) // a failure: the lease ends by itself
		}
	}
	if l.now != nil {
		run()
		return
	}
	go run()
}

// giveBackGrant releases g's leases in Redis.
func (l *Limiter) giveBackGrant(ctx context.Context, g *slotGrant) error {
	var first error
	for _, ls := range g.leases {
		if _, err := l.lease(ctx, ls, leaseRelease); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// emptyKept forgets every kept grant, marking each pool dropped (grants out
// go back when released), and returns them.
func (l *Limiter) emptyKept() []*slotGrant {
	l.slots.mu.Lock()
	defer l.slots.mu.Unlock()
	var back []*slotGrant
	for _, p := range l.slots.m {
		p.dropped = true
		back = append(back, p.free...)
		p.free = nil
		if p.timer != nil {
			p.timer.Stop()
			p.timer = nil
		}
	}
	l.slots.m = nil
	return back
}
