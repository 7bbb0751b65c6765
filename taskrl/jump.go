package taskrl

import (
	"sync"
	"time"
)

// clockJumpMin is the least jump of the server's clock reported: less is
// a round trip's noise.
const clockJumpMin = time.Second

// jumpWatch notices when the Redis server's clock (the time a decision
// was made at, its TIME) moves against the worker's monotonic clock: a
// failover to a host whose clock differs, or a step of the server's
// clock. It compares each decision's server time with the server time
// expected from a reference, the last decision whose round trip was
// short, carried forward on the local monotonic clock. The zero value is
// ready; it is safe for concurrent use.
type jumpWatch struct {
	mu            sync.Mutex
	server, local time.Time // the reference: a server time and the local time it was seen
}

// refMaxRTT is the longest round trip of a decision that becomes the
// reference: the server's time of a slow call is known less closely.
const refMaxRTT = 250 * time.Millisecond

// see takes a decision made at server time server by a call sent at local
// time sent and answered at recv, and returns by how much the server's
// clock moved against the local one since the reference (positive:
// forward), or 0 when it did not move by clockJumpMin or more. The server
// read its time between sent and recv, so a slow or reordered answer is
// no jump.
func (w *jumpWatch) see(server, sent, recv time.Time) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var jump time.Duration
	if !w.local.IsZero() {
		lo := w.server.Add(sent.Sub(w.local))
		hi := w.server.Add(recv.Sub(w.local)).Add(refMaxRTT)
		switch {
		case server.Before(lo.Add(-clockJumpMin)):
			jump = server.Sub(lo)
		case server.After(hi.Add(clockJumpMin)):
			jump = server.Sub(hi)
		}
	}
	if jump != 0 || recv.Sub(sent) <= refMaxRTT {
		w.server, w.local = server, recv
	}
	return jump
}
