package quotas

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestModelClock: a Model's context methods decide at its clock's time,
// as their explicit-time twins do at that time, and do nothing for a
// context that has ended.
func TestModelClock(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	m := NewModelOn(func() time.Time { return now })
	twin := NewModel()
	s, err := NewSet(Rule{Name: "r", Limit: GCRA{Rate: 2, Period: time.Second, Burst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	req := Request{Keys: []string{"k"}}
	ctx := context.Background()
	for i := range 4 {
		d, err := m.Allow(ctx, s, req)
		w, werr := twin.AllowAt(now, s, req)
		if err != nil || werr != nil || d.Allowed != w.Allowed || d.RetryAfter != w.RetryAfter || !d.Now.Equal(now) {
			t.Fatalf("call %d at %v: Allow %+v, %v; AllowAt %+v, %v", i, now, d, err, w, werr)
		}
		now = now.Add(300 * time.Millisecond)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Reserve(done, s, req, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Reserve with an ended context: %v, want context.Canceled", err)
	}
	// Nothing was booked: the state is the twin's, which had no Reserve.
	d, err := m.Status(ctx, s, req)
	w, werr := twin.StatusAt(now, s, req)
	if err != nil || werr != nil || d.Rules[0] != w.Rules[0] {
		t.Errorf("after the ended context's Reserve: %+v, %v; the twin %+v, %v", d.Rules, err, w.Rules, werr)
	}
	if r, _ := m.Reserve(ctx, s, req, time.Hour); !r.Allowed {
		t.Fatalf("Reserve: %+v", r)
	}
	if d, _ := m.Status(ctx, s, req); d.Rules[0] == w.Rules[0] {
		t.Errorf("a Reserve changed nothing: %+v (so the check above proves nothing)", d.Rules[0])
	}
}
