// Package admission holds the timing constants of the middleware's
// admission path, so that the middleware and the simulator that imitates
// it (internal/tools/simulate) cannot drift apart.
//
// Foundation layer, imported by taskrl and internal/tools/simulate.
package admission

import "time"

const (
	// PaceLead is how long before its slot the pacer moves a booked copy
	// to pending: enough for an idle worker to pick it up (ServerConfig's
	// 50ms TaskCheckInterval) so that it waits for its slot in the worker,
	// briefly, instead of starting a varying time after it.
	PaceLead = 150 * time.Millisecond
	// LateBooking is how far past its slot a booked copy may start; a
	// later one gives its booking back and decides again.
	LateBooking = 25 * time.Millisecond
	// SlotRetry is how long after a busy concurrency slot a task that
	// cannot wait for it in the worker is tried again.
	SlotRetry = time.Second
	// AdaptiveReserve is how far ahead a task with an adaptive rule is
	// booked at most: a booking keeps the rate it was made at, so after a
	// cut the bookings beyond it are decided again (quotas.Limiter.Held);
	// the shorter the horizon, the fewer they are.
	AdaptiveReserve = time.Second
)
