package quotas

import (
	"context"
	"time"
)

// Decider decides rule sets: *Limiter in Redis on the server's clock, and
// *Model in memory on a clock of its own. Code written against a Decider
// (the middleware's in-process fallback, the simulator of the enqueue
// binary) runs the same on either. The methods are Limiter's; see there.
// Both implementations are safe for concurrent use.
type Decider interface {
	// Allow admits req now if every rule of s admits it, and charges every
	// rule; otherwise it charges nothing.
	Allow(ctx context.Context, s *Set, req Request) (Decision, error)
	// Reserve books the earliest moment at most horizon away at which
	// every rule of s but concurrency rules admits req.
	Reserve(ctx context.Context, s *Set, req Request, horizon time.Duration) (Decision, error)
	// Status reports every rule's state without charging anything.
	Status(ctx context.Context, s *Set, req Request) (Decision, error)
	// Refund undoes the charges of an admitted or booked Decision.
	Refund(ctx context.Context, s *Set, req Request, d Decision) error
	// Settle replaces the cost a Decision charged by the actual ones.
	Settle(ctx context.Context, s *Set, req Request, d Decision, actual []int) error
	// Held reports whether a Decision's booking is still its own.
	Held(ctx context.Context, s *Set, req Request, d Decision) (bool, error)
	// Block makes the rules of s admit nothing for req's keys until until.
	Block(ctx context.Context, s *Set, req Request, until time.Time) (Decision, error)
	// BlockCall is Block for a throttle of a call decided at decided.
	BlockCall(ctx context.Context, s *Set, req Request, until, decided time.Time) (Decision, error)
	// Renew extends a concurrency lease to its Duration from now.
	Renew(ctx context.Context, lease Lease) (bool, error)
	// Release gives a concurrency lease's slot back.
	Release(ctx context.Context, lease Lease) (bool, error)
}

var (
	_ Decider = (*Limiter)(nil)
	_ Decider = (*Model)(nil)
)
