// Package estimate predicts how long a campaign takes under a policy's
// limits, without Redis: the enqueue binary's --dry-run.
//
// The simulation starts with every limit idle at Options.Start and takes the
// tasks in enqueue order. Each task starts at the earliest instant, not
// before Start, at which every rule that applies to it admits it, and is
// charged to every rule at that instant — what the worker middleware's
// reservations do when a backlog is dequeued at once (quotas.Limiter.Reserve:
// raise the candidate time to each rule's earliest admissible time until all
// agree). Rules are modelled after the quotas scripts:
//
//   - GCRA: a calendar of virtual time per key, placed as the script does:
//     a task held back by another rule takes its slot there and leaves the
//     capacity before it to the tasks after it;
//   - fixed windows: Limit per window aligned to the Unix epoch;
//   - calendar windows: Limit per window between two ticks of the rule's cron
//     spec in its zone (package internal/calendar);
//   - sliding windows: at most Limit starts in any interval of length Every
//     (a booked start counts against every later one, as in the script);
//   - concurrency: at most Max-Reserved tasks of a key run at once, each for
//     Options.TaskDuration.
//
// Not modelled: the worker's own concurrency, the tasks' failures, retries
// and upstream 429s, and fair sharing (a fair rule is taken as a plain one:
// the campaign's tasks are booked in enqueue order); the estimate is the
// time the limits alone impose.
package estimate

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/calendar"
	"github.com/taskrl/taskrl/quotas"
	"github.com/taskrl/taskrl/taskrl"
)

// DefaultTaskDuration is Options.TaskDuration when it is zero.
const DefaultTaskDuration = time.Second

// maxRounds bounds the search for one task's start; the rules' earliest
// times only move forward, so it is reached only by a bug.
const maxRounds = 100000

// Options tune a simulation.
type Options struct {
	// Start is when the campaign is enqueued, with every limit idle.
	// Default time.Now().
	Start time.Time
	// TaskDuration is how long each task runs, holding its concurrency
	// slots. Default DefaultTaskDuration (1s); it matters only for
	// concurrency rules.
	TaskDuration time.Duration
}

// Campaign is what to simulate: N tasks of one type on one queue.
type Campaign struct {
	// Type and Queue bind the policy's rules (taskrl.Policy.Bind).
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
}

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
}

