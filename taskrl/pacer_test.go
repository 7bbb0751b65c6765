package taskrl

import (
	"container/heap"
	"slices"
	"testing"
)

// TestPacerWaitsForTheRun: a task this process parked is claimed once due
// and only after asynq is done with the run that parked it (its done
// channel closed); tasks not due, or whose run goes on, are kept, in
// order.
func TestPacerWaitsForTheRun(t *testing.T) {
	running, over := make(chan struct{}), make(chan struct{})
	close(over)
	var s slots
	for _, o := range []own{{at: 30, id: "later", done: over}, {at: 10, id: "running", done: running}, {at: 20, id: "over", done: over}, {at: 5, id: "no-ctx"}} {
		heap.Push(&s, o)
	}
	ids := func(os []own) []string {
		var out []string
		for _, o := range os {
			out = append(out, o.id)
		}
		return out
	}
	mine, waiting := s.due(25)
	if got := ids(mine); !slices.Equal(got, []string{"no-ctx", "over"}) || !waiting {
		t.Fatalf("due(25) = %v, waiting %v; want [no-ctx over], true", got, waiting)
	}
	close(running)
	mine, waiting = s.due(25)
	if got := ids(mine); !slices.Equal(got, []string{"running"}) || waiting {
		t.Fatalf("after the run: due(25) = %v, waiting %v; want [running], false", got, waiting)
	}
	s.keep(mine)
	if mine, _ = s.due(100); !slices.Equal(ids(mine), []string{"running", "later"}) {
		t.Fatalf("kept: due(100) = %v", ids(mine))
	}
}
