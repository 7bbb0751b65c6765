// Package estimate predicts how long a campaign takes under a policy's
// limits, without Redis: the enqueue binary's --dry-run.
//
// The simulation decides on a quotas.Model, the in-memory twin of the
// limiter the worker middleware uses, with every limit idle at
// Options.Start, as the middleware does with a backlog dequeued at once:
// at Start, in enqueue order, each task books the earliest moment at which
// every rate rule that applies to it (GCRA, fixed, calendar and sliding
// windows) admits it (quotas.Limiter.Reserve, with no horizon), and
// admission.Plan, the middleware's own, says what the task does with the
// decision; a reservation that gives up (rules whose moments lie too far
// apart to agree in one call) is made again at the moment it found, as the
// worker reschedules the task. Then, in time order, each task takes its
// concurrency slots at its moment (quotas.Limiter.Allow) or waits until a
// slot of the rule that denied it is released, first come first served by
// enqueue order, and holds them for Options.TaskDuration. A GCRA rule thus
// places a task held back by another rule at its own moment and leaves the
// capacity before it to the tasks after it; at most Max-Reserved tasks of
// a concurrency key run at once.
//
// Not modelled: the worker's own concurrency, the tasks' failures, retries
// and upstream 429s, the middleware's MaxReserve horizon and MaxHold, and
// fair sharing (a fair rule is taken as a plain one: the campaign's tasks
// are booked in enqueue order), per-key overrides and plans (every key is
// decided at its rule's own limit); the estimate is the time the limits
// alone impose.
//
// Application code of the binaries, imported by cmd/enqueue.
package estimate

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/internal/admission"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// DefaultTaskDuration is Options.TaskDuration when it is zero.
const DefaultTaskDuration = time.Second

// Options tune a simulation.
type Options struct {
	// Start is when the campaign is enqueued, with every limit idle.
	// Default time.Now().
	Start time.Time
	// TaskDuration is how long each task runs, holding its concurrency
	// slots. Default DefaultTaskDuration (1s); at most 7 days, the longest
	// concurrency lease. It matters only for concurrency rules.
	TaskDuration time.Duration
	// Ahead, if set, says what already stands before the campaign under
	// rule for key (each key a campaign task takes, "" for a global rule):
	// the units used now (a window's count, the units a GCRA rule's
	// schedule holds, a concurrency rule's held slots) and the tasks
	// already waiting (taskrl.Waiting). The simulation charges them at
	// Start, before the campaign's first task: the used units and the
	// waiting tasks of a rate rule, one unit each, in that order; the held
	// slots of a concurrency rule, each for TaskDuration (its waiting tasks
	// are not modelled). Nil: every limit idle.
	Ahead func(rule, key string) (used, waiting int, err error)
}

// AheadState is what Options.Ahead reported for one rule and key, when
// not nothing.
type AheadState struct {
	Rule, Key     string
	Used, Waiting int
}

// Campaign is what to simulate: N tasks of one type on one queue.
type Campaign struct {
	// Type and Queue bind the policy's rules (policy.Policy.Bind).
	Type, Queue string
	// N is the number of tasks.
	N int
	// Payload returns the JSON payload of task i, 0 <= i < N, from which
	// the rules' keys are rendered.
	Payload func(i int) []byte
}

// Report is the result of a simulation.
type Report struct {
	// Tasks, Type and Queue describe the campaign.
	Tasks       int
	Type, Queue string
	// Start is when the simulation started; TaskDuration the task length
	// it assumed.
	Start        time.Time
	TaskDuration time.Duration
	// Rules are the rules that apply to the campaign's tasks, in policy
	// order; empty when none does.
	Rules []RuleReport
	// Binding names the rule that dominates the campaign's duration: the
	// one that alone would hold it longest (RuleReport.Alone); "" when no
	// rule delays any task.
	Binding string
	// Duration is from Start until the last task starts; End is Start
	// plus Duration. The last task then runs for its own duration.
	Duration time.Duration
	End      time.Time
	// Ahead lists what already stood before the campaign (Options.Ahead),
	// by rule and key; empty with every limit idle.
	Ahead []AheadState
	// Unmatched counts the tasks no rule applies to: they run at once.
	Unmatched int
	// Refused counts the tasks the worker would archive because no key
	// can be rendered from their payload (a missing field without a
	// default key, a null or object field, a payload that is not a JSON
	// object); FirstRefused is the index of the first and RefusedReason
	// its error, naming the rule and the field. Refused tasks take no
	// quota.
	Refused       int
	FirstRefused  int
	RefusedReason string
	// Timeline is when the tasks start (Report.Plot draws it).
	Timeline Timeline
}

