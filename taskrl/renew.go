package taskrl

import (
	"context"
	"sync"
	"time"

	"github.com/taskrl/taskrl/quotas"
)

// renewer keeps the concurrency slots of the tasks running in this process:
// every third of a lease, all the leases then due are renewed together in
// one round trip (quotas.Limiter.RenewAll), not one call per task. Safe for
// concurrent use.
type renewer struct {
	m    *Middleware
	loop *loop

	mu   sync.Mutex
	held map[*heldLeases]struct{}
}

// heldLeases are one running task's leases and when they are next renewed.
type heldLeases struct {
	leases []quotas.Lease
	every  time.Duration
	next   time.Time
}

func newRenewer(m *Middleware) *renewer {
	r := &renewer{m: m, held: map[*heldLeases]struct{}{}}
	r.loop = newLoop(r.pass)
	return r
}

// add keeps leases renewed until remove is called with the result.
func (r *renewer) add(leases []quotas.Lease) *heldLeases {
	if len(leases) == 0 {
		return nil
	}
	every := leases[0].Duration
	for _, ls := range leases[1:] {
		every = min(every, ls.Duration)
	}
	h := &heldLeases{leases: leases, every: every / 3, next: time.Now().Add(every / 3)}
	r.mu.Lock()
	r.held[h] = struct{}{}
	r.mu.Unlock()
	r.loop.poke()
	return h
}

// remove stops renewing h's leases (nil: none).
func (r *renewer) remove(h *heldLeases) {
	if h == nil {
		return
	}
	r.mu.Lock()
	delete(r.held, h)
	r.mu.Unlock()
}

// pass renews the leases due (or nearly) and returns the wait until the next are (0:
// none held; add wakes the loop).
func (r *renewer) pass() time.Duration {
	// Real time: leases expire on Redis's clock, which runs with the wall's.
	now := time.Now()
	var due []quotas.Lease
	var owners []*heldLeases // of each lease in due
	var next time.Time
	r.mu.Lock()
	for h := range r.held {
		// Due within a quarter of its period: renewed now, with the
		// others, rather than in a round trip of its own a moment later.
		if !h.next.After(now.Add(h.every / 4)) {
			due = append(due, h.leases...)
			for range h.leases {
				owners = append(owners, h)
			}
			h.next = now.Add(h.every)
		}
		if next.IsZero() || h.next.Before(next) {
			next = h.next
		}
	}
	r.mu.Unlock()
	if len(due) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ok, err := r.m.limiter.RenewAll(ctx, due)
		cancel()
		if err != nil {
			r.m.cfg.Logger.Warn("taskrl: renewing concurrency slots failed; tried again in a third of their lease", "slots", len(due), "err", err)
		}
		r.mu.Lock()
		for i, renewed := range ok {
			// A task that ended meanwhile released its slot: not lost.
			if _, running := r.held[owners[i]]; !renewed && running {
				r.m.cfg.Logger.Warn("taskrl: a concurrency slot was lost before its task ended (its lease ran out)", "rule", due[i].Rule)
			}
		}
		r.mu.Unlock()
	}
	if next.IsZero() {
		return 0
	}
	return max(time.Until(next), time.Millisecond)
}
