package taskrl

import (
	"slices"
	"sync"
	"time"

	"github.com/taskrl/taskrl/internal/admission"
)

// fairWaiters keeps, per fair concurrency rule and flow, how many tasks of
// this process wait in the worker for one of the rule's slots, and how
// often the flow's tasks start here. While the rule serves other flows
// first (quotas.RuleStatus.Behind), a flow needs only a few tasks asking
// to get its turn when it comes (the rule keeps the slot that frees for
// the flow next in the round); more of them waiting in the workers only
// keep the workers from the other flows' tasks, which then ask too seldom
// to get their share. So a task the rule refuses for another flow while
// crowdWaiters of its flow wait here already is rescheduled at once,
// crowded out, to come back about when its flow would start it: the
// flow's tasks crowded out come back one after another, half the flow's
// recent time between two starts here apart, crowdMin from now at the
// earliest and about crowdAhead at the latest; and each start of the flow
// here pulls the first of them back at once (pull). Safe for concurrent
// use; the zero value is empty.
type fairWaiters struct {
	mu    sync.Mutex
	flows map[fairFlow]*flowWait
	swept time.Time
}

// fairFlow names a flow of a fair concurrency rule.
type fairFlow struct{ rule, flow string }

// flowWait is what fairWaiters keeps of one flow.
type flowWait struct {
	waiting int           // tasks waiting in the workers
	last    time.Time     // its last start here
	gap     time.Duration // the time between two starts here, averaged
	back    time.Time     // when the last task crowded out comes back
	out     []crowdedTask // the tasks crowded out here not yet back, in order
}

// crowdedTask is a task crowded out: its queue, its ID and when it comes
// back.
type crowdedTask struct {
	queue, id string
	back      time.Time
}

const (
	// crowdWaiters is how many tasks of one flow wait in the workers of
	// one process at most while the rule serves another flow first.
	crowdWaiters = 2
	// crowdMin is how soon a task crowded out comes back at the earliest.
	crowdMin = admission.SlotRetry / 4
	// crowdGap is the most one start counts for in a flow's time between
	// two starts.
	crowdGap = 2 * time.Second
	// crowdAhead is how far ahead the returns of a flow's tasks crowded
	// out reach at most: beyond, they come back crowdAhead from now, one
	// after another as they were crowded out.
	crowdAhead = 10 * time.Second
	// crowdKeep is how long a flow nothing happened to is kept.
	crowdKeep = time.Minute
)

// flow returns f's state, making it, and forgets the flows nothing
// happened to for crowdKeep. w.mu must be held.
func (w *fairWaiters) flow(f fairFlow, now time.Time) *flowWait {
	if now.Sub(w.swept) > crowdKeep {
		w.swept = now
		for k, s := range w.flows {
			if s.waiting == 0 && now.Sub(later(s.last, s.back)) > crowdKeep {
				delete(w.flows, k)
			}
		}
	}
	s, ok := w.flows[f]
	if !ok {
		if w.flows == nil {
			w.flows = map[fairFlow]*flowWait{}
		}
		s = &flowWait{}
		w.flows[f] = s
	}
	return s
}

// join counts one more task of f waiting in a worker and returns 0, or, if
// the rule serves another flow first (behind) and crowdWaiters of f wait
// already, returns how long the task (id, of queue; "": one that is not to
// be pulled back) is rescheduled for instead.
func (w *fairWaiters) join(f fairFlow, now time.Time, behind bool, queue, id string) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.flow(f, now)
	if !behind || s.waiting < crowdWaiters {
		s.waiting++
		return 0
	}
	s.back = later(now.Add(crowdMin), earlier(s.back, now.Add(crowdAhead)).Add(max(s.gap/2, time.Millisecond)))
	if s.out = back(s.out, now); id != "" {
		s.out = append(s.out, crowdedTask{queue, id, s.back})
	}
	return s.back.Sub(now)
}

// pull takes up to n of the tasks of f crowded out here that are not back
// yet, those due first, for the pacer to move now: a task of f found a
// slot free, so f needs no more waiting for its turn.
func (w *fairWaiters) pull(f fairFlow, now time.Time, n int) []crowdedTask {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.flows[f]
	if s == nil {
		return nil
	}
	s.out = back(s.out, now)
	n = min(n, len(s.out))
	pulled := slices.Clone(s.out[:n])
	s.out = slices.Delete(s.out, 0, n)
	return pulled
}

// back drops the tasks of out (in order of coming back) back by now.
func back(out []crowdedTask, now time.Time) []crowdedTask {
	i := 0
	for i < len(out) && !out[i].back.After(now) {
		i++
	}
	return slices.Delete(out, 0, i)
}

// leave counts one task of f fewer waiting (the zero fairFlow: none).
func (w *fairWaiters) leave(f fairFlow) {
	if f == (fairFlow{}) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.flows[f]; s != nil && s.waiting > 0 {
		s.waiting--
	}
}

// started notes that a task of f took its slot.
func (w *fairWaiters) started(f fairFlow, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.flow(f, now)
	if !s.last.IsZero() {
		g := min(now.Sub(s.last), crowdGap)
		if s.gap == 0 {
			s.gap = g
		} else {
			s.gap = (4*s.gap + g) / 5
		}
	}
	s.last = now
}