// Timeline counts the tasks that start in each interval of Bin from
// Start: Counts[i] tasks start in [i×Bin, (i+1)×Bin); the last interval
// holds the last task. Bin is a round length (1s, 5s, 10s, 30s, 1m, 5m,
// 10m, 30m, 1h, 2h, 6h, 12h, a day or days), the shortest that keeps
// Counts to at most MaxBins intervals. Tasks no rule matches count at
// Start; refused tasks never start.
type Timeline struct {
	Bin    time.Duration
	Counts []int
}

// MaxBins bounds len(Timeline.Counts).
const MaxBins = 120

// RuleReport describes one rule in a Report.
type RuleReport struct {
	// Name and Limit are the rule's name and limit, e.g. "190 per 10s
	// (fixed window)".
	Name, Limit string
	// Key is the rule's key template; "" for one global key.
	Key string
	// Keys is how many distinct keys the campaign's tasks used.
	Keys int
	// Alone is how long the campaign would take under this rule alone
	// (until its last task starts).
	Alone time.Duration
	// Rate is the rule's limit as a sustained rate per second for one
	// key: a GCRA rule's rate, an adaptive rule's starting rate (the
	// simulation meets no 429), a fixed or sliding window's limit over
	// its length (Window), a concurrency rule's slots (less those
	// reserved for critical work) over the task duration; 0 for a
	// calendar window, whose windows differ in length.
	Rate float64
	// Window is a fixed or sliding window's length; 0 for other rules.
	Window time.Duration
	// Resets are the instants after Start and up to End at which a fixed
	// or calendar window starts afresh, at most MaxResets of them (the
	// first ones); nil for other rules.
	Resets []time.Time
}

// MaxResets bounds RuleReport.Resets.
const MaxResets = 100

