package estimate

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/plot"
)

// Chart returns the report's schedule as a chart: the tasks started per
// second, per Timeline interval, from Start; each rule's limit as the most
// its keys admit per second together (RuleReport.Rate times Keys; none
// for a calendar window, or a window longer than the chart); the window
// resets (RuleReport.Resets); and the finish, when the last task starts
// (Duration).
func (r *Report) Chart() *plot.Chart {
	tl := r.Timeline
	c := &plot.Chart{
		Title:    fmt.Sprintf("dry run: %d tasks of type %q on queue %q", r.Tasks, r.Type, r.Queue),
		Subtitle: fmt.Sprintf("estimated duration %s; binding rule: %s", FormatDuration(r.Duration), bindingName(r.Binding)),
		XLabel:   "time since the start, " + r.Start.Format(time.DateTime+" MST"),
		YLabel:   "tasks started per second",
		Finish:   &plot.Mark{At: r.Duration, Label: "finish " + plot.Duration(r.Duration)},
	}
	if len(r.Ahead) > 0 {
		c.XLabel += " (limits as Redis had them)"
	}
	s := plot.Series{Name: "tasks started per second (per " + plot.Duration(tl.Bin) + ")", Step: true}
	for i, n := range tl.Counts {
		s.Points = append(s.Points, plot.Point{At: time.Duration(i) * tl.Bin, Value: float64(n) / tl.Bin.Seconds()})
	}
	if len(tl.Counts) > 0 {
		s.Points = append(s.Points, plot.Point{At: time.Duration(len(tl.Counts)) * tl.Bin, Value: s.Points[len(s.Points)-1].Value})
	}
	c.Series = []plot.Series{s}
	c.Span = max(time.Duration(len(tl.Counts))*tl.Bin, r.Duration, time.Second)
	for _, rr := range r.Rules {
		for _, t := range rr.Resets {
			c.Resets = append(c.Resets, plot.Mark{At: t.Sub(r.Start), Label: rr.Name})
		}
		if rr.Rate <= 0 || rr.Keys == 0 || rr.Window > c.Span {
			continue
		}
		total := rr.Rate * float64(rr.Keys)
		label := rr.Name + " " + perSecond(total)
		name := rr.Name + ": " + rr.Limit + ", at most " + perSecond(total)
		if rr.Key != "" {
			label = fmt.Sprintf("%s %s × %d keys = %s", rr.Name, perSecond(rr.Rate), rr.Keys, perSecond(total))
			name += fmt.Sprintf(" for its %d keys", rr.Keys)
		}
		c.Limits = append(c.Limits, plot.Limit{Name: name, Label: label, Steps: []plot.Point{{Value: total}}})
	}
	return c
}

// Plot writes the report's Chart to w as SVG.
func (r *Report) Plot(w io.Writer) error { return r.Chart().WriteSVG(w) }

// perSecond formats a rate to 4 significant digits: "18/s", "0.2778/s".
func perSecond(v float64) string {
	if v > 0 {
		p := math.Pow(10, 3-math.Floor(math.Log10(v)))
		v = math.Round(v*p) / p
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + "/s"
}

func bindingName(b string) string {
	if b == "" {
		return "none (no task waits)"
	}
	return b
}
