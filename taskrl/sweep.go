package taskrl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/limits"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// The sweep's constants.
const (
	// sweepLead is how long before its estimated slot a task set aside is
	// due: asynq's forwarder moves due tasks to pending every 5 s, and a
	// task that comes back early books its slot then.
	sweepLead = 6 * time.Second
	// sweepAhead: a backlog is noted when a task of it is rescheduled at
	// least this far ahead, and a task whose estimated slot is closer stays
	// pending. Setting tasks aside reorders them against other backlogs'
	// (bookings are first come, first served), so only tasks far behind
	// their own backlog's queue are moved: near ones would be booked within
	// moments anyway.
	sweepAhead = time.Minute
	// sweepWindow is the most pending tasks one pass reads.
	sweepWindow = 1000
	// sweepBytes is the most bytes of task messages one pass reads.
	sweepBytes = 4 << 20
	// sweepPasses is the most passes of one sweep.
	sweepPasses = 50
	// sweepKept is the most tasks a sweep leaves in place behind it (each
	// move rewrites the pending list's tail up to the window).
	sweepKept = 10 * sweepWindow
	// sweepBacklog is the fewest pending tasks worth a sweep.
	sweepBacklog = 200
	// sweepEvery is the least time between two sweeps of a queue by one
	// process.
	sweepEvery = 200 * time.Millisecond
	// sweepLock is how long a sweeper holds a queue's lock after a pass.
	sweepLock = 2 * time.Second
	// sweepNotes is the most backlogs one process remembers per queue.
	sweepNotes = 10000
)

// sweeper sets a backlog aside so that it does not hold back the tasks
// queued behind it. asynq runs a queue's pending tasks in order, so 10,000
// tasks of one business that may run 2 a second would stand between every
// task enqueued after them and a worker for as long as the fleet takes to
// dequeue and reschedule each. When the middleware reschedules a task by
// at least sweepAhead (reschedule notes its backlog: the rules and keys of
// its rate and window rules, the slot it got), the sweeper of that process
// reads the queue's oldest pending tasks, sweepWindow (or sweepBytes) at a
// time, and moves
// those of a noted backlog to asynq's scheduled set, each due sweepLead
// before the slot it is estimated to get: the backlog's last slot plus one
// spacing (its tightest rule's interval) per task before it, if that is at
// least sweepAhead away. Nothing is
// charged or booked: a task set aside decides when it comes back, as if it
// had stayed in the queue, so the limits are exactly as before; only the
// order changes. Each process sweeps at most every sweepEvery; one sweeper
// at a time moves a queue's tasks (a lock in Redis), and the estimates
// continue from one fleet-wide cursor per backlog, so that sweeps by
// different processes do not give two tasks one slot. Tasks with a
// deadline before their estimated slot, booked or due tasks, and tasks
// with an adaptive or a critical binding are left in place.
type sweeper struct {
	m     *Middleware
	token string
	mu    sync.Mutex
	qs    map[string]*sweepQueue
	loop  *loop
}

// sweepQueue is the sweeper's state for one queue.
type sweepQueue struct {
	notes map[string]sweepNote // by backlog signature
	next  time.Time            // the earliest next sweep, local time
}

// sweepNote is what the sweeper knows of one backlog.
type sweepNote struct {
	slot    int64 // the latest slot or due time noted, server µs
	spacing int64 // µs between two of its tasks at its tightest rule
}

func newSweeper(m *Middleware) *sweeper {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	s := &sweeper{m: m, token: hex.EncodeToString(b), qs: map[string]*sweepQueue{}}
	s.loop = newLoop(s.sweepDue)
	return s
}

// note records that a task of backlog sig in queue was rescheduled to
// slot, and wakes the sweeper.
func (s *sweeper) note(queue, sig string, spacing time.Duration, slot time.Time) {
	s.remember(queue, sig, spacing, slot)
	s.loop.poke()
}