// Run simulates campaign c under policy p (see the package documentation).
// The binding rule it reports is the one that alone would hold the campaign
// longest; each rule is simulated alone for that, besides all together.
// It fails on an invalid campaign or option; a task whose keys cannot be
// rendered is counted as refused, not an error.
func Run(p *policy.Policy, c Campaign, opt Options) (*Report, error) {
	if c.N < 0 {
		return nil, fmt.Errorf("estimate: %d tasks", c.N)
	}
	if c.N > 0 && c.Payload == nil {
		return nil, errors.New("estimate: no payloads")
	}
	if opt.TaskDuration == 0 {
		opt.TaskDuration = DefaultTaskDuration
	}
	if opt.TaskDuration < 0 || opt.TaskDuration > maxLease {
		return nil, fmt.Errorf("estimate: task duration must be positive and at most %s (a concurrency lease), got %s", maxLease, opt.TaskDuration)
	}
	if opt.Start.IsZero() {
		opt.Start = time.Now()
	}
	if us := opt.Start.UnixMicro(); us < 0 || us >= 1<<51 {
		return nil, fmt.Errorf("estimate: start %s is outside 1970..2041", opt.Start.Format(time.RFC3339))
	}
	rep := &Report{Tasks: c.N, Type: c.Type, Queue: c.Queue, Start: opt.Start, TaskDuration: opt.TaskDuration, End: opt.Start, FirstRefused: -1}
	b := p.Bind(c.Type, c.Queue)
	if b == nil {
		rep.Unmatched = c.N
		var h histogram
		h.add(0, c.N)
		rep.Timeline = h.timeline()
		return rep, nil
	}
	templates := map[string]string{}
	for _, r := range p.Rules() {
		templates[r.Name] = r.Key
	}
	rules := b.Rules()
	for j, r := range rules {
		rr := RuleReport{Name: r.Name, Limit: r.Limit.String(), Key: templates[r.Name]}
		rr.Rate, rr.Window = rate(r.Limit, opt.TaskDuration)
		rep.Rules = append(rep.Rules, rr)
		if c, ok := r.Limit.(quotas.Concurrency); ok && c.Adaptive {
			// What a service takes is learned from its calls alone: an
			// adaptive concurrency rule is estimated at its max.
			rules[j].Limit = quotas.Concurrency{Max: c.Max, Lease: c.Lease}
		}
	}

	// Render every task's keys (and costs, policy.Rule.Cost) once; nil
	// keys mark a refused task: a key field or a cost missing, or a cost
	// above what a rule admits at once.
	keys := make([][]string, c.N)
	costs := make([][]int, c.N)
	for i := range keys {
		rq, err := b.Request(c.Payload(i))
		if err == nil {
			err = b.CheckCosts(rq.Costs)
		}
		k := rq.Keys
		costs[i] = rq.Costs
		if err != nil {
			if rep.Refused == 0 {
				rep.FirstRefused, rep.RefusedReason = i, err.Error()
			}
			rep.Refused++
			continue
		}
		if k == nil {
			k = make([]string, len(rules))
		}
		keys[i] = k
	}
	for j := range rules {
		seen := map[string]struct{}{}
		for _, k := range keys {
			if k != nil {
				seen[k[j]] = struct{}{}
			}
		}
		rep.Rules[j].Keys = len(seen)
	}

	s := simulation{rules: rules, keys: keys, costs: costs, start: opt.Start, taskDur: opt.TaskDuration}
	if opt.Ahead != nil {
		s.ahead = make([]map[string][2]int, len(rules))
		for j, r := range rules {
			seen := map[string]bool{}
			for _, k := range keys {
				if k == nil || seen[k[j]] {
					continue
				}
				seen[k[j]] = true
				used, waiting, err := opt.Ahead(r.Name, k[j])
				if err != nil {
					return nil, fmt.Errorf("estimate: rule %q key %q: %w", r.Name, k[j], err)
				}
				if used+waiting <= 0 {
					continue
				}
				if s.ahead[j] == nil {
					s.ahead[j] = map[string][2]int{}
				}
				s.ahead[j][k[j]] = [2]int{max(used, 0), max(waiting, 0)}
				rep.Ahead = append(rep.Ahead, AheadState{Rule: r.Name, Key: k[j], Used: used, Waiting: waiting})
			}
		}
	}
	all := make([]int, len(rules))
	for j := range all {
		all[j] = j
	}
	var h histogram
	timed := s
	timed.started = h.add
	d, err := timed.run(all)
	if err != nil {
		return nil, err
	}
	rep.Duration = d
	rep.End = opt.Start.Add(d)
	rep.Timeline = h.timeline()
	for j, r := range rules {
		rep.Rules[j].Resets = resets(r.Limit, rep.Start, rep.End)
	}
	var longest time.Duration
	for j := range rules {
		if rep.Rules[j].Alone, err = s.run([]int{j}); err != nil {
			return nil, err
		}
		if rep.Rules[j].Alone > longest {
			longest, rep.Binding = rep.Rules[j].Alone, rules[j].Name
		}
	}
	return rep, nil
}

// simulation holds what every run of one campaign shares.
type simulation struct {
	rules   []quotas.Rule
	keys    [][]string // per task, per rule; nil for a refused task
	costs   [][]int    // per task, per rule; nil when no rule has a cost
	start   time.Time
	taskDur time.Duration
	ahead   []map[string][2]int // per rule, per key: used, waiting (Options.Ahead); nil: idle
	// started, if set, is told of each task that starts, by its offset
	// from start.
	started func(at time.Duration, n int)
}

// forever is the horizon of the simulation's reservations: a task is booked
// however far ahead its moment lies.
const forever = time.Duration(math.MaxInt64)

// maxLease is the longest concurrency lease: the simulation's slots are
// released by their tasks, never reclaimed.
const maxLease = 7 * 24 * time.Hour

