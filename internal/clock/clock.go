// Package clock estimates a Redis server's clock from the local one, for
// quotas and taskrl: decisions are made on the server's TIME, and the
// callers place calendar ticks, booked slots and upstream blocks on the
// same clock.
//
// Foundation layer, imported by quotas and taskrl.
package clock

import (
	"sync/atomic"
	"time"
)

// Skew is the offset of a server's clock from a local clock, learnt from
// the server's replies. The zero value (no offset) is ready to use; a Skew
// is safe for concurrent use.
type Skew struct{ us atomic.Int64 }

// Learn records that the server's clock read server when the local one
// read local.
func (s *Skew) Learn(server, local time.Time) { s.us.Store(server.Sub(local).Microseconds()) }

// Server returns the server's time when the local clock reads local.
func (s *Skew) Server(local time.Time) time.Time {
	return local.Add(time.Duration(s.us.Load()) * time.Microsecond)
}
