package plot_test

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/plot"
	"github.com/taskrl/taskrl/cmd/internal/plot/svgtest"
)

func write(t *testing.T, c *plot.Chart) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestEscaped: names from a policy file, with markup in them, come back
// as text, and the document still parses.
func TestEscaped(t *testing.T) {
	name := `<script>alert("x")</script> & 'a' ]]> ` + "\x01"
	c := &plot.Chart{
		Title:  name,
		Series: []plot.Series{{Name: name, Points: []plot.Point{{0, 1}, {time.Second, 2}}}},
		Limits: []plot.Limit{{Name: name, Label: name, Steps: []plot.Point{{Value: 3}}}},
		Resets: []plot.Mark{{At: time.Second, Label: name}},
		Finish: &plot.Mark{At: time.Second, Label: name},
	}
	out := write(t, c)
	if bytes.Contains(out, []byte("<script")) {
		t.Fatalf("unescaped markup:\n%s", out)
	}
	d := svgtest.Parse(t, out)
	want := strings.ReplaceAll(name, "\x01", "\uFFFD")
	if got := d.ID(t, "chart-title").Text; got != want {
		t.Errorf("title %q, want %q", got, want)
	}
	if got := d.Class("limit")[0].Attr["data-name"]; got != want {
		t.Errorf("limit name %q, want %q", got, want)
	}
	if got := d.ID(t, "finish-label").Text; got != want {
		t.Errorf("finish label %q, want %q", got, want)
	}
}

// TestAxes: the y axis starts at 0 and ends at a round tick at or above
// every value; the x axis at the span; each point is where the ticks say.
func TestAxes(t *testing.T) {
	for _, top := range []float64{0.07, 1, 9.9, 18, 19.5, 40, 40.5, 100.1, 190, 950, 1234.5} {
		// The last span: as long as a Duration gets (the ticks' loop once
		// overflowed there and never ended).
		for _, span := range []time.Duration{300 * time.Millisecond, time.Second, 55500 * time.Millisecond, 380 * time.Second, 3 * time.Hour, 24 * time.Hour, 40 * 24 * time.Hour, math.MaxInt64} {
			c := &plot.Chart{
				Series: []plot.Series{{Name: "s", Step: true, Points: []plot.Point{{0, top / 2}, {span / 3, top}, {span, top}}}},
				Limits: []plot.Limit{{Name: "l", Steps: []plot.Point{{Value: top / 3}}}},
				Finish: &plot.Mark{At: span / 2},
			}
			d := svgtest.Parse(t, write(t, c))
			x, y := d.XAxis(t), d.YAxis(t)
			if y.Ticks[0] != 0 || y.Max() < top || y.Max() > 2*top || len(y.Ticks) > 12 {
				t.Errorf("top %v: y ticks %v", top, y.Ticks)
			}
			if x.Ticks[0] != 0 || x.Max() > span.Seconds() || len(x.Ticks) > 11 {
				t.Errorf("span %s: x ticks %v", span, x.Ticks)
			}
			if got := d.Root.Num(t, "data-x-max"); got != span.Seconds() {
				t.Errorf("span %s: data-x-max %v", span, got)
			}
			pts := d.Class("series")[0].Points(t)
			// Step: (0, top/2), (span/3, top/2), (span/3, top), (span, top), (span, top).
			if len(pts) != 5 || !near(x.Value(pts[2][0]), (span/3).Seconds(), span.Seconds()/1000) || !near(y.Value(pts[2][1]), top, top/100) {
				t.Errorf("top %v span %s: series %v", top, span, pts)
			}
			l := d.Class("limit-line")[0].Points(t)
			if !near(y.Value(l[0][1]), top/3, top/100) {
				t.Errorf("top %v: limit at %v", top, y.Value(l[0][1]))
			}
			f := d.ID(t, "finish")
			if !near(x.Value(f.Num(t, "x1")), (span/2).Seconds(), span.Seconds()/1000) || f.Num(t, "data-seconds") != (span/2).Seconds() {
				t.Errorf("span %s: finish %v", span, f.Attr)
			}
			if got, want := d.ID(t, "finish-label").Text, "finish "+plot.Duration(span/2); got != want {
				t.Errorf("finish label %q, want %q", got, want)
			}
		}
	}
}

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// TestDeterministic: the same chart, the same bytes.
func TestDeterministic(t *testing.T) {
	c := &plot.Chart{Title: "t", Series: []plot.Series{{Name: "s", Points: []plot.Point{{0, 1.0 / 3}, {time.Second, 2.0 / 3}}}},
		Resets: []plot.Mark{{At: time.Second / 2, Label: "a"}, {At: time.Second / 3, Label: "b"}}}
	if a, b := write(t, c), write(t, c); !bytes.Equal(a, b) {
		t.Fatal("two writes differ")
	}
}

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 250 * time.Millisecond: "250ms", 10 * time.Second: "10s", 1500 * time.Millisecond: "1.5s",
		90 * time.Second: "1m30s", 380 * time.Second: "6m20s", 2 * time.Hour: "2h", 90 * time.Minute: "1h30m",
		72 * time.Hour: "3d", 55500 * time.Millisecond: "55.5s", -time.Minute: "-1m",
	} {
		if got := plot.Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}
