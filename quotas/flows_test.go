package quotas

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestFlows: Flows reports a fair concurrency rule's flows with the slots
// each holds and those waiting with their weight, a fair GCRA rule's flows
// with bookings ahead and their weight, and nothing for a rule that is not
// fair; flows whose wait ended or whose bookings passed are gone; at a
// rule with priorities, each level of a flow on its own.
func TestFlows(t *testing.T) {
	cl := newClocked(t, redistest.Client(t), redistest.Prefix(t), time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	ctx := context.Background()
	slots := mustSet(Rule{Name: "slots", Fair: true, Limit: Concurrency{Max: 3, Lease: time.Minute}}, Rule{Name: "cap", Limit: Concurrency{Max: 100, Lease: time.Minute}})
	take := func(flow string, weight int, want bool) {
		t.Helper()
		d, err := cl.Allow(ctx, slots, Request{Keys: []string{"b1", "b1"}, Fair: []string{flow, ""}, Weights: []int{weight, 0}, Holder: fmt.Sprint(flow, time.Now().UnixNano())})
		if err != nil || d.Allowed != want {
			t.Fatalf("flow %s: %+v %v, want allowed %v", flow, d, err, want)
		}
	}
	take("a b", 2, true) // a flow whose name Redis holds encoded
	take("a b", 2, true)
	take("", 1, true) // Request.Fair's "" flow
	take("c", 3, false)
	fs, err := cl.Flows(ctx, slots, Request{Keys: []string{"b1", "b1"}})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]FlowState{{{Flow: "a b", Held: 2}, {Flow: "", Held: 1}, {Flow: "c", Waiting: true, Weight: 3}}, nil}
	if !reflect.DeepEqual(fs, want) {
		t.Errorf("concurrency flows: %+v, want %+v", fs, want)
	}
	cl.now = cl.now.Add(2 * time.Second) // c's wait (1 s) ended
	if fs, err = cl.Flows(ctx, slots, Request{Keys: []string{"b1", "b1"}}); err != nil || len(fs[0]) != 2 {
		t.Errorf("after c's wait: %+v %v, want a b and \"\" only", fs, err)
	}

	rates := mustSet(Rule{Name: "peak", Fair: true, Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})})
	for _, f := range []struct {
		flow   string
		weight int
	}{{"x", 2}, {"x", 2}, {"y", 1}, {"y", 1}} {
		if d, err := cl.Reserve(ctx, rates, Request{Fair: []string{f.flow}, Weights: []int{f.weight}}, time.Minute); err != nil || !d.Allowed {
			t.Fatalf("reserve %s: %+v %v", f.flow, d, err)
		}
	}
	fs, err = cl.Flows(ctx, rates, Request{})
	if err != nil {
		t.Fatal(err)
	}
	// Finishes at 10/s: x (weight 2 of 2) 100 ms a request, y (1 of 3)
	// 300 ms.
	if want := [][]FlowState{{{Flow: "x", Waiting: true, Weight: 2, Ahead: 200 * time.Millisecond}, {Flow: "y", Waiting: true, Weight: 1, Ahead: 600 * time.Millisecond}}}; !reflect.DeepEqual(fs, want) {
		t.Errorf("gcra flows: %+v, want %+v", fs, want)
	}
	cl.now = cl.now.Add(time.Minute)
	if fs, err = cl.Flows(ctx, rates, Request{}); err != nil || len(fs[0]) != 0 {
		t.Errorf("a minute later: %+v %v, want no flow", fs, err)
	}

	// With priorities, each level of a flow is listed on its own.
	levels := mustSet(Rule{Name: "levels", Fair: true, Aging: time.Second, Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})})
	for _, p := range []int{5, 1, 0} {
		if d, err := cl.Reserve(ctx, levels, Request{Fair: []string{"x"}, Priorities: []int{p}}, time.Minute); err != nil || !d.Allowed {
			t.Fatalf("reserve at %d: %+v %v", p, d, err)
		}
	}
	if fs, err = cl.Flows(ctx, levels, Request{}); err != nil {
		t.Fatal(err)
	}
	want = [][]FlowState{{{Flow: "x", Waiting: true, Weight: 1, Level: 1, Ahead: 200 * time.Millisecond},
		{Flow: "x", Waiting: true, Weight: 1, Level: 3, Ahead: 300 * time.Millisecond}, {Flow: "x", Waiting: true, Weight: 1, Level: 5, Ahead: 100 * time.Millisecond}}}
	if !reflect.DeepEqual(fs, want) {
		t.Errorf("flows by level: %+v, want %+v", fs, want)
	}
	leveled := mustSet(Rule{Name: "leveled", Fair: true, Aging: time.Second, Limit: Concurrency{Max: 1, Lease: time.Minute}})
	for i, p := range []int{1, 5} {
		if d, err := cl.Allow(ctx, leveled, Request{Fair: []string{"x"}, Priorities: []int{p}, Holder: fmt.Sprint("h", i)}); err != nil || d.Allowed != (i == 0) {
			t.Fatalf("allow at %d: %+v %v", p, d, err)
		}
	}
	if fs, err = cl.Flows(ctx, leveled, Request{}); err != nil {
		t.Fatal(err)
	}
	want = [][]FlowState{{{Flow: "x", Held: 1, Level: 1}, {Flow: "x", Waiting: true, Weight: 1, Level: 5}}}
	if !reflect.DeepEqual(fs, want) {
		t.Errorf("slot flows by level: %+v, want %+v", fs, want)
	}
}
