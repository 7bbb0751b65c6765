package policy

import (
	"fmt"
	"slices"
	"time"
)

// ShedSignal names where the pressure of a Shed section comes from.
type ShedSignal string

// Signals of a Shed section.
const (
	// ShedFleetBusy: the share of the fleet's worker slots in use, measured
	// fleet-wide in Redis: every process with the section publishes its
	// busy and total slots (taskrl.Middleware.ServerConfig's Concurrency) twice a
	// second and reads the sum of all.
	ShedFleetBusy ShedSignal = "fleet_busy"
	// ShedUpstreamErrors: the share of tasks that ended in an error asynq
	// retries (for http:call: a 5xx or a network error or timeout) among
	// those that ended in this process over the last Shed.Window, once at
	// least 10 ended; not counted: SkipRetry errors (archived), upstream
	// throttles and cancellations.
	ShedUpstreamErrors ShedSignal = "upstream_errors"
	// ShedProbe: what taskrl.Config.ShedProbe returns, in [0, 1].
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

// ShedTick is how often a process reads its shed signal and moves its
// level; a Shed's Ramp is at least this.
const ShedTick = 500 * time.Millisecond

// MaxShedWindow bounds Shed.Window.
const MaxShedWindow = time.Hour

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
	if s.Ramp != 0 && s.Ramp < ShedTick {
		return "ramp", fmt.Sprintf("must be at least %v, got %v", ShedTick, s.Ramp)
	}
	if s.Window != 0 && (s.Window < time.Second || s.Window > MaxShedWindow) {
		return "window", fmt.Sprintf("must be between 1s and %v, got %v", MaxShedWindow, s.Window)
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
		return nil, &Error{Field: "shed." + f, Msg: msg}
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

// ShedClass returns the index of the first class of the policy's shed
// section that selects a task of taskType from queue, or -1 (never
// deferred) for none, a critical task, or a policy without the section.
func (p *Policy) ShedClass(taskType, queue string) int {
	if p == nil || p.shed == nil {
		return -1
	}
	s := p.shed
	if slices.ContainsFunc(p.critical, func(m Match) bool { return m.matches(taskType, queue) }) {
		return -1
	}
	return slices.IndexFunc(s.Classes, func(m Match) bool { return m.matches(taskType, queue) })
}
