package taskrl

import (
	"container/heap"
	"context"
	_ "embed"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
)

// pacer moves waiting tasks from asynq's scheduled set to pending a lead
// before their booked slot (admission.PaceLead: longer than an idle worker
// sleeps between two looks at its queues), so that a worker has picked
// each up by its slot and waits for it there, instead of asynq moving it
// at the next check of its scheduled set, seconds later. The pacer of the
// process that parked a task claims it then, once asynq is done with the
// run that parked it (and with it any other task then due that was parked
// paceFence ago or more, whoever parked it); every pacer also looks every
// paceIdle, with one cheap command, for due tasks of processes that died
// before their slot. Each task is also scheduled in asynq itself a little
// after its slot, so if no pacer runs (every worker down), it still runs,
// only late. One pacer runs per Middleware, for every queue the middleware
// has served or been configured for.
type pacer struct {
	pacerDeps
	lead atomic.Int64 // admission.PaceLead, ns
	mu   sync.Mutex
	qs   map[string]*paceQueue
	loop *loop
}

// paceQueue is the pacer's state for one queue.
type paceQueue struct {
	key, moved, early string    // keys.Pace, keys.Moved, keys.Early
	own               slots     // the tasks this process parked, by when to move them
	poll              time.Time // when to look for others' due tasks next
	hold              time.Time // after a failed claim: no claim before then
	last              int64     // server µs of the last claim made
}

// paceSlack is how long after its booked slot asynq itself runs a task that
// no pacer moved.
const paceSlack = 2 * time.Second

// paceFence is how long after a task was parked a pacer that did not park
// it may move it. The pacer that parked it moves it as soon as asynq is
// done with the run that parked it: asynq's write after that run (Done,
// MarkAsComplete) must find the task gone from its active list, not back
// in it, or it would end the task's next run.
const paceFence = paceSlack

// paceUnbooked is how far ahead at most an unbooked task is paced.
const paceUnbooked = time.Minute

// paceIdle is how often a pacer looks for due tasks it did not park.
const paceIdle = 2 * time.Second

// paceKeep is how long a pacing set outlives its last slot.
const paceKeep = time.Minute

// paceBatch is the most tasks one claim looks at.
const paceBatch = 100

// paceBusyLead is how long before its slot a task moved to pending goes to
// the head of the list, where a busy worker takes it as soon as it is
// free; one moved earlier goes to the tail, behind the tasks not yet
// decided, and to the head by a claim pacePromote to paceBusyLead before
// its slot if no worker has taken it by then (unpark.lua). The process
// that moved it claims again paceBusyLead before the slot unless it made
// a claim since 450 ms before it (pacePromote less a margin for its
// estimate of the server's clock).
const (
	paceBusyLead = 300 * time.Millisecond
	pacePromote  = 2 * paceBusyLead
)

// pacerDeps is what a pacer uses of its middleware.
type pacerDeps struct {
	client redis.UniversalClient
	logger *slog.Logger
	clock  Clock
	skew   *clock.Skew // of the server's clock
	prefix string
}

func (p *pacer) serverNow() time.Time { return p.skew.Server(p.clock.Now()) }

func newPacer(deps pacerDeps) *pacer {
	p := &pacer{pacerDeps: deps, qs: map[string]*paceQueue{}}
	p.loop = newLoop(func() time.Duration { return max(p.pass(), 2*time.Millisecond) })
	p.setLead(admission.PaceLead(0))
	return p
}

// setLead sets how long before its slot a task is moved to pending.
func (p *pacer) setLead(d time.Duration) { p.lead.Store(int64(d)) }

func (p *pacer) leadTime() time.Duration { return time.Duration(p.lead.Load()) }

// queue returns the state of queue, starting the pacer on first use.
// p.mu must be held.
func (p *pacer) queue(name string) *paceQueue {
	q, ok := p.qs[name]
	if !ok {
		q = &paceQueue{key: keys.Pace(p.prefix, name), moved: keys.Moved(p.prefix, name), early: keys.Early(p.prefix, name)}
		p.qs[name] = q
		p.loop.start()
	}
	return q
}

