// Package plot draws a small chart of rates over time as a standalone SVG
// document: time on x from 0 (an offset from the chart's start), a
// quantity such as tasks per second on y from 0, series as lines or steps,
// limits as horizontal or stepped lines labelled with their name, dashed
// vertical lines at window resets, a vertical line at the finish, a legend
// and a title. The output is deterministic (the same Chart gives the same
// bytes), needs no script, font or network, and escapes every text, so
// names from a user's policy file are safe in it.
//
// Elements carry stable ids, classes and data- attributes for programs
// that read the chart back (the tests do): the plot area is
// <rect id="plot-area">; each y tick is a <line class="y-tick"> and a
// <text class="y-tick-label">, each x tick a <line class="x-tick"> and a
// <text class="x-tick-label">, all with data-value (the tick's value; for
// x, seconds from the start); a series is <polyline class="series"
// data-name=...>; a limit is <g class="limit" data-name=... data-value=...>
// holding a <polyline class="limit-line"> and a <text class="limit-label">;
// a reset is <line class="reset" data-seconds=...>; the finish is
// <line id="finish" data-seconds=...> and <text id="finish-label">. The
// root <svg> has data-x-max (seconds) and data-y-max, the axes' ends.
//
// Tool code of the binaries, imported by cmd/internal/estimate and
// cmd/internal/simulate.
package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Chart is what to draw. The zero value draws empty axes; a Chart is
// read, never changed, by WriteSVG, so one may be written concurrently.
type Chart struct {
	// Title is drawn above the chart; Subtitle, if set, under it.
	Title, Subtitle string
	// XLabel and YLabel name the axes; defaults "time" and "per second".
	XLabel, YLabel string
	// Span is the x axis's length, from 0. Default (0): the furthest point,
	// limit step, reset or finish; a second when all are at 0.
	Span time.Duration
	// Series are the measured lines, drawn in this order.
	Series []Series
	// Limits are the ceilings, drawn over the series.
	Limits []Limit
	// Resets are the instants at which a window starts afresh: dashed
	// vertical lines, each Label (a rule's name) a tooltip and, once per
	// distinct Label, a legend entry.
	Resets []Mark
	// Finish, if set, is a solid vertical line labelled with its Label
	// (default "finish" and its offset, e.g. "finish 6m20s").
	Finish *Mark
}

// Point is a value at an offset from the chart's start.
type Point struct {
	At    time.Duration
	Value float64
}

// Series is one measured line. With Step each point's value holds until
// the next point's offset (a histogram: end it with a closing point),
// otherwise the points are joined by straight lines. Points must be in
// time order; values below 0, NaN or infinite are drawn as 0.
type Series struct {
	Name   string
	Points []Point
	Step   bool
}

// Limit is a ceiling: each step's value holds from its offset until the
// next step's, the last one's to the end of the axis. One step is a
// horizontal line, dashed, drawn over the series. Label is drawn above
// the line's left end, Name in the
// legend and as data-name.
type Limit struct {
	Name, Label string
	Steps       []Point
}

// Mark is a labelled instant.
type Mark struct {
	At    time.Duration
	Label string
}

// The chart's geometry, in SVG user units (pixels); the legend, one line
// per entry, is under the x axis, and makes the chart taller.
const (
	width      = 900
	plotLeft   = 70
	plotRight  = 870
	plotTop    = 64
	plotBottom = 384
	legendTop  = plotBottom + 66
	legendLine = 20
)

// The colours: series, then limits in turn.
var (
	seriesColours = []string{"#1f77b4", "#17becf", "#7f7f7f", "#bcbd22"}
	limitColours  = []string{"#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"}
)

