package estimate

import (
	"bytes"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/plot/svgtest"
)

func plotDoc(t *testing.T, r *Report) *svgtest.Doc {
	t.Helper()
	var b bytes.Buffer
	if err := r.Plot(&b); err != nil {
		t.Fatal(err)
	}
	return svgtest.Parse(t, b.Bytes())
}

// checkPlot checks what every schedule plot shows of r: the finish at its
// Duration, an x axis spanning the campaign, a y axis up to at least every
// value drawn, and the series counting every task that started.
func checkPlot(t *testing.T, r *Report, d *svgtest.Doc) {
	t.Helper()
	x, y := d.XAxis(t), d.YAxis(t)
	f := d.ID(t, "finish")
	if got := f.Num(t, "data-seconds"); got != r.Duration.Seconds() {
		t.Errorf("finish at %vs, want %vs", got, r.Duration.Seconds())
	}
	if got := x.Value(f.Num(t, "x1")); math.Abs(got-r.Duration.Seconds()) > 0.01*r.Duration.Seconds() {
		t.Errorf("finish line drawn at %vs, want %vs", got, r.Duration.Seconds())
	}
	if got, want := d.ID(t, "finish-label").Text, "finish "+formatSeconds(r.Duration); got != want {
		t.Errorf("finish label %q, want %q", got, want)
	}
	if xmax := d.Root.Num(t, "data-x-max"); x.Ticks[0] != 0 || xmax < r.Duration.Seconds() || x.Max() > xmax {
		t.Errorf("x axis 0..%v (ticks %v), campaign %s", xmax, x.Ticks, r.Duration)
	}
	highest := 0.0
	tl := r.Timeline
	started := 0
	for _, n := range tl.Counts {
		highest = max(highest, float64(n)/tl.Bin.Seconds())
		started += n
	}
	if want := r.Tasks - r.Refused; started != want {
		t.Errorf("timeline counts %d tasks, want %d", started, want)
	}
	for _, rr := range r.Rules {
		highest = max(highest, rr.Rate*float64(rr.Keys))
	}
	if y.Ticks[0] != 0 || y.Max() < highest {
		t.Errorf("y ticks %v, highest value %v", y.Ticks, highest)
	}
	// The series, read back through the axes, is the timeline.
	pts := d.Class("series")[0].Points(t)
	for i, n := range tl.Counts {
		p := pts[2*i]
		if at, v := x.Value(p[0]), y.Value(p[1]); math.Abs(at-(time.Duration(i)*tl.Bin).Seconds()) > 0.01*x.Max() || math.Abs(v-float64(n)/tl.Bin.Seconds()) > 0.01*y.Max() {
			t.Errorf("interval %d drawn at %vs, %v/s; want %d tasks in %s", i, at, v, n, tl.Bin)
		}
	}
}

// formatSeconds is what the finish label says of d.
func formatSeconds(d time.Duration) string {
	switch d {
	case 50 * time.Second:
		return "50s"
	case 6 * time.Second:
		return "6s"
	case 47 * time.Second:
		return "47s"
	case 9900 * time.Millisecond:
		return "9.9s"
	}
	return "?" + d.String()
}

// limitAt returns the value the limit line of rule is drawn at.
func limitAt(t *testing.T, d *svgtest.Doc, rule string) float64 {
	t.Helper()
	y := d.YAxis(t)
	for _, g := range d.Class("limit") {
		if len(g.Attr["data-name"]) >= len(rule) && g.Attr["data-name"][:len(rule)+1] == rule+":" {
			pts := g.Children[0].Points(t)
			if pts[0][1] != pts[len(pts)-1][1] {
				t.Fatalf("limit %s is not horizontal: %v", rule, pts)
			}
			return y.Value(pts[0][1])
		}
	}
	t.Fatalf("no limit line for rule %s", rule)
	return 0
}