// serve makes the pacer look after queue from now on.
func (p *pacer) serve(queue string) {
	p.mu.Lock()
	p.queue(queue)
	p.mu.Unlock()
}

// add notes a task this process parked, to move at server µs at, once
// done is closed (nil: at once): asynq is done with the run that parked
// it. The park itself recorded the task in the queue's pacing set.
func (p *pacer) add(queue, id string, at int64, done <-chan struct{}) {
	p.mu.Lock()
	q := p.queue(queue)
	heap.Push(&q.own, own{at: at, id: id, done: done})
	p.mu.Unlock()
	p.loop.poke()
	if done != nil {
		go func() {
			<-done
			p.loop.poke()
		}()
	}
}

// pull makes tasks this process parked in queue (ids) due now, in the
// queue's pacing set and here, and wakes the pacer: they move to pending
// at once. A task no longer in the pacing set is left alone.
func (p *pacer) pull(queue string, ids []string) {
	if len(ids) == 0 {
		return
	}
	now := p.serverNow().UnixMicro()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	zs := make([]redis.Z, len(ids))
	for i, id := range ids {
		zs[i] = redis.Z{Score: float64(now), Member: id}
	}
	if err := p.client.ZAddArgs(ctx, keys.Pace(p.prefix, queue), redis.ZAddArgs{XX: true, LT: true, Members: zs}).Err(); err != nil {
		p.logger.Debug("taskrl: pacer could not pull tasks", "queue", queue, "err", err)
		return
	}
	p.mu.Lock()
	q := p.queue(queue)
	for i := range q.own {
		if slices.Contains(ids, q.own[i].id) && q.own[i].at > now {
			q.own[i].at, q.own[i].early = now, false
		}
	}
	heap.Init(&q.own)
	p.mu.Unlock()
	p.loop.poke()
}

// pass claims the tasks due in every queue where this process parked
// some, looks for others' where that is due, and returns when to look
// again.
func (p *pacer) pass() time.Duration {
	p.mu.Lock()
	qs := make(map[string]*paceQueue, len(p.qs))
	for name, q := range p.qs {
		qs[name] = q
	}
	p.mu.Unlock()
	lead := p.leadTime()
	next := paceIdle
	for name, q := range qs {
		now, serverNow := p.clock.Now(), p.serverNow().UnixMicro()
		p.mu.Lock()
		mine, waiting := q.own.due(serverNow + lead.Microseconds())
		p.mu.Unlock()
		switch {
		case now.Before(q.hold): // a claim failed a moment ago
			p.mu.Lock()
			q.own.keep(mine)
			p.mu.Unlock()
		case len(mine) > 0 || !now.Before(q.poll) && p.othersDue(name, q, serverNow+lead.Microseconds()):
			p.claim(name, q, lead, mine)
		}
		p.mu.Lock()
		if q.own.Len() > 0 && !waiting {
			next = min(next, max(time.Duration(q.own[0].at-lead.Microseconds()-serverNow)*time.Microsecond, q.hold.Sub(p.clock.Now())))
		}
		p.mu.Unlock()
		next = min(next, max(q.poll.Sub(p.clock.Now()), q.hold.Sub(p.clock.Now())))
	}
	return next
}

// othersDue reports whether queue has a task due by server time by (µs),
// with one command, and sets the next look paceIdle from now.
func (p *pacer) othersDue(queue string, q *paceQueue, by int64) bool {
	q.poll = p.clock.Now().Add(paceIdle)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	due, err := p.client.ZRangeByScore(ctx, q.key, &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(by, 10), Count: 1}).Result()
	if err != nil {
		p.logger.Debug("taskrl: pacer could not look for due tasks", "queue", queue, "err", err)
		return false
	}
	return len(due) > 0
}

