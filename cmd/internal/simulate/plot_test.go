package simulate

import (
	"bytes"
	"io"
	"math"
	"testing"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/plot/svgtest"
)

// TestPlot: the chart of a simulation steps the vendor's limit at its
// phases' rates and times, spans the simulated time, draws one step of
// calls per second per row, and its y axis reaches every value.
func TestPlot(t *testing.T) {
	spec := Spec{Policy: mustPolicy(t, `rules: [{name: vendor, match: {type: "http:call"}, adaptive: {max: 25, per: 1s}}]`), Type: "http:call",
		Vendor: mustVendor(t, "20/s for 30s, 5/s for 30s, 20/s"), Duration: 90 * time.Second, Interval: 10 * time.Second}
	rep, err := Run(spec)
	if err != nil {
		t.Fatal(err)
	}
	// A spec Run would refuse (no vendor phase) draws no limit, no panic.
	if err := (Report{}).Plot(io.Discard, Spec{}); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.Plot(&b, spec); err != nil {
		t.Fatal(err)
	}
	d := svgtest.Parse(t, b.Bytes())
	x, y := d.XAxis(t), d.YAxis(t)
	if got := d.Root.Num(t, "data-x-max"); got != 90 {
		t.Errorf("x axis to %vs, want 90", got)
	}
	lines := d.Class("limit-line")
	if len(lines) != 1 {
		t.Fatalf("%d limit lines", len(lines))
	}
	// (0, 20) (30, 20) (30, 5) (60, 5) (60, 20) (90, 20).
	want := [][2]float64{{0, 20}, {30, 20}, {30, 5}, {60, 5}, {60, 20}, {90, 20}}
	pts := lines[0].Points(t)
	if len(pts) != len(want) {
		t.Fatalf("limit line %v", pts)
	}
	for i, p := range pts {
		if math.Abs(x.Value(p[0])-want[i][0]) > 0.1 || math.Abs(y.Value(p[1])-want[i][1]) > 0.05 {
			t.Errorf("limit point %d at %.2fs, %.2f/s; want %v", i, x.Value(p[0]), y.Value(p[1]), want[i])
		}
	}
	series := d.Class("series")
	if len(series) != 3 || series[0].Attr["data-name"] != "calls per second" {
		t.Fatalf("series %d", len(series))
	}
	calls := series[0].Points(t)
	highest := 20.0
	for i, row := range rep.Rows {
		v := float64(row.Calls) / (row.To - row.From).Seconds()
		highest = max(highest, v, row.Learned)
		if got := y.Value(calls[2*i][1]); math.Abs(got-v) > 0.05 {
			t.Errorf("row %d drawn at %.2f calls/s, want %.2f", i, got, v)
		}
	}
	if y.Max() < highest {
		t.Errorf("y axis to %v, below %v", y.Max(), highest)
	}
}
