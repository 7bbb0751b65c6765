package taskrl

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
)

// ShedSignal names where the pressure of a Shed section comes from.
type ShedSignal string

// Signals of a Shed section.
const (
	// ShedFleetBusy: the share of the fleet's worker slots in use, measured
	// fleet-wide in Redis: every process with the section publishes its
	// busy and total slots (Middleware.ServerConfig's Concurrency) twice a
	// second and reads the sum of all.
	ShedFleetBusy ShedSignal = "fleet_busy"
	// ShedUpstreamErrors: the share of tasks that ended in an error asynq
	// retries (for http:call: a 5xx or a network error or timeout) among
	// those that ended in this process over the last Shed.Window, once at
	// least 10 ended; not counted: SkipRetry errors (archived), upstream
	// throttles and cancellations.
	ShedUpstreamErrors ShedSignal = "upstream_errors"
	// ShedProbe: what Config.ShedProbe returns, in [0, 1].
	ShedProbe ShedSignal = "probe"
)

// Shed defers less important tasks while the fleet is under pressure, as a
// load shedder does, except that nothing is thrown away: a deferred task is
// rescheduled (never archived, never failed, its retries untouched) and
// decides again when it comes back. The policy file's shed section.
//
// Every half second each process reads its Signal. Once it has stayed
// above Above for Grace, a level rises from 0: at the threshold by
// 1/(2·Ramp) a second, at a signal of 1 by 1/Ramp; below the threshold it
// falls by 1/Ramp a second, down to 0. Classes[k] (least important first)
// is deferred with probability level−k, clipped to [0, 1]: the first class
// goes from none deferred to all within Ramp at full pressure, then the
// next, and so on; recovery runs the same way back. Tasks that no class
// matches, and critical tasks (Policy.WithCritical), are never deferred,
// nor tasks holding a booked slot. A deferred task comes back after a
// random Ramp/2 to 3·Ramp/2.
type Shed struct {
	// Signal is where the pressure comes from. Default ShedFleetBusy.
	Signal ShedSignal
	// Above is the signal above which tasks start to be deferred, in
	// (0, 1). Required.
	Above float64
	// Classes are matchers like a rule's match, least important first.
	// Required.
	Classes []Match
	// Grace is how long the signal must stay above Above before anything
	// is deferred. Default 2s.
	Grace time.Duration
	// Ramp is how long a class takes to go from none deferred to all at
	// full pressure. Default 5s.
	Ramp time.Duration
	// Window is the span of ShedUpstreamErrors. Default 10s; from 1s to
	// 1h.
	Window time.Duration
}

// shedTick is how often a process reads its signal and moves its level.
const shedTick = 500 * time.Millisecond

// maxShedWindow bounds Shed.Window.
const maxShedWindow = time.Hour

// shedFresh is how long a process's published slots count in fleet_busy.
const shedFresh = 3 * time.Second

// withDefaults returns s with its zero fields at their defaults.
func (s Shed) withDefaults() Shed {
	if s.Signal == "" {
		s.Signal = ShedFleetBusy
	}
	if s.Grace == 0 {
		s.Grace = 2 * time.Second
	}
	if s.Ramp == 0 {
		s.Ramp = 5 * time.Second
	}
	if s.Window == 0 {
		s.Window = 10 * time.Second
	}
	return s
}

// check says what is wrong with s, naming the field as the policy file
// does, or returns "".
func (s Shed) check() (field, msg string) {
	switch s.Signal {
	case "", ShedFleetBusy, ShedUpstreamErrors, ShedProbe:
	default:
		return "signal", fmt.Sprintf("must be fleet_busy, upstream_errors or probe, got %q", s.Signal)
	}
	if !(s.Above > 0 && s.Above < 1) {
		return "above", fmt.Sprintf("must be a share between 0 and 1 (exclusive), such as 0.8, got %v", s.Above)
	}
	if len(s.Classes) == 0 {
		return "classes", "needs at least one class, least important first, such as - {queue: bulk}"
	}
	for i, m := range s.Classes {
		if f, msg := checkMatch(m); msg != "" {
			return fmt.Sprintf("classes[%d]", i+1) + trimMatch(f), msg
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"grace", s.Grace}, {"ramp", s.Ramp}, {"window", s.Window}} {
		if d.v < 0 || d.v > 24*time.Hour {
			return d.name, fmt.Sprintf("must be between 0 and 24h, got %v", d.v)
		}
	}
	if s.Ramp != 0 && s.Ramp < shedTick {
		return "ramp", fmt.Sprintf("must be at least %v, got %v", shedTick, s.Ramp)
	}
	if s.Window != 0 && (s.Window < time.Second || s.Window > maxShedWindow) {
		return "window", fmt.Sprintf("must be between 1s and %v, got %v", maxShedWindow, s.Window)
	}
	return "", ""
}