// claim moves the tasks of one queue due within lead to pending: mine,
// parked here, whose runs asynq is done with, and any parked paceFence ago
// or more. Those of mine it could not move are noted again; if it put
// tasks at the tail of pending behind others, those of mine it moved
// ahead of paceBusyLead are noted for a claim paceBusyLead before their
// slots, made unless a claim since 450 ms before the slot (pacePromote
// less a margin) has moved them to the head already.
func (p *pacer) claim(queue string, q *paceQueue, lead time.Duration, mine []own) {
	serverNow := p.serverNow().UnixMicro()
	var ids []string
	promote := false
	for _, o := range mine {
		switch {
		case !o.early:
			ids = append(ids, o.id)
		case q.last < o.slot-(pacePromote-paceBusyLead/2).Microseconds():
			// No claim of ours since pacePromote before its slot (with a
			// margin for q.last, an estimate of the script's clock). Not
			// named (Claim.Mine lets a task through the fence): it may
			// have run and been parked again since.
			promote = true
		}
	}
	if len(mine) > 0 && len(ids) == 0 && !promote {
		return // a claim since 450 ms before their slots promoted them
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := asynqstore.Unpark(ctx, p.client, asynqstore.Claim{
		Queue: queue, PaceKey: q.key, Moved: q.moved, Early: q.early, Now: -1, Most: paceBatch, Lead: lead.Microseconds(),
		BusyLead: paceBusyLead.Microseconds(), Promote: pacePromote.Microseconds(), Fence: paceFence.Microseconds(), Mine: ids,
	})
	if err != nil {
		p.logger.Warn("taskrl: pacer", "queue", queue, "err", err)
		p.mu.Lock()
		q.own.keep(mine)
		p.mu.Unlock()
		q.hold = p.clock.Now().Add(200 * time.Millisecond)
		return
	}
	q.last = serverNow
	var early []own
	for _, o := range mine {
		if u.Noted > 0 && !o.early && o.at-serverNow > paceBusyLead.Microseconds()/2 {
			// Maybe moved to the tail (the script reads the server's
			// clock itself): a claim when at-lead is, paceBusyLead before
			// the slot.
			early = append(early, own{at: o.at - paceBusyLead.Microseconds() + lead.Microseconds(), id: o.id, slot: o.at, early: true})
		}
	}
	p.mu.Lock()
	q.own.keep(early)
	p.mu.Unlock()
	if u.Looked >= paceBatch {
		q.poll = p.clock.Now() // more may be due
	}
}

// own is a task this process parked: when to move it (server µs), and
// when asynq is done with the run that parked it (done closed, or nil).
type own struct {
	at   int64
	id   string
	done <-chan struct{}
	// early: at is its slot less paceBusyLead plus the lead; the claim
	// then moves it from the tail of pending to its head.
	early bool
	slot  int64 // of an early one, server µs
}

// slots is a min-heap of the tasks this process parked, by when to move
// them.
type slots []own

func (s slots) Len() int           { return len(s) }
func (s slots) Less(i, j int) bool { return s[i].at < s[j].at }
func (s slots) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }
func (s *slots) Push(x any)        { *s = append(*s, x.(own)) }
func (s *slots) Pop() any {
	old := *s
	x := old[len(old)-1]
	*s = old[:len(old)-1]
	return x
}

// due takes the tasks due by server µs by whose runs asynq is done with;
// waiting reports that a due task's run is not done yet (its done wakes
// the pacer).
func (s *slots) due(by int64) (mine []own, waiting bool) {
	var later []own
	for s.Len() > 0 && (*s)[0].at <= by {
		o := heap.Pop(s).(own)
		if o.done != nil {
			select {
			case <-o.done:
			default:
				later, waiting = append(later, o), true
				continue
			}
		}
		mine = append(mine, o)
	}
	s.keep(later)
	return mine, waiting
}

// keep notes os again.
func (s *slots) keep(os []own) {
	for _, o := range os {
		heap.Push(s, o)
	}
}

// close stops the pacer and waits for it.
func (p *pacer) close() { p.loop.close() }
