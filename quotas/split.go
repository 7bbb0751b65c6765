package quotas

import (
	"context"
)

// Split decisions. A prefetching set (every rule with Rule.Prefetch) keeps
// a pool per set and keys, so a request whose keys are seldom seen (one of
// a thousand businesses) finds its pool cold and is decided as usual, every
// rule of it in Redis, its global rules too, although their pool (the one
// every request shares) is warm. Such a request is split instead: its
// global rules (those whose key is "") admit it from their own pool, and
// only its keyed rules are decided in Redis, in a call of their own (or,
// for ReserveAndAllow, beside the slots). If the keyed rules refuse, the
// global units go back to their pool; an Allow then reports the refusal, a
// Reserve is decided as usual (it may book later, which units in hand do
// not cover), and the set's pool for those keys pauses the split until a
// decision made as usual finds room again (resume). Nothing is charged that
// the whole set's decision would not charge: the global units were taken
// ahead like any pool's (exact by construction, see prefetch.go), and the
// keyed rules are charged in Redis at the time they admit.

// parts is a set's split for requests whose keyed rules are at ki: g holds
// the set's other rules, at gi, and k the keyed ones. A Set caches its
// parts by the mask of its keyed rules (Set.parts).
type parts struct {
	g, k   *Set
	gi, ki []int
}

// splitOf returns how s splits for req, or nil if it does not: s must
// prefetch, have no fair or adaptive rule (their decisions read the whole
// set) and at most 64 rules, and req must have both global and keyed
// rules and its pool p (prefetched's) must not be paused.
func (l *Limiter) splitOf(s *Set, req Request, p *pool) *parts {
	if p == nil {
		return nil
	}
	l.pools.mu.Lock()
	paused := l.local() < p.pause
	l.pools.mu.Unlock()
	if paused {
		return nil
	}
	return partsOf(s, req)
}

// partsOf returns s's parts for req's keyed rules, or nil if s does not
// split for req.
func partsOf(s *Set, req Request) *parts {
	if s.prefetch == 0 || s.fair || s.adaptive || len(req.Keys) != len(s.rules) || len(s.rules) > 64 {
		return nil
	}
	var mask uint64
	for i, k := range req.Keys {
		if k != "" {
			mask |= 1 << i
		}
	}
	if mask == 0 || mask == 1<<len(s.rules)-1 {
		return nil
	}
	if v, ok := s.parts.Load(mask); ok {
		return v.(*parts)
	}
	var pt parts
	var gr, kr []Rule
	for i, r := range s.rules {
		if mask&(1<<i) != 0 {
			pt.ki, kr = append(pt.ki, i), append(kr, r)
		} else {
			pt.gi, gr = append(pt.gi, i), append(gr, r)
		}
	}
	var err error
	if pt.g, err = NewSet(gr...); err != nil {
		return nil
	}
	if pt.k, err = NewSet(kr...); err != nil {
		return nil
	}
	v, _ := s.parts.LoadOrStore(mask, &pt)
	return v.(*parts)
}

// requests returns req's requests of the global and the keyed part.
func (pt *parts) requests(req Request) (g, k Request) {
	k = Request{Keys: make([]string, len(pt.ki)), Cost: req.Cost, Holder: req.Holder, Critical: req.Critical}
	for j, i := range pt.ki {
		k.Keys[j] = req.Keys[i]
	}
	return Request{Cost: req.Cost, Critical: req.Critical}, k
}

// split is what a split Decision is made of, for Refund.
type split struct {
	pt     *parts
	greq   Request
	kreq   Request
	gd, kd Decision
}

// global admits req's global rules from their pool (units in hand, or a
// batch taken now), and returns the requests of both parts; gd is not
// Allowed if the pool did not admit (it is cold or busy: decide the whole
// set as usual).
func (l *Limiter) global(ctx context.Context, pt *parts, req Request) (gd Decision, greq, kreq Request, err error) {
	greq, kreq = pt.requests(req)
	gd, _, err = l.prefetched(ctx, pt.g, greq)
	return gd, greq, kreq, err
}

