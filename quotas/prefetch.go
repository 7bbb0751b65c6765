package quotas

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Token leasing (Rule.Prefetch). When every rule of a set has Prefetch, an
// Allow or Reserve that finds no units in hand takes a batch of them with
// one Allow of the batch's cost; the request uses one and the rest are kept
// in a pool per set and keys, each usable until Prefetch after the batch was
// asked for (on the local clock, so the moment the server charged it is
// never later). Requests are then admitted from the pool without a call;
// those that find a batch on its way wait for it. A batch used up within
// half its Prefetch makes the next one twice as large (up to the set's
// batchMax), one whose units expired unused half as large. A batch the
// rules refuse (they are busy) stops prefetching for prefetchPause, or
// until a request decided as usual finds room for a batch again: the
// request is decided as usual, and units are not taken ahead of requests
// that would wait for them.
//
// A GCRA rule charges a batch Prefetch ahead in its schedule (the batch's
// allow carries Prefetch as its horizon; booked.lua), and the batch must
// still fit the burst from now: a unit handed out up to Prefetch late is
// then as if admitted when it is handed out, so every other request
// decides with the whole burst. What this costs is capacity, not
// exactness: while batches are taken the rule's schedule runs up to
// Prefetch ahead of now, Prefetch's worth of units (limits.Ahead) that a
// burst arriving then cannot use.
//
// Windows prefetch too. A fixed or calendar window's batch is counted in
// the window of the batch, so its units are handed out only until that
// window ends (its ResetAfter, measured from when the batch was asked for,
// which is never after the server's moment): no window admits more than
// its Limit. A sliding window logs a batch at its moment and decides with
// Every lengthened by Prefetch, so units handed out up to Prefetch later
// never put more than Limit in any span of Every (Rule.Prefetch). Units a process did not hand out are given back to the
// windows (a Settle of the batch, settleBack) when they expire: by the
// request that finds them expired, by a timer on the real clock, when a
// Block drops the pools, or at GiveBack; a refunded unit goes back to its
// batch's pool while usable, else to the windows at once. Batches are
// sized by the requests' pace (sizeForWindows), and one that leaves less
// than windowMargin batches in a window pauses the pool, so that near its
// limit a window decides every request as usual.

// prefetchPause is how long a pool takes no batch after one was refused,
// unless a decision meanwhile finds the rules with room again.
const prefetchPause = time.Second

// windowMargin is how many batches a window must have left after one for
// its pool to take the next; see resume.
const windowMargin = 4

// pools holds a Limiter's prefetched units; the zero value is ready.
type pools struct {
	mu sync.Mutex
	m  map[string]*pool
}

// maxPools is how many pools a Limiter keeps before it forgets those with
// no usable units (keyed rules have a pool per key).
const maxPools = 4096

// prune forgets the pools with no usable units, no batch on its way, no
// pause running and no units to give back.
func (ps *pools) prune(now int64) {
	for k, p := range ps.m {
		// Units of windows not yet given back keep their pool.
		if now >= p.pause && p.filling == nil && !slices.ContainsFunc(p.grants, func(g grant) bool { return g.until > now || g.pf.s.windows }) {
			delete(ps.m, k)
		}
	}
}

// get returns the pool of key (poolKey's bytes: looked up without a
// copy), made with a first batch of n if there is none; ps.mu is held.
func (ps *pools) get(key []byte, n, now int64) *pool {
	if ps.m == nil {
		ps.m = map[string]*pool{}
	}
	p := ps.m[string(key)]
	if p == nil {
		if len(ps.m) >= maxPools {
			ps.prune(now)
		}
		p = &pool{batch: n}
		ps.m[string(key)] = p
	}
	return p
}

// pool is one set's and keys' prefetched units.
type pool struct {
	grants  []grant       // unexpired units
	batch   int64         // units the next batch asks for
	took    int64         // local µs: when the last batch was asked for
	gap     int64         // windows: local µs between units, ×16, averaged (sizeForWindows)
	wasted  bool          // units expired unused since the last batch
	pause   int64         // no batch before this, local µs
	asked   int64         // local µs: when a request last found no units in hand
	waiting int64         // units the requests waiting for the batch on its way want
	filling chan struct{} // closed when the batch on its way has come
	dropped bool          // a Block dropped the pool: refunds of windows go back at once
}

// grant is what is left of one batch.
type grant struct {
	units int64
	until int64        // local µs: usable before this
	took  int64        // local µs: when the batch was asked for
	now   time.Time    // the batch's decision time
	rules []RuleStatus // the rules' state after the batch, shared
	pf    *prefetch    // what the batch's decisions carry
}

// local is the Limiter's clock for prefetched units, µs: Config.Now, or
// the monotonic clock.
func (l *Limiter) local() int64 {
	if l.now != nil {
		return l.now().UnixMicro()
	}
	return time.Since(l.started).Microseconds()
}

