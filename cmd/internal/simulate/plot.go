package simulate

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/plot"
)

// Chart returns the report of spec as a chart, one step per row: against
// a vendor with a rate, the calls per second, those answered 200 per
// second and the rate the policy's first adaptive rule had learned at the
// end of each row, under the vendor's limit over time; against a service
// (Phase.Slots), the calls in service on average and the slots the first
// adaptive concurrency rule had learned, under the service's slots.
func (r Report) Chart(spec Spec) *plot.Chart {
	spec.defaults() // as Run completed them
	c := &plot.Chart{
		Title: fmt.Sprintf("simulated %s: %d workers x %d slots against vendor %q", plot.Duration(spec.Duration), spec.Workers, spec.Concurrency, spec.Vendor.String()),
		Subtitle: fmt.Sprintf("%d calls, %d answered 429 (%.2f%%), %d tasks done; one step per %s",
			r.Calls, r.Throttled, 100*r.ThrottledShare(), r.Done, plot.Duration(spec.Interval)),
		XLabel: "simulated time since " + spec.Start.Format(time.DateTime+" MST"),
		Span:   spec.Duration,
	}
	step := func(name string, value func(Row) float64) plot.Series {
		s := plot.Series{Name: name, Step: true}
		for _, row := range r.Rows {
			s.Points = append(s.Points, plot.Point{At: row.From, Value: value(row)})
		}
		if n := len(r.Rows); n > 0 {
			s.Points = append(s.Points, plot.Point{At: r.Rows[n-1].To, Value: value(r.Rows[n-1])})
		}
		return s
	}
	var limit plot.Limit
	if spec.Vendor.service() {
		c.YLabel = "calls at once"
		c.Series = append(c.Series, step("calls in service, on average", func(row Row) float64 { return row.InFlight }))
		if learned(r.Rows, func(row Row) float64 { return float64(row.LearnedSlots) }) {
			c.Series = append(c.Series, step("slots learned (first adaptive concurrency rule)", func(row Row) float64 { return float64(row.LearnedSlots) }))
		}
		limit = plot.Limit{Name: "the service's slots: " + spec.Vendor.String(), Label: "service slots"}
	} else {
		c.YLabel = "calls per second"
		c.Series = append(c.Series,
			step("calls per second", func(row Row) float64 { return float64(row.Calls) / (row.To - row.From).Seconds() }),
			step("answered 200 per second", func(row Row) float64 { return float64(row.Calls-row.Throttled) / (row.To - row.From).Seconds() }))
		if learned(r.Rows, func(row Row) float64 { return row.Learned }) {
			c.Series = append(c.Series, step("rate learned (first adaptive rule), per second", func(row Row) float64 { return row.Learned }))
		}
		limit = plot.Limit{Name: "the vendor's limit: " + spec.Vendor.String(), Label: "vendor limit"}
	}
	var at time.Duration
	for i, p := range spec.Vendor.Phases {
		if at > spec.Duration {
			break
		}
		v := float64(p.Slots)
		if p.Slots == 0 {
			v = p.Limit.Rate / p.Limit.Period.Seconds()
		}
		limit.Steps = append(limit.Steps, plot.Point{At: at, Value: v})
		if i == len(spec.Vendor.Phases)-1 || p.For == 0 {
			break
		}
		at += p.For
	}
	if len(limit.Steps) == 0 {
		return c // no vendor phase: Run refuses such a spec
	}
	if last := limit.Steps[len(limit.Steps)-1].Value; spec.Vendor.service() {
		limit.Label += " " + strconv.FormatFloat(last, 'f', -1, 64)
	} else {
		limit.Label += " " + strconv.FormatFloat(last, 'f', -1, 64) + "/s"
	}
	c.Limits = []plot.Limit{limit}
	return c
}

// Plot writes the report's Chart for spec to w as SVG.
func (r Report) Plot(w io.Writer, spec Spec) error { return r.Chart(spec).WriteSVG(w) }

// learned says whether value is positive in some row.
func learned(rows []Row, value func(Row) float64) bool {
	for _, row := range rows {
		if value(row) > 0 {
			return true
		}
	}
	return false
}
