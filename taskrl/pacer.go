package taskrl

import (
	"container/heap"
	"context"
	_ "embed"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
)

//go:embed pace.lua
var paceLua string

var paceScript = script.New(paceLua, "gcra")

// pacer moves rescheduled tasks from asynq's scheduled set to pending a
// lead before their booked slot (admission.PaceLead: longer than an idle
// worker sleeps between two looks at its queues), so that a worker has
// picked each up by its slot and waits for it there, instead of asynq
// moving it at the next check of its scheduled set, seconds later. The
// pacer of the process that booked a copy claims it then (and with it
// any other copy then due, whoever booked it); every pacer also looks
// every paceIdle, with one cheap command, for due copies of processes that
// died before their slot. Each copy is also scheduled in asynq itself a
// little after its slot, so if no pacer runs (every worker down), the task
// still runs, only late. One pacer runs per Middleware, for every queue
// the middleware has served or been configured for.
type pacer struct {
	pacerDeps
	lead atomic.Int64 // admission.PaceLead, ns
	mu   sync.Mutex
	qs   map[string]*paceQueue
	loop *loop
}

// paceQueue is the pacer's state for one queue.
type paceQueue struct {
	key  string
	own  slots     // slots of the copies this process booked, server µs
	poll time.Time // when to look for others' due copies next
	hold time.Time // after a failed claim: no claim before then
}

// paceSlack is how long after its booked slot asynq itself runs a copy that
// no pacer moved.
const paceSlack = 2 * time.Second

// paceUnbooked is how far ahead at most an unbooked copy is paced.
const paceUnbooked = time.Minute

// paceIdle is how often a pacer looks for due copies it did not book.
const paceIdle = 2 * time.Second

// paceKeep is how long a pacing set outlives its last slot.
const paceKeep = time.Minute

// paceBatch is the most copies one claim moves.
const paceBatch = 100

// pacerDeps is what a pacer uses of its middleware.
type pacerDeps struct {
	client  redis.UniversalClient
	inspect *asynq.Inspector
	logger  *slog.Logger
	clock   Clock
	skew    *clock.Skew // of the server's clock
	prefix  string
}

func (p *pacer) serverNow() time.Time { return p.skew.Server(p.clock.Now()) }

func newPacer(deps pacerDeps) *pacer {
	p := &pacer{pacerDeps: deps, qs: map[string]*paceQueue{}}
	p.loop = newLoop(func() time.Duration { return max(p.pass(), 2*time.Millisecond) })
	p.setLead(admission.PaceLead(0))
	return p
}

// setLead sets how long before its slot a copy is moved to pending.
func (p *pacer) setLead(d time.Duration) { p.lead.Store(int64(d)) }

func (p *pacer) leadTime() time.Duration { return time.Duration(p.lead.Load()) }

// queue returns the state of queue, starting the pacer on first use.
// p.mu must be held.
func (p *pacer) queue(name string) *paceQueue {
	q, ok := p.qs[name]
	if !ok {
		q = &paceQueue{key: keys.Pace(p.prefix, name)}
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

// add records the copy's booked slot and wakes the pacer to claim it then.
func (p *pacer) add(ctx context.Context, queue, id string, booked time.Time) error {
	p.mu.Lock()
	q := p.queue(queue)
	p.mu.Unlock()
	// The set lives until a minute after its last slot: each add sets that
	// expiry if the set has none (NX) or an earlier one (GT). Three plain
	// commands in one round trip cost Redis a fifth of a script's time.
	expire := max(booked.UnixMilli(), p.serverNow().UnixMilli()) + paceKeep.Milliseconds()
	_, err := p.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZAdd(ctx, q.key, redis.Z{Score: float64(booked.UnixMicro()), Member: id})
		pipe.Do(ctx, "PEXPIREAT", q.key, expire, "NX")
		pipe.Do(ctx, "PEXPIREAT", q.key, expire, "GT")
		return nil
	})
	if err == nil {
		p.mu.Lock()
		heap.Push(&q.own, booked.UnixMicro())
		p.mu.Unlock()
	}
	p.loop.poke()
	return err
}

// pass claims the copies due in every queue where this process booked
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
		ownDue := q.own.Len() > 0 && q.own[0]-lead.Microseconds() <= serverNow
		p.mu.Unlock()
		if !now.Before(q.hold) && (ownDue || !now.Before(q.poll) && p.othersDue(name, q, serverNow+lead.Microseconds())) {
			p.claim(name, q, lead)
		}
		p.mu.Lock()
		if q.own.Len() > 0 {
			next = min(next, max(time.Duration(q.own[0]-lead.Microseconds()-serverNow)*time.Microsecond, q.hold.Sub(p.clock.Now())))
		}
		p.mu.Unlock()
		next = min(next, max(q.poll.Sub(p.clock.Now()), q.hold.Sub(p.clock.Now())))
	}
	return next
}

// othersDue reports whether queue has a copy due by server time by (µs),
// with one command, and sets the next look paceIdle from now.
func (p *pacer) othersDue(queue string, q *paceQueue, by int64) bool {
	q.poll = p.clock.Now().Add(paceIdle)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	due, err := p.client.ZRangeByScore(ctx, q.key, &redis.ZRangeBy{Min: "-inf", Max: strconv.FormatInt(by, 10), Count: 1}).Result()
	if err != nil {
		p.logger.Debug("taskrl: pacer could not look for due copies", "queue", queue, "err", err)
		return false
	}
	return len(due) > 0
}

// claim moves the copies of one queue due within lead to pending and
// forgets this process's slots that are now due.
func (p *pacer) claim(queue string, q *paceQueue, lead time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := paceScript.Run(ctx, p.client, []string{q.key}, -1, paceBatch, lead.Microseconds()).StringSlice()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			p.logger.Warn("taskrl: pacer", "queue", queue, "err", err)
		}
		q.hold = p.clock.Now().Add(200 * time.Millisecond)
		return
	}
	for _, id := range v {
		// A copy that asynq already moved, or that is gone, needs nothing.
		if err := p.inspect.RunTask(queue, id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			p.logger.Debug("taskrl: pacer could not run a task", "queue", queue, "task", id, "err", err)
		}
	}
	if len(v) >= paceBatch {
		q.poll = p.clock.Now() // more may be due
		return
	}
	p.mu.Lock()
	p.dropDue(q, p.clock.Now(), lead)
	p.mu.Unlock()
}

// dropDue forgets this process's slots due by local time t plus the lead:
// a claim has just moved them. p.mu must be held.
func (p *pacer) dropDue(q *paceQueue, t time.Time, lead time.Duration) {
	limit := p.skew.Server(t).Add(lead).UnixMicro()
	for q.own.Len() > 0 && q.own[0] <= limit {
		heap.Pop(&q.own)
	}
}

// slots is a min-heap of booked slots in server microseconds.
type slots []int64

func (s slots) Len() int           { return len(s) }
func (s slots) Less(i, j int) bool { return s[i] < s[j] }
func (s slots) Swap(i, j int)      { s[i], s[j] = s[j], s[i] }
func (s *slots) Push(x any)        { *s = append(*s, x.(int64)) }
func (s *slots) Pop() any {
	old := *s
	x := old[len(old)-1]
	*s = old[:len(old)-1]
	return x
}

// close stops the pacer and waits for it.
func (p *pacer) close() { p.loop.close() }