// poolKey names a set's pool for req's keys: its rules' keys, which hold
// the rule's name and limit (a window's key its length or calendar, so its
// limit is added, and a concurrency rule's its Max: a reload that lowers
// it starts a pool of its own).
func poolKey(s *Set, req Request) string {
	return string(appendPoolKey(nil, s, req))
}

// appendPoolKey appends poolKey(s, req) to b.
func appendPoolKey(b []byte, s *Set, req Request) []byte {
	for i, c := range s.comp {
		b = append(b, c.tails[0]...)
		switch c.kind {
		case kindFixed, kindCalendar, kindSliding:
			b = strconv.AppendInt(append(b, ':'), c.limit, 10)
		case kindConcurrency:
			b = strconv.AppendInt(append(b, ':'), c.max, 10)
		}
		b = append(b, 0)
		if i < len(req.Keys) {
			b = append(b, req.Keys[i]...)
		}
		b = append(b, 0)
	}
	return b
}

// prefetched admits req from s's pool, or takes a batch for it. When it
// did neither (the decision it returns is not Allowed), req must be
// decided as usual; it then returns req's pool, to resume after that
// decision, or nil if req may not prefetch (its cost above a batch, bad
// keys: the usual decision refuses it or says what is wrong).
func (l *Limiter) prefetched(ctx context.Context, s *Set, req Request) (Decision, *pool, error) {
	n := int64(max(req.Cost, 1))
	if n > s.batchMax || req.Cost < 0 || req.Keys != nil && len(req.Keys) != len(s.rules) || req.Fair != nil && len(req.Fair) != len(s.rules) {
		// Decided as usual: refused, or an error.
		return Decision{}, nil, nil
	}
	var buf [128]byte // most keys fit: no allocation to find the pool
	key := appendPoolKey(buf[:0], s, req)
	l.pools.mu.Lock()
	var p *pool
	for {
		// Looked up again after a wait: a Block may have dropped the pool.
		now := l.local()
		p = l.pools.get(key, n, now)
		d, ok, back := p.take(n, now, nil)
		if len(back) > 0 {
			// Expired units of windows go back: in the background, or,
			// on an explicit clock (tests, simulations), before this
			// request goes on.
			units := make([]int64, len(back))
			for i, b := range back {
				units[i] = p.drop(b)
				p.wasted = p.wasted || units[i] > 0
			}
			if l.now == nil {
				for i, b := range back {
					go l.settleBack(b, units[i])
				}
			} else {
				l.pools.mu.Unlock()
				for i, b := range back {
					l.settleBack(b, units[i])
				}
				if ok {
					return d, nil, nil
				}
				l.pools.mu.Lock()
				continue
			}
		}
		if ok {
			l.pools.mu.Unlock()
			return d, nil, nil
		}
		if now < p.pause {
			l.pools.mu.Unlock()
			return Decision{}, p, nil
		}
		if p.filling == nil {
			break
		}
		wait := p.filling
		p.waiting += n
		l.pools.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			l.pools.mu.Lock()
			p.waiting -= n
			l.pools.mu.Unlock()
			return Decision{}, nil, ctx.Err()
		}
		l.pools.mu.Lock()
		p.waiting -= n
	}
	now := l.local()
	if p.asked == 0 || now-p.asked >= s.prefetch {
		// Cold: no request asked for units within a prefetch. A batch of
		// this request's cost would be no cheaper than its decision as
		// usual, which may carry more (ReserveAndAllow's slots).
		p.asked = now
		l.pools.mu.Unlock()
		return Decision{}, p, nil
	}
	p.asked = now
	if s.windows {
		p.sizeForWindows(s, n, now)
	} else {
		switch {
		case p.wasted:
			p.batch = max(p.batch/2, n)
		case now-p.took < s.prefetch/2:
			p.batch = min(2*p.batch, s.batchMax)
		}
	}
	// Enough for the requests waiting on the batch before this one came.
	k := min(max(p.batch, n+p.waiting), max(s.batchMax, n))
	p.wasted, p.took, p.filling = false, now, make(chan struct{})
	filled := p.filling
	l.pools.mu.Unlock()

	breq := req
	breq.Cost, breq.Costs = int(k), nil // sameCosts: every rule costs Cost
	// The batch's GCRA charges are placed the prefetch ahead (booked.lua).
	bd, err := l.decideNow(ctx, s, breq, opAllow, time.Duration(s.prefetch)*time.Microsecond)
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	close(filled)
	p.filling = nil
	if err != nil {
		return Decision{}, nil, err
	}
	if !bd.Allowed {
		p.pause, p.batch = now+prefetchPause.Microseconds(), n
		return Decision{}, p, nil
	}
	g := grant{units: k - n, until: now + s.prefetch, took: now, now: bd.Now, rules: bd.Rules}
	if s.windows {
		for i, c := range s.comp {
			if c.kind != kindFixed && c.kind != kindCalendar && c.kind != kindSliding || i >= len(bd.Rules) {
				continue
			}
			r := bd.Rules[i]
			if c.kind != kindSliding {
				// A sliding log spans Every+Prefetch instead.
				g.until = min(g.until, now+r.ResetAfter.Microseconds())
			}
			if int64(r.Remaining) < windowMargin*k {
				p.pause = now + prefetchPause.Microseconds() // near the limit
			}
		}
	}
	b := &prefetch{g: g, s: s, req: breq, bd: bd, pool: p}
	g.pf, b.g.pf = b, b
	if g.units > 0 {
		p.grants = append(p.grants, g)
	}
	if s.windows && l.now == nil {
		// Even a batch that left nothing over: a refund may put units back.
		time.AfterFunc(time.Duration(g.until-now)*time.Microsecond, func() { l.giveBack(b) })
	}
	return g.decision(n, now), nil, nil
}

