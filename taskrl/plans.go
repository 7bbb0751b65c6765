package taskrl

import (
	"context"
	"sync"
	"time"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
)

// A plan a task's payload puts its key on (policy.Rule.Tier) is known only
// to the workers that decide the key's tasks. So that worker status can
// show it (and read the key at its plan's limit), the middleware notes it
// in the limits' Redis: keys.Plan, holding the plan's name, for
// planTTL. Each process writes a (rule, key, plan) once per planEvery,
// from a goroutine (at most planWriters at once; a note that finds them
// busy is left for a later task of the key): no task waits for it.
const (
	planTTL     = 24 * time.Hour
	planEvery   = time.Hour
	planWriters = 4
	maxPlanSeen = 10000 // notes remembered; beyond, all are forgotten (and written again by their keys' next tasks)
)

// planNotes remembers the plans written lately.
type planNotes struct {
	mu   sync.Mutex
	seen map[[3]string]time.Time // (rule, key, plan) -> when written
	sem  chan struct{}
	wg   sync.WaitGroup
}

// notePlans notes the plans b (a ForPayload variant) applied to the task's
// keys.
func (m *Middleware) notePlans(b *policy.Binding, ks []string) {
	for i, r := range b.Rules() {
		if plan := b.Plan(i); plan != "" {
			m.plans.note(m, [3]string{r.Name, ks[i], plan})
		}
	}
}

func (p *planNotes) note(m *Middleware, n [3]string) {
	now := m.cfg.Clock.Now()
	p.mu.Lock()
	if at, ok := p.seen[n]; ok && now.Sub(at) < planEvery {
		p.mu.Unlock()
		return
	}
	select {
	case p.sem <- struct{}{}:
	default:
		p.mu.Unlock()
		return
	}
	if p.seen == nil || len(p.seen) >= maxPlanSeen {
		p.seen = map[[3]string]time.Time{}
	}
	p.seen[n] = now
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer func() { <-p.sem }()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := m.cfg.LimitsClient.Set(ctx, keys.Plan(m.prefix, n[0], n[1]), n[2], planTTL).Err(); err != nil {
			p.mu.Lock()
			delete(p.seen, n) // tried again by a later task
			p.mu.Unlock()
		}
	}()
}