// remember records a backlog's slot.
func (s *sweeper) remember(queue, sig string, spacing time.Duration, slot time.Time) {
	s.mu.Lock()
	q, ok := s.qs[queue]
	if !ok {
		q = &sweepQueue{notes: map[string]sweepNote{}}
		s.qs[queue] = q
	}
	n := q.notes[sig]
	if len(q.notes) < sweepNotes || n.spacing > 0 {
		q.notes[sig] = sweepNote{slot: max(n.slot, slot.UnixMicro()), spacing: spacing.Microseconds()}
	}
	s.mu.Unlock()
}

// sweepDue sweeps every queue with a live backlog whose turn has come and
// returns when to look again (0: only when woken).
func (s *sweeper) sweepDue() time.Duration {
	now := s.m.cfg.Clock.Now()
	serverNow := s.m.serverNow().UnixMicro()
	var due []string
	var wait time.Duration
	s.mu.Lock()
	for name, q := range s.qs {
		for sig, n := range q.notes {
			if n.slot < serverNow {
				delete(q.notes, sig) // its backlog has come due
			}
		}
		switch {
		case len(q.notes) == 0:
		case now.Before(q.next):
			if w := q.next.Sub(now); wait == 0 || w < wait {
				wait = w
			}
		default:
			q.next = now.Add(sweepEvery)
			due = append(due, name)
		}
	}
	s.mu.Unlock()
	for _, name := range due {
		if err := s.sweep(name); err != nil {
			s.m.cfg.Logger.Debug("taskrl: sweep", "queue", name, "err", err)
		}
	}
	return wait
}

// sweep moves the noted backlogs' tasks among queue's oldest pending ones
// to asynq's scheduled set, a window at a time, while a window is full and
// has any to move.
func (s *sweeper) sweep(queue string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.mu.Lock()
	notes := make(map[string]sweepNote, len(s.qs[queue].notes))
	for sig, n := range s.qs[queue].notes {
		notes[sig] = n
	}
	s.mu.Unlock()
	c, p := s.m.cfg.Client, s.m.policy.Load()
	key := keys.Sweep(s.m.prefix, queue)
	read := func(off, window, least int, hold time.Duration) (bool, bool, []asynqstore.Listed, error) {
		return asynqstore.SweepRead(ctx, c, asynqstore.Look{Queue: queue, Lock: key, Now: s.m.serverNow().UnixMicro(), Token: s.token, Hold: hold,
			Offset: off, Window: window, Least: least, Bytes: sweepBytes})
	}
	locked := false
	defer func() {
		if locked { // let the next sweeper in
			_, _, _, _ = read(0, 0, 0, 0)
		}
	}()
	off, total := 0, 0
	defer func() {
		if total > 0 {
			s.m.cfg.Logger.Info("taskrl: set a backlog aside", "queue", queue, "tasks", total)
		}
	}()
	for pass := 0; pass < sweepPasses; pass++ {
		least := sweepBacklog // to start a sweep; once started, it goes on
		if pass > 0 {
			least = 1
		}
		mine, full, listed, err := read(off, sweepWindow, least, sweepLock)
		if err != nil || !mine || len(listed) == 0 {
			return err // another process is sweeping the queue, or nothing to do
		}
		locked = true
		window := len(listed)
		group := map[string]int{}
		var backlogs []asynqstore.Backlog
		var tasks []asynqstore.Swept
		for _, l := range listed {
			if l.ID == "" || l.Msg == "" {
				continue
			}
			sig, deadline, ok := s.backlogOf(p, queue, l.Msg)
			n, noted := notes[sig]
			if !ok || !noted {
				continue
			}
			g, ok := group[sig]
			if !ok {
				g = len(group) + 1
				group[sig] = g
				backlogs = append(backlogs, asynqstore.Backlog{Sig: sig, First: n.slot + n.spacing, Spacing: n.spacing})
			}
			tasks = append(tasks, asynqstore.Swept{ID: l.ID, Backlog: g, Deadline: deadline})
		}
		if len(tasks) == 0 {
			return nil
		}
		serverNow := s.m.serverNow()
		moved, ok, err := asynqstore.SweepMove(ctx, c, asynqstore.Sweep{
			Queue: queue, Lock: key, Now: serverNow.UnixMicro(), Token: s.token, Look: off + window,
			Skew: time.Now().UnixMicro() - serverNow.UnixMicro(), Lead: sweepLead.Microseconds(), Soon: sweepAhead.Microseconds(),
			Backlogs: backlogs, Tasks: tasks,
		})
		if err != nil || !ok {
			return err // !ok: the lock lapsed
		}
		total += moved
		off += window - moved
		if moved == 0 || !full || off > sweepKept {
			return nil
		}
	}
	return nil
}

