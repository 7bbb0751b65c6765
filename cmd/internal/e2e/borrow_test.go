package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// TestBorrow: dynamic throttling (issue 16) with the built binaries, 3
// worker processes and an API that allows 8/s (burst 2). Each business is
// held to 2/s and may borrow up to 4/s (borrow: 2x) from the vendor's 8/s,
// shared fairly. Business a alone, with 40 calls, runs above its own 2/s,
// at up to its 4/s ceiling: in no span d more than 1 + 4d of its calls
// (the ceiling's burst 1, plus 1 for the calls' jitter), over its first
// 3 s at least 3/s. Then businesses b and c get 10 calls each: each makes
// its first call within 2 s of its enqueue (asynq finds new tasks within
// 1.5 s at its default poll) and from then on runs at its own 2/s or
// better: its 10 calls end no later than 1.5 s + 9/2 s after its first
// (4.0-5.0 s in six runs), and its i-th call (from 0) comes no later than
// 2 s + i/2 s after it (the fair shares even out over a few bookings: in
// one run of ten the later of the two fell 0.5 s behind 1 s + i/2 s for
// three calls, then caught up).
// The API answers no 429, every call is made once, and every task runs.
func TestBorrow(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	r := start(t, fakeapi.Limits{Global: fakeapi.Limit{Rate: 8, Period: time.Second, Burst: 2}}, `
rules:
  - name: vendor
    match: {type: "http:call"}
    fair: "{{.business_id}}"
    gcra: {rate: 8, per: 1s}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    borrow: 2x
    gcra: {rate: 2, per: 1s}
`, 3)
	file := func(name string, n int, biz ...string) string {
		var lines []string
		for i := range n {
			for _, b := range biz {
				lines = append(lines, fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": %q, "i": %d}`, r.url+"/v1/charge", b, i))
			}
		}
		f := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	calls := func(biz string) []time.Time {
		var at []time.Time
		for _, c := range r.api.Calls() {
			if c.Status == 200 && c.Business == biz {
				at = append(at, c.At)
			}
		}
		return at
	}

	r.enqueue("--payload-file", file("a.jsonl", 40, "a"))
	deadline := time.Now().Add(10 * time.Second)
	for len(calls("a")) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	others := time.Now()
	r.enqueue("--payload-file", file("bc.jsonl", 10, "b", "c"))
	st := r.waitKeys(60, time.Minute)
	checkCalls(t, st)
	if st.DistinctKeys != 60 || st.Calls != 60 {
		t.Fatalf("want each of 60 tasks called once: %d calls, %d distinct keys", st.Calls, st.DistinctKeys)
	}

	a := calls("a")
	var alone int
	for _, at := range a {
		if at.Before(a[0].Add(3 * time.Second)) {
			alone++
		}
	}
	t.Logf("business a alone: %d calls in its first 3 s (own 2/s: 7 at most with its burst; 4/s: 13)", alone)
	if alone < 9 {
		t.Errorf("business a alone made %d calls in its first 3 s: not borrowing (its own 2/s allows 7)", alone)
	}
	for i := range a {
		for j := i; j < len(a); j++ {
			if d := a[j].Sub(a[i]); float64(j-i+1) > 2+4*d.Seconds() {
				t.Errorf("business a made %d calls in %v: more than its 4/s ceiling allows", j-i+1, d)
			}
		}
	}
	for _, biz := range []string{"b", "c"} {
		at := calls(biz)
		wait := at[0].Sub(others)
		t.Logf("business %s: first call %v after its enqueue, last %v after its first", biz, wait.Round(time.Millisecond), at[len(at)-1].Sub(at[0]).Round(time.Millisecond))
		if wait > 2*time.Second {
			t.Errorf("business %s made its first call %v after its enqueue", biz, wait)
		}
		if lim := 1500*time.Millisecond + time.Duration(len(at)-1)*500*time.Millisecond; at[len(at)-1].Sub(at[0]) > lim {
			t.Errorf("business %s's last call came %v after its first: later than its own 2/s allows within 1.5 s (%v)", biz, at[len(at)-1].Sub(at[0]), lim)
		}
		for i, c := range at {
			if lim := at[0].Add(2*time.Second + time.Duration(i)*500*time.Millisecond); c.After(lim) {
				t.Errorf("business %s's call %d came %v after its first: more than 2 s behind its own 2/s (%v)", biz, i, c.Sub(at[0]), lim.Sub(at[0]))
			}
		}
	}
	r.stop()
}