// WriteSVG writes c to w as an SVG document.
func (c *Chart) WriteSVG(w io.Writer) error {
	if c == nil {
		return errors.New("plot: no chart")
	}
	span := c.span()
	top := c.yTop()
	xs := xTicks(span)
	ys := yTicks(top)
	top = ys[len(ys)-1].v
	x := func(d time.Duration) float64 {
		return plotLeft + (plotRight-plotLeft)*d.Seconds()/span.Seconds()
	}
	y := func(v float64) float64 {
		return plotBottom - (plotBottom-plotTop)*clean(v)/top
	}
	var b bytes.Buffer
	var resetLabels []string
	for _, m := range c.Resets {
		if !slices.Contains(resetLabels, m.Label) {
			resetLabels = append(resetLabels, m.Label)
		}
	}
	entries := len(c.Series) + len(c.Limits) + len(resetLabels)
	if c.Finish != nil {
		entries++
	}
	height := legendTop + legendLine*entries
	xlabel, ylabel := c.XLabel, c.YLabel
	if xlabel == "" {
		xlabel = "time"
	}
	if ylabel == "" {
		ylabel = "per second"
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-labelledby="title" data-x-max="%s" data-y-max="%s">`+"\n",
		width, height, width, height, secs(span), num(top))
	fmt.Fprintf(&b, `<title id="title">%s</title>`+"\n", esc(c.Title))
	b.WriteString(`<g font-family="sans-serif" font-size="12" fill="#222">` + "\n")
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#fff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text id="chart-title" x="%d" y="24" font-size="16" font-weight="bold">%s</text>`+"\n", plotLeft, esc(c.Title))
	if c.Subtitle != "" {
		fmt.Fprintf(&b, `<text id="chart-subtitle" x="%d" y="44" fill="#555">%s</text>`+"\n", plotLeft, esc(c.Subtitle))
	}
	fmt.Fprintf(&b, `<rect id="plot-area" x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n",
		plotLeft, plotTop, plotRight-plotLeft, plotBottom-plotTop)

	// Axes: grid lines and labels.
	for _, t := range ys {
		py := f(y(t.v))
		fmt.Fprintf(&b, `<line class="y-tick" data-value="%s" x1="%d" y1="%s" x2="%d" y2="%s" stroke="#e5e5e5"/>`+"\n", num(t.v), plotLeft, py, plotRight, py)
		fmt.Fprintf(&b, `<text class="y-tick-label" data-value="%s" x="%d" y="%s" text-anchor="end">%s</text>`+"\n", num(t.v), plotLeft-6, f(y(t.v)+4), esc(t.label))
	}
	for _, t := range xs {
		px := f(x(t.d))
		fmt.Fprintf(&b, `<line class="x-tick" data-value="%s" x1="%s" y1="%d" x2="%s" y2="%d" stroke="#e5e5e5"/>`+"\n", secs(t.d), px, plotTop, px, plotBottom)
		fmt.Fprintf(&b, `<text class="x-tick-label" data-value="%s" x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", secs(t.d), px, plotBottom+16, esc(t.label))
	}
	fmt.Fprintf(&b, `<text id="x-label" x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (plotLeft+plotRight)/2, plotBottom+38, esc(xlabel))
	fmt.Fprintf(&b, `<text id="y-label" transform="translate(18 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (plotTop+plotBottom)/2, esc(ylabel))

	// Resets, under everything else.
	for _, m := range c.Resets {
		if m.At < 0 || m.At > span {
			continue
		}
		px := f(x(m.At))
		fmt.Fprintf(&b, `<line class="reset" data-seconds="%s" x1="%s" y1="%d" x2="%s" y2="%d" stroke="#888" stroke-dasharray="4 4"><title>%s</title></line>`+"\n",
			secs(m.At), px, plotTop, px, plotBottom, esc(m.Label))
	}

	// Series.
	for i, s := range c.Series {
		if len(s.Points) == 0 {
			continue
		}
		col := seriesColours[i%len(seriesColours)]
		var pts []string
		for k, p := range s.Points {
			if s.Step && k > 0 {
				pts = append(pts, f(x(clamp(p.At, span)))+","+f(y(s.Points[k-1].Value)))
			}
			pts = append(pts, f(x(clamp(p.At, span)))+","+f(y(p.Value)))
		}
		fmt.Fprintf(&b, `<polyline class="series" data-name="%s" points="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"/>`+"\n", esc(s.Name), strings.Join(pts, " "), col)
	}

	// Limits, with their labels kept apart.
	type label struct {
		y    float64
		text string
		col  string
		i    int
	}
	var labels []label
	for i, l := range c.Limits {
		if len(l.Steps) == 0 {
			continue
		}
		col := limitColours[i%len(limitColours)]
		var pts []string
		for k, s := range l.Steps {
			end := span
			if k+1 < len(l.Steps) {
				end = l.Steps[k+1].At
			}
			pts = append(pts, f(x(clamp(s.At, span)))+","+f(y(s.Value)), f(x(clamp(end, span)))+","+f(y(s.Value)))
		}
		fmt.Fprintf(&b, `<g class="limit" data-name="%s" data-value="%s">`+"\n", esc(l.Name), num(clean(l.Steps[0].Value)))
		fmt.Fprintf(&b, `<polyline class="limit-line" points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="8 4"/>`+"\n", strings.Join(pts, " "), col)
		labels = append(labels, label{y: y(l.Steps[0].Value) - 4, text: l.Label, col: col, i: i})
		b.WriteString("</g>\n")
	}
	// Labels above their lines' left ends, moved down (and back up inside the plot)
	// so that none overlaps another.
	slices.SortStableFunc(labels, func(a, b label) int {
		switch {
		case a.y < b.y:
			return -1
		case a.y > b.y:
			return 1
		}
		return 0
	})
	for k := range labels {
		labels[k].y = max(labels[k].y, plotTop+14)
		if k > 0 {
			labels[k].y = max(labels[k].y, labels[k-1].y+14)
		}
	}
	for k := len(labels) - 1; k >= 0; k-- {
		lim := float64(plotBottom - 4)
		if k+1 < len(labels) {
			lim = labels[k+1].y - 14
		}
		labels[k].y = min(labels[k].y, lim)
	}
	for _, l := range labels {
		fmt.Fprintf(&b, `<text class="limit-label" data-limit="%d" x="%d" y="%s" fill="%s">%s</text>`+"\n", l.i, plotLeft+6, f(l.y), l.col, esc(l.text))
	}

	// The finish.
	text := ""
	if c.Finish != nil {
		at := clamp(c.Finish.At, span)
		text = c.Finish.Label
		if text == "" {
			text = "finish " + Duration(c.Finish.At)
		}
		px := x(at)
		anchor, tx := "start", px+4
		if px > (plotLeft+plotRight)/2 {
			anchor, tx = "end", px-4
		}
		fmt.Fprintf(&b, `<line id="finish" data-seconds="%s" x1="%s" y1="%d" x2="%s" y2="%d" stroke="#000" stroke-width="2"/>`+"\n", secs(c.Finish.At), f(px), plotTop-6, f(px), plotBottom)
		fmt.Fprintf(&b, `<text id="finish-label" x="%s" y="%d" text-anchor="%s" font-weight="bold">%s</text>`+"\n", f(tx), plotTop-8, anchor, esc(text))
	}

	// The legend.
	ly := legendTop
	entry := func(swatch, text string) {
		fmt.Fprintf(&b, `<g class="legend-entry" transform="translate(%d %d)">%s<text x="28" y="4">%s</text></g>`+"\n", plotLeft, ly, swatch, esc(text))
		ly += legendLine
	}
	for i, s := range c.Series {
		entry(fmt.Sprintf(`<line x1="0" y1="0" x2="22" y2="0" stroke="%s" stroke-width="2"/>`, seriesColours[i%len(seriesColours)]), s.Name)
	}
	for i, l := range c.Limits {
		entry(fmt.Sprintf(`<line x1="0" y1="0" x2="22" y2="0" stroke="%s" stroke-width="1.5" stroke-dasharray="8 4"/>`, limitColours[i%len(limitColours)]), l.Name)
	}
	for _, l := range resetLabels {
		text := "window reset"
		if l != "" {
			text += ": " + l
		}
		entry(`<line x1="11" y1="-7" x2="11" y2="7" stroke="#888" stroke-dasharray="4 4"/>`, text)
	}
	if c.Finish != nil {
		entry(`<line x1="11" y1="-7" x2="11" y2="7" stroke="#000" stroke-width="2"/>`, text)
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// span is the x axis's length.
func (c *Chart) span() time.Duration {
	if c.Span > 0 {
		return c.Span
	}
	var s time.Duration
	for _, se := range c.Series {
		for _, p := range se.Points {
			s = max(s, p.At)
		}
	}
	for _, l := range c.Limits {
		for _, p := range l.Steps {
			s = max(s, p.At)
		}
	}
	for _, m := range c.Resets {
		s = max(s, m.At)
	}
	if c.Finish != nil {
		s = max(s, c.Finish.At)
	}
	if s <= 0 {
		return time.Second
	}
	return s
}

// yTop is the highest value drawn (at least 1).
func (c *Chart) yTop() float64 {
	top := 0.0
	for _, s := range c.Series {
		for _, p := range s.Points {
			top = max(top, clean(p.Value))
		}
	}
	for _, l := range c.Limits {
		for _, p := range l.Steps {
			top = max(top, clean(p.Value))
		}
	}
	if top == 0 {
		return 1
	}
	return top
}

type yTick struct {
	v     float64
	label string
}

// yTicks returns 0 and round steps (1, 2, 2.5 or 5 times a power of 10)
// up to the first at or above top: 4 to 8 intervals.
func yTicks(top float64) []yTick {
	raw := top / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	dec := 0
	if step < 1 {
		dec = int(math.Ceil(-math.Log10(step))) + 1
	}
	var out []yTick
	for i := 0; ; i++ {
		v := float64(i) * step
		v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'f', dec, 64), 64) // 0.30000000000000004 → 0.3
		out = append(out, yTick{v: v, label: num(v)})
		if v >= top || i > 100 {
			return out
		}
	}
}

type xTick struct {
	d     time.Duration
	label string
}

// xSteps are the x axis's tick steps.
var xSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// xTicks returns ticks from 0 every round step, at most 10 of them after
// 0, within span.
func xTicks(span time.Duration) []xTick {
	step := xSteps[len(xSteps)-1]
	for _, s := range xSteps {
		if span/s <= 10 {
			step = s
			break
		}
	}
	for span/step > 10 {
		step *= 2
	}
	var out []xTick
	for d := time.Duration(0); ; d += step {
		out = append(out, xTick{d: d, label: Duration(d)})
		if d > span-step { // the next would pass span (or overflow)
			break
		}
	}
	return out
}

// Duration formats d compactly in its largest units, dropping zero parts:
// "0", "250ms", "10s", "1.5s", "1m30s", "6m20s", "2h", "1h30m", "3d".
// Seconds show at most two decimals, and then no smaller unit.
func Duration(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	neg := ""
	if d < 0 {
		neg, d = "-", -d
	}
	if d < time.Second {
		return neg + strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64) + "ms"
	}
	d = d.Round(10 * time.Millisecond)
	var s strings.Builder
	s.WriteString(neg)
	if days := d / (24 * time.Hour); days > 0 {
		fmt.Fprintf(&s, "%dd", days)
		d -= days * 24 * time.Hour
	}
	if h := d / time.Hour; h > 0 {
		fmt.Fprintf(&s, "%dh", h)
		d -= h * time.Hour
	}
	if m := d / time.Minute; m > 0 {
		fmt.Fprintf(&s, "%dm", m)
		d -= m * time.Minute
	}
	if d > 0 {
		s.WriteString(strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s")
	}
	return s.String()
}

// clean is v drawn: 0 for a negative, NaN or infinite value.
func clean(v float64) float64 {
	if v > 0 && !math.IsInf(v, 1) {
		return v
	}
	return 0
}

func clamp(d, span time.Duration) time.Duration { return min(max(d, 0), span) }

// f formats a coordinate with two decimals at most.
func f(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

// num formats a value as briefly as it reads back exactly.
func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// secs formats d in seconds, exactly.
func secs(d time.Duration) string { return num(d.Seconds()) }

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
