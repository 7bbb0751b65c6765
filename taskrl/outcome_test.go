package taskrl

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestCallOutcome: what a handler's run teaches an adaptive concurrency
// rule: its latency when it succeeded or ran out of time, overload when
// the remote side throttled it, nothing for any other error.
func TestCallOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		took time.Duration
		lat  time.Duration
		over bool
	}{
		{nil, 80 * time.Millisecond, 80 * time.Millisecond, false},
		{nil, 0, time.Microsecond, false}, // an instant success is still a latency
		{Throttled(time.Second, errors.New("429")), 30 * time.Millisecond, 30 * time.Millisecond, true},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), 5 * time.Second, 5 * time.Second, false}, // a slow call
		{errors.New("400 bad request"), 3 * time.Millisecond, 0, false},
	} {
		lat, over := callOutcome(c.err, c.took)
		if lat != c.lat || over != c.over {
			t.Errorf("%v after %v: %v %v, want %v %v", c.err, c.took, lat, over, c.lat, c.over)
		}
	}
}
