package quotas

import (
	"context"
	"slices"
	"sync"
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
// lowered burst), one whose units expired unused half as large. A batch
// the rules refuse (they are busy) stops prefetching for prefetchPause, or
// until a request decided as usual finds room for a batch again: the
// request is decided as usual, and units are not taken ahead of requests
// that would wait for them.

// prefetchPause is how long a pool takes no batch after one was refused,
// unless a decision meanwhile finds the rules with room again.
const prefetchPause = time.Second

// pools holds a Limiter's prefetched units; the zero value is ready.
type pools struct {
	mu sync.Mutex
	m  map[string]*pool
}

// maxPools is how many pools a Limiter keeps before it forgets those with
// no usable units (keyed rules have a pool per key).
const maxPools = 4096

// prune forgets the pools with no usable units, no batch on its way and
// no pause running.
func (ps *pools) prune(now int64) {
	for k, p := range ps.m {
		if now >= p.pause && p.filling == nil && !slices.ContainsFunc(p.grants, func(g grant) bool { return g.until > now }) {
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
	wasted  bool          // units expired unused since the last batch
	pause   int64         // no batch before this, local µs
	filling chan struct{} // closed when the batch on its way has come
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
// the rule's name and limit.
func poolKey(s *Set, req Request) string {
	return string(appendPoolKey(nil, s, req))
}

// appendPoolKey appends poolKey(s, req) to b.
func appendPoolKey(b []byte, s *Set, req Request) []byte {
	for i, c := range s.comp {
		b = append(b, c.tails[0]...)
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
		if d, ok := p.take(n, now); ok {
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
		l.pools.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return Decision{}, nil, ctx.Err()
		}
		l.pools.mu.Lock()
	}
	now := l.local()
	switch {
	case p.wasted:
		p.batch = max(p.batch/2, n)
	case now-p.took < s.prefetch/2:
		p.batch = min(2*p.batch, s.batchMax)
	}
	k := max(p.batch, n)
	p.wasted, p.took, p.filling = false, now, make(chan struct{})
	filled := p.filling
	l.pools.mu.Unlock()

	breq := req
	breq.Cost = int(k)
	bd, err := l.decideNow(ctx, s, breq, opAllow, 0)
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
	g.pf = &prefetch{g: g}
	if g.units > 0 {
		p.grants = append(p.grants, g)
	}
	return g.decision(n, now), nil, nil
}

// resume ends p's pause when a decision made as usual admitted at once
// with room for a batch left in every rule: the rules are no longer busy.
func (l *Limiter) resume(p *pool, d Decision) {
	if !d.Allowed || d.Delay > 0 {
		return
	}
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	for _, r := range d.Rules {
		if int64(r.Remaining) < 2*p.batch {
			return
		}
	}
	p.pause = 0
}

// take hands out n units from p's unexpired grants, those that expire
// first first, and drops the expired ones.
func (p *pool) take(n, now int64) (Decision, bool) {
	p.grants = slices.DeleteFunc(p.grants, func(g grant) bool {
		if g.until <= now {
			p.wasted = true
			return true
		}
		return false
	})
	best := -1
	for i, g := range p.grants {
		if g.units >= n && (best < 0 || g.until < p.grants[best].until) {
			best = i
		}
	}
	if best < 0 {
		return Decision{}, false
	}
	g := &p.grants[best]
	g.units -= n
	d := g.decision(n, now)
	if g.units == 0 {
		p.grants = slices.Delete(p.grants, best, best+1)
	}
	return d, true
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
// usable.
type prefetch struct{ g grant }

// unfetch puts back the units of a Decision admitted from a pool, if they
// are still usable.
func (l *Limiter) unfetch(key string, d Decision) {
	now := l.local()
	if d.pf.g.until <= now {
		return
	}
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	if p := l.pools.m[key]; p != nil {
		g := d.pf.g
		g.units, g.pf = int64(d.cost), d.pf
		p.grants = append(p.grants, g)
	}
}

// dropPools forgets every prefetched unit, so that a Block holds in this
// process at once (in others, within their units' Prefetch).
func (l *Limiter) dropPools() {
	l.pools.mu.Lock()
	defer l.pools.mu.Unlock()
	l.pools.m = nil
}