// Run simulates campaign c under policy p (see the package documentation).
// The binding rule it reports is the one that alone would hold the campaign
// longest; each rule is simulated alone for that, besides all together.
// It fails on an invalid campaign or option; a task whose keys cannot be
// rendered is counted as refused, not an error.
func Run(p *taskrl.Policy, c Campaign, opt Options) (*Report, error) {
	if c.N < 0 {
		return nil, fmt.Errorf("estimate: %d tasks", c.N)
	}
	if c.N > 0 && c.Payload == nil {
		return nil, errors.New("estimate: no payloads")
	}
	if opt.TaskDuration == 0 {
		opt.TaskDuration = DefaultTaskDuration
	}
	if opt.TaskDuration < 0 {
		return nil, fmt.Errorf("estimate: task duration must be positive, got %s", opt.TaskDuration)
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
		return rep, nil
	}
	templates := map[string]string{}
	for _, r := range p.Rules() {
		templates[r.Name] = r.Key
	}
	rules := b.Set().Rules()
	for _, r := range rules {
		rep.Rules = append(rep.Rules, RuleReport{Name: r.Name, Limit: r.Limit.String(), Key: templates[r.Name]})
	}

	// Render every task's keys once; nil marks a refused task.
	keys := make([][]string, c.N)
	for i := range keys {
		k, err := b.Keys(c.Payload(i))
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

	s := simulation{rules: rules, keys: keys, start: opt.Start.UnixMicro(), taskDur: opt.TaskDuration.Microseconds()}
	all := make([]int, len(rules))
	for j := range all {
		all[j] = j
	}
	d, err := s.run(all)
	if err != nil {
		return nil, err
	}
	rep.Duration = d
	rep.End = opt.Start.Add(d)
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
	start   int64
	taskDur int64
}

// run simulates the campaign under the rules listed in use, from idle, and
// returns how long after the start the last task starts.
func (s simulation) run(use []int) (time.Duration, error) {
	sims := make([]sim, len(use))
	for u, j := range use {
		sm, err := newSim(s.rules[j].Limit, s.start, s.taskDur)
		if err != nil {
			return 0, fmt.Errorf("estimate: rule %q: %w", s.rules[j].Name, err)
		}
		sims[u] = sm
	}
	last := s.start
	for i, k := range s.keys {
		if k == nil {
			continue
		}
		// Raise t to each rule's earliest time until all agree, as the
		// quotas script's reserve does.
		t := s.start
		for round := 0; ; round++ {
			if round == maxRounds {
				return 0, fmt.Errorf("estimate: task %d: the rules do not agree on a start after %d rounds", i, maxRounds)
			}
			nt := t
			for u, j := range use {
				e, err := sims[u].earliest(k[j], t)
				if err != nil {
					return 0, fmt.Errorf("estimate: task %d: rule %q: %w", i, s.rules[j].Name, err)
				}
				nt = max(nt, e)
			}
			if nt == t {
				break
			}
			t = nt
		}
		for u, j := range use {
			if err := sims[u].charge(k[j], t); err != nil {
				return 0, fmt.Errorf("estimate: task %d: rule %q: %w", i, s.rules[j].Name, err)
			}
		}
		last = max(last, t)
	}
	return time.Duration(last-s.start) * time.Microsecond, nil
}

// sim is one rule's simulated state. Times are Unix microseconds, never
// before the simulation's start.
type sim interface {
	// earliest returns the earliest time >= t at which the rule admits a
	// task of key.
	earliest(key string, t int64) (int64, error)
	// charge records a task of key starting at t.
	charge(key string, t int64) error
}

func newSim(l quotas.Limit, start, taskDur int64) (sim, error) {
	switch v := l.(type) {
	case *quotas.GCRA:
		return newSim(*v, start, taskDur)
	case *quotas.FixedWindow:
		return newSim(*v, start, taskDur)
	case *quotas.CalendarWindow:
		return newSim(*v, start, taskDur)
	case *quotas.SlidingWindow:
		return newSim(*v, start, taskDur)
	case *quotas.Concurrency:
		return newSim(*v, start, taskDur)
	case quotas.GCRA:
		l := gcra.Limit(v)
		if err := l.Validate(); err != nil {
			return nil, err
		}
		return &gcraSim{em: l.Interval().Microseconds(), burst: int64(l.Burst), start: start, keys: map[string]*gcraKey{}}, nil
	case quotas.FixedWindow:
		every := v.Every.Microseconds()
		if every < 1 {
			return nil, fmt.Errorf("fixed window of %s", v.Every)
		}
		return newWindowSim(v.Limit, func(t int64) (int64, int64) {
			s := t - t%every
			return s, s + every
		}), nil
	case quotas.CalendarWindow:
		cal, err := calendar.Parse(v.Cron, v.TZ)
		if err != nil {
			return nil, err
		}
		return newWindowSim(v.Limit, func(t int64) (int64, int64) {
			s, e := cal.Window(time.UnixMicro(t))
			return s.UnixMicro(), e.UnixMicro()
		}), nil
	case quotas.SlidingWindow:
		return &slidingSim{limit: v.Limit, every: v.Every.Microseconds(), log: map[string][]int64{}}, nil
	case quotas.Concurrency:
		return &concSim{slots: v.Max - v.Reserved, dur: taskDur, starts: map[string][]int64{}}, nil
	}
	return nil, fmt.Errorf("unknown limit %T", l)
}

// gcraSim keeps a calendar of virtual time per key, placed as the quotas
// script places GCRA charges (internal/script/lua/booked.lua): a task
// starting at t occupies a free interval [x, x+T) with t <= x and
// x+T <= t + Burst*T; the calendar is its TAT, the end of what is occupied
// without a gap from the start, and the bookings beyond it, in order. Every
// decision of the simulation is made at its start, as for a backlog
// dequeued at once.
type gcraSim struct {
	em, burst, start int64
	keys             map[string]*gcraKey
}

type gcraKey struct {
	tat   int64
	books [][2]int64 // [x, end), by end
}

// fit returns the earliest time >= t at which a task of key fits, where
// it would start in virtual time, and whether that extends the TAT.
func (g *gcraSim) fit(k *gcraKey, t int64) (a, x int64, front bool) {
	em := g.em
	g1, first := max(k.tat, g.start), true
	try := func(g2 int64, bounded bool) bool {
		a = max(t, g1+em-g.burst*em)
		x = g1
		if a > g1 {
			x = a
			if g.burst > 1 {
				x = (a + em - 1) / em * em
			}
		}
		if bounded && x+em > g2 {
			return false
		}
		front = first && x-g1 < em
		return true
	}
	from := max(t, g1)
	i := sort.Search(len(k.books), func(i int) bool { return k.books[i][1] >= from })
	for _, b := range k.books[i:] {
		if b[0] > g1 {
			if try(b[0], true) {
				return a, x, front
			}
			first = false
		}
		g1 = max(g1, b[1])
	}
	try(0, false)
	return a, x, front
}

func (g *gcraSim) key(key string) *gcraKey {
	k := g.keys[key]
	if k == nil {
		k = &gcraKey{}
		g.keys[key] = k
	}
	return k
}

func (g *gcraSim) earliest(key string, t int64) (int64, error) {
	a, _, _ := g.fit(g.key(key), t)
	return a, nil
}

func (g *gcraSim) charge(key string, t int64) error {
	k := g.key(key)
	a, x, front := g.fit(k, t)
	if a != t {
		return fmt.Errorf("internal error: not admitted at its earliest time (fits at %d, not %d)", a, t)
	}
	if front {
		k.tat = x + g.em
		return nil
	}
	end := x + g.em
	i := sort.Search(len(k.books), func(i int) bool { return k.books[i][1] > end })
	k.books = append(k.books, [2]int64{})
	copy(k.books[i+1:], k.books[i:])
	k.books[i] = [2]int64{x, end}
	return nil
}

// windowSim counts tasks per window (fixed or calendar). Windows only fill
// up, so full windows point to a later candidate, compressed as they are
// followed: finding the first window with room costs nearly O(1).
type windowSim struct {
	limit  int
	window func(t int64) (start, end int64)
	keys   map[string]*windowKey
}

type windowKey struct {
	count map[int64]int
	jump  map[int64]int64 // full window start -> a later window start
}

func newWindowSim(limit int, window func(int64) (int64, int64)) *windowSim {
	return &windowSim{limit: limit, window: window, keys: map[string]*windowKey{}}
}

func (w *windowSim) earliest(key string, t int64) (int64, error) {
	k := w.keys[key]
	if k == nil {
		return t, nil
	}
	ws, _ := w.window(t)
	cur := ws
	var path []int64
	for k.count[cur] >= w.limit {
		path = append(path, cur)
		if j, ok := k.jump[cur]; ok {
			cur = j
		} else {
			_, cur = w.window(cur)
		}
	}
	for _, p := range path {
		k.jump[p] = cur
	}
	if cur == ws {
		return t, nil
	}
	return cur, nil
}

func (w *windowSim) charge(key string, t int64) error {
	k := w.keys[key]
	if k == nil {
		k = &windowKey{count: map[int64]int{}, jump: map[int64]int64{}}
		w.keys[key] = k
	}
	ws, _ := w.window(t)
	if k.count[ws] >= w.limit {
		return errors.New("internal error: charged a full window")
	}
	k.count[ws]++
	return nil
}

// slidingSim keeps each key's starts sorted, as the sliding-window script's
// log: a task at t is admitted when the starts after t-every number fewer
// than the limit, else when enough of the oldest have left the window.
type slidingSim struct {
	limit int
	every int64
	log   map[string][]int64
}

func (s *slidingSim) earliest(key string, t int64) (int64, error) {
	l := s.log[key]
	newer := len(l) - sort.Search(len(l), func(i int) bool { return l[i] > t-s.every })
	if newer < s.limit {
		return t, nil
	}
	return max(t, l[len(l)-s.limit]+s.every), nil
}

func (s *slidingSim) charge(key string, t int64) error {
	s.log[key] = insertSorted(s.log[key], t)
	return nil
}

// concSim keeps each key's task starts sorted: a task running [t, t+dur)
// may start when fewer than slots tasks of its key overlap that interval.
type concSim struct {
	slots  int
	dur    int64
	starts map[string][]int64
}

func (c *concSim) earliest(key string, t int64) (int64, error) {
	l := c.starts[key]
	for {
		lo := sort.Search(len(l), func(i int) bool { return l[i] > t-c.dur })
		hi := sort.Search(len(l), func(i int) bool { return l[i] >= t+c.dur })
		if hi-lo < c.slots {
			return t, nil
		}
		t = l[lo] + c.dur
	}
}

func (c *concSim) charge(key string, t int64) error {
	c.starts[key] = insertSorted(c.starts[key], t)
	return nil
}

// insertSorted inserts t after every element <= t; appending is the common
// case.
func insertSorted(l []int64, t int64) []int64 {
	if n := len(l); n == 0 || l[n-1] <= t {
		return append(l, t)
	}
	i := sort.Search(len(l), func(i int) bool { return l[i] > t })
	l = append(l, 0)
	copy(l[i+1:], l[i:])
	l[i] = t
	return l
}