// TestPlotFixedWindow: 1000 tasks under 190 per 10s run 190 at the start
// of each window: the plot's resets are the window boundaries up to the
// finish at 50 s, its limit 19/s.
func TestPlotFixedWindow(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10s}
`)
	r := run(t, p, 1000, roundRobin(3), Options{Start: epoch10.Add(3 * time.Second)})
	check(t, r, 47*time.Second, "vendor-window")
	// From 09:00:03 the windows reset at :10, :20, ..., :50: 5 × 190 and
	// the last 50 at :50, 47 s after the start.
	var want []float64
	for s := 7.0; s <= 47; s += 10 {
		want = append(want, s)
	}
	var got []float64
	for _, ts := range r.Rules[0].Resets {
		got = append(got, ts.Sub(r.Start).Seconds())
	}
	if !slices.Equal(got, want) {
		t.Errorf("report resets at %v s, want %v", got, want)
	}
	d := plotDoc(t, r)
	checkPlot(t, r, d)
	got = nil
	for _, l := range d.Class("reset") {
		got = append(got, l.Num(t, "data-seconds"))
		if x := d.XAxis(t).Value(l.Num(t, "x1")); math.Abs(x-got[len(got)-1]) > 0.05 {
			t.Errorf("reset at %vs drawn at %vs", got[len(got)-1], x)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("plot resets at %v s, want %v", got, want)
	}
	if got := limitAt(t, d, "vendor-window"); math.Abs(got-19) > 0.05 {
		t.Errorf("limit line at %v/s, want 19", got)
	}
	if r.Timeline.Bin != time.Second || r.Timeline.Counts[0] != 190 || r.Timeline.Counts[7] != 190 || r.Timeline.Counts[47] != 50 {
		t.Errorf("timeline %+v", r.Timeline)
	}
}

func TestPlotFixedWindowAligned(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10s}
`)
	r := run(t, p, 1000, roundRobin(3), Options{})
	check(t, r, 50*time.Second, "vendor-window")
	d := plotDoc(t, r)
	checkPlot(t, r, d)
	var got []float64
	for _, l := range d.Class("reset") {
		got = append(got, l.Num(t, "data-seconds"))
	}
	if want := []float64{10, 20, 30, 40, 50}; !slices.Equal(got, want) {
		t.Errorf("plot resets at %v s, want %v", got, want)
	}
}

// TestPlotGCRA: a global 100/s and a per-business 1/s for 1000 businesses
// (1000/s together); no resets.
func TestPlotGCRA(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s, burst: 1}
`)
	r := run(t, p, 1000, roundRobin(1000), Options{})
	check(t, r, 9900*time.Millisecond, "vendor-peak")
	d := plotDoc(t, r)
	checkPlot(t, r, d)
	if got := limitAt(t, d, "vendor-peak"); math.Abs(got-100) > 0.5 {
		t.Errorf("vendor-peak drawn at %v/s, want 100", got)
	}
	if got := limitAt(t, d, "per-business"); math.Abs(got-1000) > 5 {
		t.Errorf("per-business drawn at %v/s, want 1000 (1/s × 1000 keys)", got)
	}
	if n := len(d.Class("reset")); n != 0 {
		t.Errorf("%d resets", n)
	}
}

// TestPlotConcurrency: 5 at once, each task 2 s: 5 tasks start every
// 2 s, 2.5/s; the last of 20 at 6 s.
func TestPlotConcurrency(t *testing.T) {
	p := parse(t, `
rules:
  - name: vendor-slots
    match: {type: "http:call"}
    concurrency: {max: 5, lease: 1m}
`)
	r := run(t, p, 20, roundRobin(1), Options{TaskDuration: 2 * time.Second})
	check(t, r, 6*time.Second, "vendor-slots")
	d := plotDoc(t, r)
	checkPlot(t, r, d)
	if got := limitAt(t, d, "vendor-slots"); math.Abs(got-2.5) > 0.01 {
		t.Errorf("limit line at %v/s, want 2.5", got)
	}
	if want := []int{5, 0, 5, 0, 5, 0, 5}; !slices.Equal(r.Timeline.Counts, want) {
		t.Errorf("timeline %v, want %v", r.Timeline.Counts, want)
	}
}

// TestTimelineBounded: a long campaign is counted in at most MaxBins
// intervals of a round length.
func TestTimelineBounded(t *testing.T) {
	var h histogram
	for s := range 100_000 {
		h.add(time.Duration(s)*time.Second, 1)
	}
	tl := h.timeline()
	if tl.Bin != 30*time.Minute || len(tl.Counts) != 56 || tl.Counts[0] != 1800 || tl.Counts[55] != 100_000-55*1800 {
		t.Errorf("timeline: bin %s, %d counts, first %d", tl.Bin, len(tl.Counts), tl.Counts[0])
	}
	h = histogram{}
	h.add(400*24*time.Hour, 2)
	if tl := h.timeline(); len(tl.Counts) > MaxBins || tl.Counts[len(tl.Counts)-1] != 2 || tl.Bin%(24*time.Hour) != 0 {
		t.Errorf("timeline of a year: bin %s, %d counts", tl.Bin, len(tl.Counts))
	}
}