// joined is the Decision of the set s made of the global rules' gd and the
// keyed rules' kd: kd's outcome, time and wait, the rules' states in set
// order. Its charges for a Receipt are the keyed rules' and, for the
// global rules, those of gd's units (Decision.charges).
func joined(s *Set, pt *parts, greq, kreq Request, gd, kd Decision) Decision {
	d := Decision{Allowed: kd.Allowed, RetryAfter: kd.RetryAfter, Rule: kd.Rule, Delay: kd.Delay, Now: kd.Now,
		Rules: make([]RuleStatus, len(s.rules)), nonce: kd.nonce, cost: kd.cost}
	for j, i := range pt.gi {
		d.Rules[i] = gd.Rules[j]
	}
	for j, i := range pt.ki {
		d.Rules[i] = kd.Rules[j]
	}
	if !d.Allowed {
		return d
	}
	d.ats, d.undo = make([]int64, len(s.rules)), make([][2]int64, len(s.rules))
	gats, _ := gd.charges()
	for j, i := range pt.gi {
		d.ats[i] = gats[j]
	}
	for j, i := range pt.ki {
		d.ats[i], d.undo[i] = kd.ats[j], kd.undo[j]
	}
	d.split = &split{pt: pt, greq: greq, kreq: kreq, gd: gd, kd: kd}
	return d
}

// splitDecide decides req under s by its parts pt (an Allow, or a Reserve
// admitted now only); done false: decide it as usual (the global pool did
// not admit, or the keyed rules refused a Reserve; the pool p then pauses
// the split).
func (l *Limiter) splitDecide(ctx context.Context, s *Set, pt *parts, req Request, op int, p *pool) (d Decision, done bool, err error) {
	gd, greq, kreq, err := l.global(ctx, pt, req)
	if err != nil || !gd.Allowed {
		return Decision{}, err != nil, err
	}
	kd, err := l.decideNow(ctx, pt.k, kreq, op, 0)
	if err != nil || !kd.Allowed {
		l.unfetch(poolKey(pt.g, greq), gd)
	}
	switch {
	case err != nil:
		return Decision{}, true, err
	case !kd.Allowed && op != opAllow:
		l.pause(p)
		return Decision{}, false, nil
	}
	return joined(s, pt, greq, kreq, gd, kd), true, nil
}

// resumed ends the pauses of p, the pool of req's keys under s, and of
// the pool of its global rules, when d, a decision made as usual, admitted
// at once with room for a batch left in their rules (resume): requests
// that were decided as usual because their pools were busy split again.
func (l *Limiter) resumed(s *Set, req Request, p *pool, d Decision) {
	if p == nil {
		return
	}
	l.resume(s, p, d)
	pt := partsOf(s, req)
	if pt == nil || !d.Allowed || len(d.Rules) != len(s.rules) {
		return
	}
	greq, _ := pt.requests(req)
	l.pools.mu.Lock()
	gp := l.pools.m[poolKey(pt.g, greq)]
	l.pools.mu.Unlock()
	if gp == nil {
		return
	}
	gd := d
	gd.Rules = make([]RuleStatus, len(pt.gi))
	for j, i := range pt.gi {
		gd.Rules[j] = d.Rules[i]
	}
	l.resume(pt.g, gp, gd)
}

// pause stops splitting p's requests until a decision made as usual finds
// room again (resumed) or prefetchPause has passed.
func (l *Limiter) pause(p *pool) {
	l.pools.mu.Lock()
	p.pause = l.local() + prefetchPause.Microseconds()
	l.pools.mu.Unlock()
}

// unsplit gives back a split Decision's charges: the global units to their
// pool, the keyed rules' charges in Redis.
func (l *Limiter) unsplit(ctx context.Context, sp *split) error {
	l.unfetch(poolKey(sp.pt.g, sp.greq), sp.gd)
	return l.Refund(ctx, sp.pt.k, sp.kreq, sp.kd)
}
