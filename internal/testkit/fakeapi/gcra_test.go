package fakeapi

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// TestTatsAgreesWithGCRAModel runs 20,000 random requests through the
// API's own GCRA arithmetic and through package gcra's reference model,
// on limits whose interval is a whole number of microseconds (where the
// two definitions meet: gcra rounds the interval up to microseconds):
// both admit the same requests and name the same wait, so the stand-in
// judges by the limits' definition, with code of its own.
func TestTatsAgreesWithGCRAModel(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 1))
	var s tats
	var m gcra.Model
	now := time.Unix(1_700_000_000, 0)
	denied := 0
	rates := []float64{1, 2, 4, 5, 8, 10, 20, 25, 50, 100, 1000}
	for i := range 20000 {
		l := Limit{Rate: rates[i/2000%len(rates)], Period: time.Second, Burst: 1 + i/2000%5}
		key := []string{"a", "b", "c"}[r.IntN(3)]
		n := 1 + r.IntN(l.Burst)
		now = now.Add(time.Duration(r.IntN(int(2*time.Second/time.Duration(l.Rate))/1000+1)) * time.Microsecond)
		undo, retry := s.allow(now, key, l, n)
		res, err := m.AllowN(now, key, gcra.Limit(l), n)
		if err != nil {
			t.Fatal(err)
		}
		if (undo != nil) != res.Allowed || undo == nil && retry != res.RetryAfter {
			t.Fatalf("request %d (%v, key %s, cost %d, at %v): fakeapi admits %v (retry %v), gcra.Model %v (retry %v)",
				i, l, key, n, now, undo != nil, retry, res.Allowed, res.RetryAfter)
		}
		if undo == nil {
			denied++
		}
		if undo != nil && r.IntN(4) == 0 {
			undo()
			if _, err := m.Refund(now, key, gcra.Limit(l), n); err != nil {
				t.Fatal(err)
			}
		}
	}
	if denied < 2000 || denied > 18000 {
		t.Fatalf("%d of 20,000 denied: the test does not exercise both answers", denied)
	}
}
