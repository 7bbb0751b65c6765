package taskrl

import (
	"context"
	_ "embed"
	"errors"
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
	"github.com/taskrl/taskrl/policy"
)

// shedFresh is how long a process's published slots count in fleet_busy.
const shedFresh = 3 * time.Second

// maxShedWindow bounds policy.Shed.Window: what the upstream errors' log keeps.
const maxShedWindow = policy.MaxShedWindow

// nextShedLevel is the level after dt at signal under s, the signal having
// been above the threshold for aboveFor (0: not above); it never passes
// classes.
func nextShedLevel(level float64, s *policy.Shed, signal float64, aboveFor, dt time.Duration, classes int) float64 {
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
	sh := shedOf(s.m.policy.Load())
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
		return policy.ShedTick
	}
	s.tick(sh, signal, now)
	return policy.ShedTick
}

// tick moves the level to now at signal.
func (s *shedder) tick(sh *policy.Shed, signal float64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dt := policy.ShedTick
	if !s.last.IsZero() {
		dt = min(max(now.Sub(s.last), 0), 2*policy.ShedTick)
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
func (s *shedder) read(sh *policy.Shed, now time.Time) (float64, error) {
	switch sh.Signal {
	case policy.ShedProbe:
		if s.m.cfg.ShedProbe == nil {
			return 0, errors.New("no Config.ShedProbe")
		}
		return min(max(s.m.cfg.ShedProbe(), 0), 1), nil
	case policy.ShedUpstreamErrors:
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
	v, err := busyScript.Run(ctx, s.m.cfg.LimitsClient, []string{keys.Busy(s.m.prefix)}, s.id, s.inflight.Load(), s.capacity.Load(), shedFresh.Milliseconds()).Int64Slice()
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

// deferFor reports whether a task of class k (see policy.Policy.ShedClass) is
// deferred now, and for how long.
func (s *shedder) deferFor(sh *policy.Shed, k int) (time.Duration, bool) {
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
// by this process and its level (see policy.Shed: class k is deferred with
// probability level−k, clipped to [0, 1]); ok is false when the policy
// has no shed section. Safe for concurrent use.
func (m *Middleware) ShedState() (signal, level float64, ok bool) {
	if shedOf(m.policy.Load()) == nil {
		return 0, 0, false
	}
	signal, level = m.shed.state()
	return signal, level, true
}

// randomID returns 16 random hex digits.
func randomID() string {
	return strconv.FormatUint(rand.Uint64(), 16)
}

// shedOf returns p's shed section, or nil.
func shedOf(p *policy.Policy) *policy.Shed {
	if sh, ok := p.Shed(); ok {
		return &sh
	}
	return nil
}

// checkShed says why p's shed section cannot run under cfg, or nil.
func checkShed(cfg *Config, p *policy.Policy) error {
	if sh := shedOf(p); sh != nil && sh.Signal == policy.ShedProbe && cfg.ShedProbe == nil {
		return errors.New("taskrl: the policy's shed signal is probe, which needs Config.ShedProbe (only a program using the library can give one)")
	}
	return nil
}