// event is a step of the simulation at time at: a task reserves its rate
// rules again, or takes its concurrency slots, or gives back the slots it
// holds (leases).
type event struct {
	at     time.Time
	kind   int // release, reserve, start: in this order at the same time
	task   int
	leases []quotas.Lease
}

const (
	release = iota
	reserve
	start
)

// events is a min-heap of events by time, kind and task.
type events []event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	a, b := h[i], h[j]
	if !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.task < b.task
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// run simulates the campaign under the rules listed in use, from idle, on a
// quotas.Model, and returns how long after the start the last task starts.
func (s simulation) run(use []int) (time.Duration, error) {
	var rateRules, slotRules []quotas.Rule
	var rateIdx, slotIdx []int
	for _, j := range use {
		r := s.rules[j]
		r.Fair = false
		if c, ok := concurrency(r.Limit); ok {
			c.Lease = maxLease
			r.Limit = c
			slotRules, slotIdx = append(slotRules, r), append(slotIdx, j)
		} else {
			rateRules, rateIdx = append(rateRules, r), append(rateIdx, j)
		}
	}
	rates, err := newSet(rateRules)
	if err != nil {
		return 0, err
	}
	slots, err := newSet(slotRules)
	if err != nil {
		return 0, err
	}
	pick := func(k []string, idx []int) []string {
		out := make([]string, len(idx))
		for u, j := range idx {
			out[u] = k[j]
		}
		return out
	}
	m := quotas.NewModel()
	last := s.start
	var h events
	// waiting holds, per concurrency rule and key, the tasks waiting for a
	// slot, by task; woken, the slot a woken task was woken for.
	waiting := map[string][]int{}
	woken := map[int]string{}
	wake := func(slot string, at time.Time) {
		if w := waiting[slot]; len(w) > 0 {
			waiting[slot], woken[w[0]] = w[1:], slot
			heap.Push(&h, event{at: at, kind: start, task: w[0]})
		}
	}
	// booked moves task i on once its rate rules booked it for at.
	booked := func(i int, at time.Time) {
		if slots == nil {
			last = maxTime(last, at)
			s.start1(at)
			return
		}
		heap.Push(&h, event{at: at, kind: start, task: i})
	}
	// book reserves task i's rate rules at time now: the earliest moment
	// they all admit it; a reservation that gives up (the rules' moments
	// lie too far apart to agree in one call) is made again at the moment
	// found, as the worker reschedules the task.
	book := func(i int, now time.Time) error {
		if rates == nil {
			booked(i, now)
			return nil
		}
		req := quotas.Request{Keys: pick(s.keys[i], rateIdx)}
		if s.costs[i] != nil {
			req.Costs = make([]int, len(rateIdx))
			for u, j := range rateIdx {
				req.Costs[u] = s.costs[i][j]
			}
		}
		d, err := m.ReserveAt(now, rates, req, forever)
		if err != nil {
			return fmt.Errorf("estimate: task %d: %w", i, err)
		}
		// What the middleware does with the decision (admission.Plan):
		// run at the turn, held or booked alike here, or decide again.
		a := admission.Plan(admission.Limits{}, admission.Step{Stage: admission.Rates, Now: now, Left: admission.NoDeadline,
			Decision: admission.Decision{Allowed: d.Allowed, Delay: d.Delay, RetryAfter: d.RetryAfter, Now: d.Now, Rule: d.Rule}})
		switch {
		case a.Verb == admission.Run:
			booked(i, now.Add(a.Wait))
		case a.Verb == admission.Refuse:
			return fmt.Errorf("estimate: task %d: %s", i, a.Reason)
		case !a.Booked.IsZero():
			booked(i, a.Booked)
		default:
			heap.Push(&h, event{at: now.Add(a.Wait), kind: reserve, task: i})
		}
		return nil
	}
	if err := s.charge(m, &h, rateRules, rateIdx, slotRules, slotIdx); err != nil {
		return 0, err
	}
	for i, k := range s.keys {
		if k != nil {
			if err := book(i, s.start); err != nil {
				return 0, err
			}
		}
	}
	// Then, in time order, the tasks take their slots when their moment
	// comes (or wait for one to be released), as the worker does.
	for h.Len() > 0 {
		e := heap.Pop(&h).(event)
		switch e.kind {
		case reserve:
			if err := book(e.task, e.at); err != nil {
				return 0, err
			}
		case release:
			for _, ls := range e.leases {
				if _, err := m.ReleaseAt(e.at, ls); err != nil {
					return 0, fmt.Errorf("estimate: task %d: %w", e.task, err)
				}
				wake(ls.Rule+"\x00"+ls.Key, e.at)
			}
		case start:
			keys := pick(s.keys[e.task], slotIdx)
			d, err := m.AllowAt(e.at, slots, quotas.Request{Keys: keys, Holder: strconv.Itoa(e.task)})
			if err != nil {
				return 0, fmt.Errorf("estimate: task %d: %w", e.task, err)
			}
			from, ok := woken[e.task]
			delete(woken, e.task)
			if d.Allowed {
				last = maxTime(last, e.at)
				s.start1(e.at)
				heap.Push(&h, event{at: e.at.Add(s.taskDur), kind: release, task: e.task, leases: d.Leases})
				continue
			}
			// Wait for a slot of the rule that denied; a slot released
			// for this task goes to the next one waiting.
			u := slices.IndexFunc(slotRules, func(r quotas.Rule) bool { return r.Name == d.Rule })
			slot := d.Rule + "\x00" + keys[u]
			w := waiting[slot]
			at, _ := slices.BinarySearch(w, e.task)
			waiting[slot] = slices.Insert(w, at, e.task)
			if ok && from != slot {
				wake(from, e.at)
			}
		}
	}
	return last.Sub(s.start), nil
}

