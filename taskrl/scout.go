package taskrl

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
)

// The scout's constants.
const (
	// scoutEvery is the least time between two looks of one process at a
	// queue for one fair rule.
	scoutEvery = time.Second
	// scoutWindow is the most pending tasks one look reads, newest first.
	scoutWindow = 1000
	// scoutBytes is the most bytes of task messages one look reads.
	scoutBytes = 4 << 20
	// scoutPerFlow is how many tasks of each other flow a look moves at
	// most, and scoutMoves how many in all.
	scoutPerFlow = 50
	scoutMoves   = 200
	// scoutKeep is how long the look's mark lives after a look.
	scoutKeep = time.Minute
)

// scout finds the flows of a fair concurrency rule whose tasks wait in
// asynq's pending list behind another flow's backlog. asynq hands a
// queue's tasks out oldest first, so a flow enqueued behind 500 tasks of
// another asks for the rule's slots only once the workers have gone
// through those (each waiting up to MaxHold for a slot): the rule cannot
// hand it its turn before. When the rule refuses a task, the scout of its
// process looks, at most every scoutEvery per queue and rule, at the
// queue's tasks enqueued (or put back) since the fleet's last look for the
// rule (a mark in the queue's sweep hash), up to scoutWindow of them, and
// moves the oldest scoutPerFlow of each flow of the rule other than the
// refused task's (scoutMoves in all) to the head of the pending list, in
// their order. They ask at once; the
// rule then serves their flows in turn, and crowds out the backlog's
// tasks (fairWaiters), so the workers reach the rest. Nothing is charged
// and no task changes but its place in the list; booked or due tasks stay
// where they are. Safe for concurrent use.
type scout struct {
	m    *Middleware
	mu   sync.Mutex
	last map[scoutKey]time.Time // a look's start, local time
	due  map[scoutKey]string    // looks to make: the refused task's flow
	loop *loop
}

// scoutKey is a queue and a fair rule of it.
type scoutKey struct{ queue, rule string }

func newScout(m *Middleware) *scout {
	s := &scout{m: m, last: map[scoutKey]time.Time{}, due: map[scoutKey]string{}}
	s.loop = newLoop(s.pass)
	return s
}

// note asks for a look at queue for the flows of rule f.rule other than
// f.flow, unless one was made within scoutEvery.
func (s *scout) note(queue string, f fairFlow) {
	k, now := scoutKey{queue, f.rule}, s.m.cfg.Clock.Now()
	s.mu.Lock()
	if now.Sub(s.last[k]) < scoutEvery {
		s.mu.Unlock()
		return
	}
	s.last[k] = now
	s.due[k] = f.flow
	for o, t := range s.last {
		if now.Sub(t) > scoutKeep {
			delete(s.last, o)
		}
	}
	s.mu.Unlock()
	s.loop.poke()
}

// pass makes the looks asked for.
func (s *scout) pass() time.Duration {
	s.mu.Lock()
	due := s.due
	s.due = map[scoutKey]string{}
	s.mu.Unlock()
	for k, flow := range due {
		if err := s.look(k, flow); err != nil {
			s.m.cfg.Logger.Debug("taskrl: scout", "queue", k.queue, "rule", k.rule, "err", err)
		}
	}
	return 0
}

// look moves the oldest tasks of each flow of rule k.rule other than flow
// among those enqueued since the last look to the head of the queue.
func (s *scout) look(k scoutKey, flow string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	listed, err := asynqstore.ScoutRead(ctx, s.m.cfg.Client, asynqstore.Scout{Queue: k.queue, Hash: keys.Sweep(s.m.prefix, k.queue),
		Mark: "scout:" + k.rule, Window: scoutWindow, Bytes: scoutBytes, Keep: scoutKeep})
	if err != nil {
		return err
	}
	p := s.m.policy.Load()
	found := map[string]int{}
	var ids []string
	for _, l := range slices.Backward(listed) { // oldest first
		if l.Msg == "" {
			continue
		}
		f, ok := s.flowOf(p, k, l.Msg)
		if !ok || f == flow || found[f] >= scoutPerFlow {
			continue
		}
		if len(ids) == scoutMoves {
			break
		}
		found[f]++
		ids = append(ids, l.ID)
	}
	_, err = asynqstore.ScoutMove(ctx, s.m.cfg.Client, k.queue, ids)
	return err
}

// flowOf returns a pending task's flow at the fair concurrency rule k.rule
// of its slots; ok is false when the task has none there, or is booked or
// due.
func (s *scout) flowOf(p *policy.Policy, k scoutKey, msg string) (string, bool) {
	_, rq, sp, ok := s.m.bindPending(p, k.queue, msg)
	if !ok {
		return "", false
	}
	for _, f := range sp.fairSlots {
		if f.name == k.rule {
			if flows := pick(rq.Fair, sp.slotIdx); f.i < len(flows) && flows[f.i] != "" {
				return flows[f.i], true
			}
			return "", false
		}
	}
	return "", false
}
