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

// weightedPolicy shares a peak of 12/s by weight, the weight from the
// payload (the acceptance contract's form).
const weightedPolicy = `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}
    gcra: {rate: 12, per: 1s}
`

// TestWeightedShare: three worker binaries share a fair 12/s by weight
// among businesses w3, w2 and w1 (weights 3, 2 and 1 in their payloads),
// which enqueue 150, 100 and 20 calls at once, interleaved. The shares are
// computed from the limit and the weights alone: while all three have
// work 6, 4 and 2/s; from a second after w1's last call until w2's last,
// 7.2 and 4.8/s (w1's share goes to the others within a second). In every
// 5 s span of each phase (spans starting 100 ms apart) each business makes
// its share's calls within 10 % while all three have work (issue 29's bar)
// and within 20 % after, and one call either way (a span's edges may cut
// one call of an exact schedule); measured in six runs, three of them
// beside other end-to-end tests: 0.90-1.10x, then 0.92-1.12x
// (docs/design.md 1.5 says why not closer). The businesses together make
// the peak's calls within 5 % in every span; the API, at 13/s burst 2,
// answers no 429; no call is made twice.
func TestWeightedShare(t *testing.T) {
	t.Parallel() // light: runs beside the other light end-to-end tests (doc.go)
	const peak = 12.0
	weights := map[string]float64{"w3": 3, "w2": 2, "w1": 1}
	counts := map[string]int{"w3": 150, "w2": 100, "w1": 20}
	r := start(t, fakeapi.Limits{Global: fakeapi.Limit{Rate: 13, Period: time.Second, Burst: 2}}, weightedPolicy, 3)
	var lines []string
	for i := range 150 {
		for _, b := range []string{"w3", "w2", "w1"} {
			if i < counts[b] {
				lines = append(lines, fmt.Sprintf(`{"url": %q, "method": "POST", "business_id": %q, "weight": %v}`, r.url+"/v1/charge", b, weights[b]))
			}
		}
	}
	file := filepath.Join(t.TempDir(), "weighted.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.enqueue("--payload-file", file)
	// Until w2 has made all its calls.
	last := map[string]time.Time{}
	var calls []fakeapi.Call
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		calls = r.api.Calls()
		n := 0
		for _, c := range calls {
			if c.Status == 200 && c.Business == "w2" {
				n++
			}
		}
		if n == counts["w2"] {
			break
		}
	}
	var first time.Time
	for _, c := range calls {
		if c.Status != 200 {
			continue
		}
		if first.IsZero() || c.At.Before(first) {
			first = c.At
		}
		if c.At.After(last[c.Business]) {
			last[c.Business] = c.At
		}
	}
	// check tests every 5 s span from `from` that ends by `to`.
	check := func(what string, from, to time.Time, busy []string, margin float64) {
		t.Helper()
		const span = 5 * time.Second
		var sum float64
		for _, b := range busy {
			sum += weights[b]
		}
		lo, hi := map[string]float64{}, map[string]float64{}
		spans := 0
		for s := from; !s.Add(span).After(to); s = s.Add(100 * time.Millisecond) {
			spans++
			got, total := map[string]int{}, 0
			for _, c := range calls {
				if c.Status == 200 && !c.At.Before(s) && c.At.Before(s.Add(span)) {
					got[c.Business]++
					total++
				}
			}
			for _, b := range busy {
				want := peak * weights[b] / sum * span.Seconds()
				x := float64(got[b]) / want
				if spans == 1 || x < lo[b] {
					lo[b] = x
				}
				if spans == 1 || x > hi[b] {
					hi[b] = x
				}
				if d := float64(got[b]) - want; d > margin*want+1 || d < -margin*want-1 {
					t.Errorf("%s: %s made %d calls in the 5 s from %v after the first call, more than %.0f%% and a call from its share of %.0f", what, b, got[b], s.Sub(first).Round(time.Millisecond), 100*margin, want)
				}
			}
			if want := peak * span.Seconds(); float64(total) < 0.95*want || float64(total) > 1.05*want {
				t.Errorf("%s: %d calls together in the 5 s from %v after the first call, more than 5%% from the peak's %.0f", what, total, s.Sub(first).Round(time.Millisecond), want)
			}
		}
		if spans == 0 {
			t.Fatalf("%s: no 5 s span from %v to %v after the first call", what, from.Sub(first), to.Sub(first))
		}
		for _, b := range busy {
			t.Logf("%s: %s made %.2f-%.2fx its share in %d spans of 5 s", what, b, lo[b], hi[b], spans)
		}
	}
	check("all three", first, last["w1"], []string{"w3", "w2", "w1"}, 0.1)
	check("w1 done", last["w1"].Add(time.Second), last["w2"], []string{"w3", "w2"}, 0.2)
	if t.Failed() {
		for s := first; !s.After(last["w2"]); s = s.Add(time.Second) {
			got := map[string]int{}
			for _, c := range calls {
				if c.Status == 200 && !c.At.Before(s) && c.At.Before(s.Add(time.Second)) {
					got[c.Business]++
				}
			}
			t.Logf("second %2d: w3 %d, w2 %d, w1 %d", int(s.Sub(first)/time.Second), got["w3"], got["w2"], got["w1"])
		}
	}
	checkCalls(t, r.api.Stats())
	r.stop()
}