// trimMatch turns a match field ("match.type") into a class's (".type").
func trimMatch(f string) string {
	if f == "match" {
		return ""
	}
	return f[len("match"):]
}

// WithShed returns a copy of p that defers less important tasks under
// pressure (the policy file's shed section; see Shed). The error names
// the field (shed.above, shed.classes[1].type, ...) and what is wrong. A
// policy has no shed section by default.
func (p *Policy) WithShed(s Shed) (*Policy, error) {
	if f, msg := s.check(); msg != "" {
		return nil, &PolicyError{Field: "shed." + f, Msg: msg}
	}
	q := p.with()
	s = s.withDefaults()
	s.Classes = slices.Clone(s.Classes)
	q.shed = &s
	return q, nil
}

// Shed returns the policy's shed section with its defaults filled in, and
// whether it has one.
func (p *Policy) Shed() (Shed, bool) {
	if p == nil || p.shed == nil {
		return Shed{}, false
	}
	s := *p.shed
	s.Classes = slices.Clone(s.Classes)
	return s, true
}

// shedClass returns the index of the first class of s that selects a task
// of taskType from queue, or -1 (never deferred) for none or a critical
// task of p.
func (p *Policy) shedClass(s *Shed, taskType, queue string) int {
	if slices.ContainsFunc(p.critical, func(m Match) bool { return m.matches(taskType, queue) }) {
		return -1
	}
	return slices.IndexFunc(s.Classes, func(m Match) bool { return m.matches(taskType, queue) })
}

// nextShedLevel is the level after dt at signal under s, the signal having
// been above the threshold for aboveFor (0: not above); it never passes
// classes.
func nextShedLevel(level float64, s *Shed, signal float64, aboveFor, dt time.Duration, classes int) float64 {
	step := dt.Seconds() / s.Ramp.Seconds()
	switch {
	case signal <= s.Above:
		level -= step
	case aboveFor >= s.Grace:
		pressure := (min(signal, 1) - s.Above) / (1 - s.Above)
		level += step * (1 + pressure) / 2
	}
	return min(max(level, 0), float64(classes))
}

// shedShare is the probability that a task of class k is deferred at level.
func shedShare(level float64, k int) float64 {
	return min(max(level-float64(k), 0), 1)
}

//go:embed busy.lua
var busyLua string

var busyScript = script.New(busyLua, "gcra")

// shedder keeps a process's shed level. Safe for concurrent use.
type shedder struct {
	m        *Middleware
	id       string        // this process's field in the fleet's busy hash
	inflight atomic.Int64  // tasks in the middleware's Handler now
	capacity atomic.Int64  // the asynq server's Concurrency (ServerConfig)
	current  atomic.Uint64 // level's bits, read without the lock per task
	loop     *loop

	mu         sync.Mutex
	signal     float64
	level      float64
	aboveSince time.Time // zero: not above the threshold
	last       time.Time // of the last tick
	ends       []ending  // tasks ended, by second, for upstream_errors
}

// ending counts the tasks that ended in one second, and how many failed.
type ending struct {
	sec           int64
	total, failed int
}

func newShedder(m *Middleware) *shedder {
	s := &shedder{m: m, id: randomID()}
	s.loop = newLoop(s.pass)
	return s
}

// pass is one tick of the shed loop: read the signal, move the level.
func (s *shedder) pass() time.Duration {
	p := s.m.policy.Load()
	sh := p.shed
	if sh == nil {
		s.mu.Lock()
		s.level, s.signal, s.aboveSince, s.last = 0, 0, time.Time{}, time.Time{}
		s.current.Store(0)
		s.mu.Unlock()
		return 0 // until a policy with a shed section pokes the loop
	}
	now := s.m.cfg.Clock.Now()
	signal, err := s.read(sh, now)
	if err != nil {
		s.m.cfg.Logger.Debug("taskrl: shed: reading the signal failed; keeping the level", "signal", string(sh.Signal), "err", err)
		return shedTick
	}
	s.tick(sh, signal, now)
	return shedTick
}