// backlogOf returns the backlog signature, and the deadline, of a pending
// task's message; ok is false for a task the sweep leaves in place.
func (s *sweeper) backlogOf(p *policy.Policy, queue, msg string) (sig string, deadline int64, ok bool) {
	t, rq, sp, ok := s.m.bindPending(p, queue, msg)
	if !ok || sp.spacing == 0 {
		return "", 0, false
	}
	return sp.signature(rq.Keys, pick(rq.Costs, sp.rateIdx)), t.Deadline, true
}

// bindPending decodes a pending task's message and binds it to p as the
// middleware would when it runs; ok is false for a task that is booked or
// due (rescheduled by taskrl: its moment is set), or that p does not
// govern or cannot key.
func (m *Middleware) bindPending(p *policy.Policy, queue, msg string) (t asynqstore.Msg, rq limits.Request, sp *split, ok bool) {
	t, err := asynqstore.Decode([]byte(msg))
	if err != nil {
		return t, rq, nil, false
	}
	if _, booked := t.Headers[HeaderBooked]; booked {
		return t, rq, nil, false
	}
	if _, due := t.Headers[HeaderDue]; due {
		return t, rq, nil, false
	}
	b := p.Bind(t.Type, queue)
	if b == nil {
		return t, rq, nil, false
	}
	if rq, err = b.Request(t.Payload); err != nil {
		return t, rq, nil, false
	}
	sp, err = m.split(b.ForPayload(rq.Keys, t.Payload))
	return t, rq, sp, err == nil
}

// signature names the backlog of a task of sp with keys (one per rule of
// its binding) and costs (one per rate rule; nil: none has a Cost): its
// rate and window rules, their limits, their keys and its costs.
func (sp *split) signature(keys []string, costs []int) string {
	h := fnv.New128a()
	h.Write([]byte(sp.digest))
	for i, r := range sp.rates.Rules() {
		fmt.Fprintf(h, "\x00%s\x00%d\x00%s", r.Name, len(keys[sp.rateIdx[i]]), keys[sp.rateIdx[i]])
		if costs != nil && costs[i] != 1 {
			fmt.Fprintf(h, "\x00cost %d", costs[i])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// costSpacing is sp.spacing for tasks of costs (one per rate rule; nil:
// 1 each): each rule's interval times the task's cost on it.
func (sp *split) costSpacing(costs []int) time.Duration {
	if costs == nil || sp.spacing == 0 {
		return sp.spacing
	}
	return spacingOf(sp.rates.Rules(), costs)
}

// spacing returns the least time between two tasks under rules, at the
// tightest of them: a GCRA rule's interval, a fixed or sliding window's
// length over its limit. 0 when none of them says (calendar windows,
// concurrency), or an adaptive rule learns the rate.
func spacing(rules []quotas.Rule) time.Duration { return spacingOf(rules, nil) }

// spacingOf is spacing for tasks that cost costs[i] units of rules[i]
// (nil: 1 each).
func spacingOf(rules []quotas.Rule, costs []int) time.Duration {
	var d time.Duration
	for i, r := range rules {
		n := time.Duration(1)
		if costs != nil {
			n = time.Duration(max(costs[i], 1))
		}
		switch l := r.Limit.(type) {
		case quotas.GCRA:
			d = max(d, n*time.Duration(float64(l.Period)/l.Rate))
		case quotas.FixedWindow:
			d = max(d, n*l.Every/time.Duration(l.Limit))
		case quotas.SlidingWindow:
			d = max(d, n*l.Every/time.Duration(l.Limit))
		case quotas.Adaptive:
			return 0
		}
	}
	return d
}

// close stops the sweeper and waits for it.
func (s *sweeper) close() { s.loop.close() }
