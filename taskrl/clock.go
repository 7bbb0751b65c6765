package taskrl

import "time"

// Clock tells the time. The middleware reads the time only through
// Config.Clock, so that tests can drive it; waits in the worker still pass
// in real time. Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// wallClock is the default Clock: time.Now.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// learn records the offset of the server's clock from the local one, from
// a decision made at server time server by a call sent at local time sent,
// and reports a jump of the server's clock (jumpWatch): logged, and a
// ClockJump event.
func (m *Middleware) learn(server, sent time.Time) {
	recv := m.cfg.Clock.Now()
	if jump := m.jumps.see(server, sent, recv); jump != 0 {
		m.cfg.Logger.Warn("taskrl: the Redis server's clock jumped against this worker's: windows, schedules and leases move by as much (docs/operations.md, failure modes)", "jump", jump)
		if m.cfg.Observer != nil {
			m.cfg.Observer.Observe(Event{Outcome: ClockJump, Wait: jump})
		}
	}
	m.skew.Learn(server, recv)
}

// serverNow estimates the server's clock from the last decision.
func (m *Middleware) serverNow() time.Time {
	return m.skew.Server(m.cfg.Clock.Now())
}