// tick moves the level to now at signal.
func (s *shedder) tick(sh *Shed, signal float64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dt := shedTick
	if !s.last.IsZero() {
		dt = min(max(now.Sub(s.last), 0), 2*shedTick)
	}
	s.last, s.signal = now, signal
	var aboveFor time.Duration
	if signal > sh.Above {
		if s.aboveSince.IsZero() {
			s.aboveSince = now
		}
		aboveFor = now.Sub(s.aboveSince)
	} else {
		s.aboveSince = time.Time{}
	}
	before := s.level
	s.level = nextShedLevel(s.level, sh, signal, aboveFor, dt, len(sh.Classes))
	s.current.Store(math.Float64bits(s.level))
	if (before == 0) != (s.level == 0) {
		s.m.cfg.Logger.Info("taskrl: shed: "+map[bool]string{true: "deferring less important tasks", false: "no longer deferring tasks"}[s.level > 0], "signal", string(sh.Signal), "value", signal, "above", sh.Above)
	}
}

// read returns the signal's value now.
func (s *shedder) read(sh *Shed, now time.Time) (float64, error) {
	switch sh.Signal {
	case ShedProbe:
		if s.m.cfg.ShedProbe == nil {
			return 0, errors.New("no Config.ShedProbe")
		}
		return min(max(s.m.cfg.ShedProbe(), 0), 1), nil
	case ShedUpstreamErrors:
		s.mu.Lock()
		defer s.mu.Unlock()
		from := now.Add(-sh.Window).Unix()
		total, failed := 0, 0
		for _, e := range s.ends {
			if e.sec > from {
				total, failed = total+e.total, failed+e.failed
			}
		}
		if total < 10 {
			return 0, nil
		}
		return float64(failed) / float64(total), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := busyScript.Run(ctx, s.m.cfg.Client, []string{keys.Busy(s.m.prefix)}, s.id, s.inflight.Load(), s.capacity.Load(), shedFresh.Milliseconds()).Int64Slice()
	if err != nil {
		return 0, err
	}
	if len(v) != 2 || v[1] <= 0 {
		return 0, nil
	}
	return float64(v[0]) / float64(v[1]), nil
}

// ended records how a task that ran in this process ended, for
// upstream_errors.
func (s *shedder) ended(err error, now time.Time) {
	failed := err != nil && !errors.Is(err, asynq.SkipRetry) && !errors.As(err, new(*ThrottledError)) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	sec := now.Unix()
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.ends); n == 0 || s.ends[n-1].sec != sec {
		// Seconds older than the longest window are dropped.
		s.ends = append(s.ends, ending{sec: sec})
		if drop := slices.IndexFunc(s.ends, func(e ending) bool { return e.sec > sec-int64(maxShedWindow/time.Second) }); drop > 0 {
			s.ends = slices.Delete(s.ends, 0, drop)
		}
	}
	e := &s.ends[len(s.ends)-1]
	e.total++
	if failed {
		e.failed++
	}
}

// deferring reports whether any task may be deferred now (level > 0).
func (s *shedder) deferring() bool { return s.current.Load() != 0 }

// deferFor reports whether a task of class k (see Policy.shedClass) is
// deferred now, and for how long.
func (s *shedder) deferFor(sh *Shed, k int) (time.Duration, bool) {
	if k < 0 {
		return 0, false
	}
	share := shedShare(math.Float64frombits(s.current.Load()), k)
	if share <= 0 || rand.Float64() >= share {
		return 0, false
	}
	return sh.Ramp/2 + time.Duration(rand.Int64N(int64(sh.Ramp))), true
}

// state returns the last signal read and the level.
func (s *shedder) state() (signal, level float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.signal, s.level
}

// ShedState returns the signal of the policy's shed section as last read
// by this process and its level (see Shed: class k is deferred with
// probability level−k, clipped to [0, 1]); ok is false when the policy
// has no shed section. Safe for concurrent use.
func (m *Middleware) ShedState() (signal, level float64, ok bool) {
	if m.policy.Load().shed == nil {
		return 0, 0, false
	}
	signal, level = m.shed.state()
	return signal, level, true
}

// randomID returns 16 random hex digits.
func randomID() string {
	return strconv.FormatUint(rand.Uint64(), 16)
}

// checkShed says why p's shed section cannot run under cfg, or nil.
func checkShed(cfg *Config, p *Policy) error {
	if p.shed != nil && p.shed.Signal == ShedProbe && cfg.ShedProbe == nil {
		return errors.New("taskrl: the policy's shed signal is probe, which needs Config.ShedProbe (only a program using the library can give one)")
	}
	return nil
}
