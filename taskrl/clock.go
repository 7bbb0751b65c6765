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

// learn records the offset of the server's clock from the local one.
func (m *Middleware) learn(server time.Time) {
	m.skew.Learn(server, m.cfg.Clock.Now())
}

// serverNow estimates the server's clock from the last decision.
func (m *Middleware) serverNow() time.Time {
	return m.skew.Server(m.cfg.Clock.Now())
}
