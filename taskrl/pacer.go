package taskrl

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
)

//go:embed pace.lua
var paceLua string

var paceScript = script.New(paceLua, "gcra")

// pacer moves rescheduled tasks from asynq's scheduled set to pending at
// their booked slot, to the millisecond, instead of at the next whole second
// asynq would use. Each rescheduled copy is also scheduled in asynq itself a
// little after its slot, so if no pacer runs (every worker down), the task
// still runs, only late. One pacer runs per Middleware, for every queue the
// middleware has served or been configured for.
type pacer struct {
	m      *Middleware
	id     string   // this pacer's name in the leadership of a queue
	queues sync.Map // queue name -> pacing key
	wake   chan struct{}
	stop   chan struct{}
	once   sync.Once
	done   sync.WaitGroup
}

// paceSlack is how long after its booked slot asynq itself runs a copy that
// no pacer moved.
const paceSlack = 2 * time.Second

// paceLead is how long before its slot the pacer moves a copy to pending:
// enough for an idle worker to pick it up (ServerConfig's 50ms
// TaskCheckInterval) so that it waits for its slot in the worker, briefly,
// instead of starting a varying time after it.
const paceLead = 150 * time.Millisecond

func newPacer(m *Middleware) *pacer {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &pacer{m: m, id: hex.EncodeToString(b[:]), wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// paceLease is how long a pacer leads a queue without claiming; another
// takes over when it lapses.
const paceLease = 2 * time.Second

// paceIdle is the longest a leading pacer sleeps, so that it sees copies
// other processes book for earlier slots.
const paceIdle = 50 * time.Millisecond

func (p *pacer) key(queue string) string {
	if k, ok := p.queues.Load(queue); ok {
		return k.(string)
	}
	k, _ := p.queues.LoadOrStore(queue, p.m.prefix+"pace:{"+keys.Encode(queue)+"}")
	p.start()
	return k.(string)
}

func (p *pacer) start() {
	p.once.Do(func() {
		p.done.Add(1)
		go p.run()
	})
}

// add records the copy's booked slot and wakes the pacer.
func (p *pacer) add(ctx context.Context, queue, id string, booked time.Time) error {
	err := paceScript.Run(ctx, p.m.cfg.Client, []string{p.key(queue)}, 0, -1, id, booked.UnixMicro(), 0).Err()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return err
}

func (p *pacer) run() {
	defer p.done.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-p.wake:
		case <-timer.C:
		}
		next := time.Second
		p.queues.Range(func(q, k any) bool {
			if wait, ok := p.claim(q.(string), k.(string)); ok {
				next = min(next, wait)
			}
			return true
		})
		timer.Reset(max(next, 2*time.Millisecond))
	}
}

// claim moves the due copies of one queue to pending and returns when to
// look again: soon when it leads the queue, when the lease lapses if
// another pacer does.
func (p *pacer) claim(queue, key string) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := paceScript.Run(ctx, p.m.cfg.Client, []string{key, key + ":leader"}, 1, -1, 100, paceLead.Microseconds(), p.id, paceLease.Milliseconds()).Slice()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			p.m.cfg.Logger.Warn("taskrl: pacer", "queue", queue, "err", err)
		}
		return 0, false
	}
	first, _ := v[0].(int64)
	if first == -3 {
		ms, _ := v[1].(int64)
		return min(time.Duration(ms)*time.Millisecond, paceLease), true
	}
	for _, id := range v[1:] {
		// A copy that asynq already moved, or that is gone, needs nothing.
		if err := p.m.inspect.RunTask(queue, id.(string)); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			p.m.cfg.Logger.Debug("taskrl: pacer could not run a task", "queue", queue, "task", id, "err", err)
		}
	}
	if len(v) > 1 {
		return 0, true // more may be due
	}
	if first < 0 {
		return paceIdle, true
	}
	return min(time.Duration(first)*time.Microsecond, paceIdle), true
}

// close stops the pacer and waits for it.
func (p *pacer) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.done.Wait()
}

// formatID is the ID of round n's copy of the task whose first ID is origin.
func formatID(origin string, n int) string { return origin + "~" + strconv.Itoa(n) }