// giveBack gives the units of batch b still in its pool back to the set's
// windows: they expired.
func (l *Limiter) giveBack(b *prefetch) {
	l.pools.mu.Lock()
	units := b.pool.drop(b)
	b.pool.wasted = b.pool.wasted || units > 0
	l.pools.mu.Unlock()
	l.settleBack(b, units)
}

// settleBack gives units of batch b back to the set's windows (a Settle
// of the batch at units less; the other rules keep their charge). Windows
// un-count what a settle gives back, so a batch is settled once for each
// lot of units that comes back, and each unit comes back once: from its
// pool (drop), or from a refund once its pool cannot take it (unfetch).
// Errors are dropped: the units then stay counted until their window
// ends, as when a process dies holding them.
func (l *Limiter) settleBack(b *prefetch, units int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.settleBackCtx(ctx, b, units)
}

// settleBackCtx is settleBack with ctx, returning the error.
func (l *Limiter) settleBackCtx(ctx context.Context, b *prefetch, units int64) error {
	if units <= 0 {
		return nil
	}
	// A fixed or calendar window un-counts what each settle gives back;
	// a sliding window drops the batch's entries above actual, so it is
	// told all that came back so far.
	total := b.back.Add(units)
	actual := make([]int, len(b.s.comp))
	for i, c := range b.s.comp {
		switch c.kind {
		case kindFixed, kindCalendar:
			actual[i] = b.req.Cost - int(units)
		case kindSliding:
			actual[i] = b.req.Cost - int(total)
		default:
			actual[i] = -1
		}
	}
	return l.Settle(ctx, b.s, b.req, b.bd, actual)
}

// drop removes batch b's units from p, marks b given back and returns how
// many there were; pools.mu is held.
func (p *pool) drop(b *prefetch) int64 {
	if b.given {
		return 0
	}
	b.given = true
	var units int64
	p.grants = slices.DeleteFunc(p.grants, func(g grant) bool {
		if g.pf == b {
			units += g.units
			return true
		}
		return false
	})
	return units
}

// sizeForWindows sizes p's next batch for a set with windows, whose
// unused units cost a call to give back: what the requests' pace, averaged
// over the last batches (p.gap), uses in half the prefetch time, at most
// twice the last batch (and half of it after units expired unused), at
// least n. At a pace of one request per half prefetch or slower every
// request takes a batch of its own: no units are left to give back.
func (p *pool) sizeForWindows(s *Set, n, now int64) {
	if p.took > 0 {
		gap := max(now-p.took, 1) * 16 / p.batch // µs per unit, ×16
		if p.gap == 0 {
			p.gap = gap
		}
		p.gap = (3*p.gap + gap) / 4
	}
	want := max(p.batch, 1)
	if p.gap > 0 {
		want = s.prefetch * 16 / 2 / p.gap
	}
	most := 2 * p.batch
	if p.wasted {
		most = p.batch / 2
	}
	p.batch = max(min(want, most, s.batchMax), n)
}

// resume ends p's pause when a decision made as usual admitted at once
// with room for a batch left in every rule: the rules are no longer busy.
func (l *Limiter) resume(s *Set, p *pool, d Decision) {
	if !d.Allowed || d.Delay > 0 {
		return
	}
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	for i, r := range d.Rules {
		margin := int64(2)
		if k := s.comp[i].kind; k == kindFixed || k == kindCalendar || k == kindSliding {
			margin = windowMargin
		}
		if int64(r.Remaining) < margin*p.batch {
			return
		}
	}
	p.pause = 0
}