// start1 tells s.started, if set, that a task starts at at.
func (s simulation) start1(at time.Time) {
	if s.started != nil {
		s.started(at.Sub(s.start), 1)
	}
}

// charge charges on m at s.start what stands before the campaign
// (s.ahead) under each rule of the run, alone: a rate rule's used units
// and waiting tasks, one unit each; a concurrency rule's held slots, each
// released after s.taskDur (a release event on h, task -1).
func (s simulation) charge(m *quotas.Model, h *events, rateRules []quotas.Rule, rateIdx []int, slotRules []quotas.Rule, slotIdx []int) error {
	if s.ahead == nil {
		return nil
	}
	for _, g := range []struct {
		rules []quotas.Rule
		idx   []int
		slots bool
	}{{rateRules, rateIdx, false}, {slotRules, slotIdx, true}} {
		for u, j := range g.idx {
			if len(s.ahead[j]) == 0 {
				continue
			}
			one, err := newSet(g.rules[u : u+1])
			if err != nil {
				return err
			}
			for key, a := range s.ahead[j] {
				if !g.slots {
					for range a[0] + a[1] {
						if _, err := m.ReserveAt(s.start, one, quotas.Request{Keys: []string{key}}, forever); err != nil {
							return fmt.Errorf("estimate: rule %q: %w", g.rules[u].Name, err)
						}
					}
					continue
				}
				for n := range a[0] {
					d, err := m.AllowAt(s.start, one, quotas.Request{Keys: []string{key}, Holder: "ahead:" + strconv.Itoa(n)})
					if err != nil {
						return fmt.Errorf("estimate: rule %q: %w", g.rules[u].Name, err)
					}
					if !d.Allowed {
						break // the rule's slots are all held
					}
					heap.Push(h, event{at: s.start.Add(s.taskDur), kind: release, task: -1, leases: d.Leases})
				}
			}
		}
	}
	return nil
}

// newSet returns the set of rules, nil for none.
func newSet(rules []quotas.Rule) (*quotas.Set, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	set, err := quotas.NewSet(rules...)
	if err != nil {
		return nil, fmt.Errorf("estimate: %w", err)
	}
	return set, nil
}

// concurrency returns l as a concurrency limit, if it is one.
func concurrency(l quotas.Limit) (quotas.Concurrency, bool) {
	switch v := l.(type) {
	case quotas.Concurrency:
		return v, true
	case *quotas.Concurrency:
		return *v, true
	}
	return quotas.Concurrency{}, false
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