// take hands out n units from p's unexpired grants, those that expire
// first first, and drops the expired ones; those of batches whose units
// go back to their windows are appended to back, to give back.
func (p *pool) take(n, now int64, back []*prefetch) (Decision, bool, []*prefetch) {
	for _, g := range p.grants {
		if g.until <= now && g.pf.s.windows && !g.pf.given && !slices.Contains(back, g.pf) {
			back = append(back, g.pf)
		}
	}
	p.grants = slices.DeleteFunc(p.grants, func(g grant) bool {
		if g.until <= now && (!g.pf.s.windows || g.pf.given) {
			p.wasted = true
			return true
		}
		return false
	})
	best := -1
	for i, g := range p.grants {
		if g.until > now && g.units >= n && (best < 0 || g.until < p.grants[best].until) {
			best = i
		}
	}
	if best < 0 {
		return Decision{}, false, back
	}
	g := &p.grants[best]
	g.units -= n
	d := g.decision(n, now)
	if g.units == 0 {
		p.grants = slices.Delete(p.grants, best, best+1)
	}
	return d, true, back
}

// decision is an admitted Decision for n of g's units handed out at now
// (local µs): its time is the batch's, plus the time since. Its Rules are
// the batch's (read only).
func (g grant) decision(n, now int64) Decision {
	at := g.now.Add(time.Duration(now-g.took) * time.Microsecond)
	return Decision{Allowed: true, Now: at, Rules: g.rules, cost: int(n), pf: g.pf}
}

// prefetch marks a Decision admitted from prefetched units, with their
// batch's grant: a refund puts them back in their pool while they are
// usable. For a set with prefetching windows it also holds what giving
// the unused units back needs.
type prefetch struct {
	g     grant
	s     *Set
	req   Request      // the batch's request: its cost is the batch's
	bd    Decision     // the batch's decision, which the give-backs settle
	pool  *pool        // the pool its units live in
	back  atomic.Int64 // units given back so far
	given bool         // its pooled units were given back: a refund goes back at once (pools.mu)
}

// unfetch puts back the units of a Decision admitted from a pool, if they
// are still usable. Those of a set with windows go back to their batch's
// pool, or, once it cannot take them (they expired, the batch was given
// back, a Block dropped the pool), to the windows at once.
func (l *Limiter) unfetch(key string, d Decision) {
	b := d.pf
	now := l.local()
	l.pools.mu.Lock()
	if b.s.windows {
		if b.given || b.pool.dropped || b.g.until <= now {
			l.pools.mu.Unlock()
			l.settleBack(b, int64(d.cost))
			return
		}
		g := b.g
		g.units = int64(d.cost)
		b.pool.grants = append(b.pool.grants, g)
		l.pools.mu.Unlock()
		return
	}
	defer l.pools.mu.Unlock()
	if b.g.until <= now {
		return
	}
	if p := l.pools.m[key]; p != nil {
		g := b.g
		g.units = int64(d.cost)
		p.grants = append(p.grants, g)
	}
}

// dropPools forgets every prefetched unit and kept slot, so that a Block
// holds in this process at once (in others, within their units' Prefetch,
// and for kept slots within a second); the units of windows and the kept
// slots are given back, in the background.
func (l *Limiter) dropPools() {
	back, units := l.emptyPools()
	for i, b := range back {
		go l.settleBack(b, units[i])
	}
	if kept := l.emptyKept(); len(kept) > 0 {
		go l.giveBackGrants(kept)
	}
}

// GiveBack forgets every unit this Limiter took ahead (Rule.Prefetch),
// gives those of fixed and calendar windows back to their windows, one
// call per batch, and the concurrency slots it keeps back to their rules:
// call it before the process stops (or its Redis client closes), or they
// stay counted until their windows or leases end. The Limiter stays
// usable. It returns the first error; the units of a batch whose call
// failed stay counted. Safe for concurrent use.
func (l *Limiter) GiveBack(ctx context.Context) error {
	back, units := l.emptyPools()
	var first error
	for i, b := range back {
		if err := l.settleBackCtx(ctx, b, units[i]); err != nil && first == nil {
			first = err
		}
	}
	for _, g := range l.emptyKept() {
		if err := l.giveBackGrant(ctx, g); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// emptyPools forgets every pool, marking each dropped, and returns the
// batches of windows they held with their units.
func (l *Limiter) emptyPools() (back []*prefetch, units []int64) {
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	for _, p := range l.pools.m {
		p.dropped = true
		var bs []*prefetch
		for _, g := range p.grants {
			if g.pf.s.windows && !slices.Contains(bs, g.pf) {
				bs = append(bs, g.pf)
			}
		}
		for _, b := range bs {
			back, units = append(back, b), append(units, p.drop(b))
		}
	}
	l.pools.m = nil
	return back, units
}
