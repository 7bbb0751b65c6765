package estimate

import (
	"time"

	"github.com/taskrl/taskrl/internal/calendar"
	"github.com/taskrl/taskrl/quotas"
)

// bins are the lengths a histogram's intervals go through as the campaign
// grows: each divides the next, so counts merge exactly.
var bins = []time.Duration{
	time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// histogram counts the tasks that start in each interval, in at most
// MaxBins intervals however many tasks start: memory bounded by the
// interval count, not the tasks.
type histogram struct {
	level  int // bins[level], then doubling past the last
	bin    time.Duration
	counts []int
}

// add counts n tasks starting at offset at (negative: at 0).
func (h *histogram) add(at time.Duration, n int) {
	if h.bin == 0 {
		h.bin = bins[0]
	}
	at = max(at, 0)
	for at/h.bin >= MaxBins {
		h.coarsen()
	}
	i := int(at / h.bin)
	for len(h.counts) <= i {
		h.counts = append(h.counts, 0)
	}
	h.counts[i] += n
}

// coarsen moves to the next interval length, merging the counts.
func (h *histogram) coarsen() {
	next := 2 * h.bin
	if h.level+1 < len(bins) {
		h.level++
		next = bins[h.level]
	} else {
		h.level = len(bins)
	}
	k := int(next / h.bin)
	merged := make([]int, (len(h.counts)+k-1)/k)
	for i, c := range h.counts {
		merged[i/k] += c
	}
	h.bin, h.counts = next, merged
}

func (h *histogram) timeline() Timeline {
	if h.bin == 0 {
		return Timeline{Bin: bins[0]}
	}
	return Timeline{Bin: h.bin, Counts: h.counts}
}

// rate returns l as a sustained rate per second for one key and its
// window's length (RuleReport.Rate, Window).
func rate(l quotas.Limit, taskDur time.Duration) (float64, time.Duration) {
	switch v := l.(type) {
	case quotas.GCRA:
		return v.Rate / v.Period.Seconds(), 0
	case *quotas.GCRA:
		return rate(*v, taskDur)
	case quotas.Adaptive:
		return v.StartRate() / v.Per.Seconds(), 0
	case *quotas.Adaptive:
		return rate(*v, taskDur)
	case quotas.FixedWindow:
		return float64(v.Limit) / v.Every.Seconds(), v.Every
	case *quotas.FixedWindow:
		return rate(*v, taskDur)
	case quotas.SlidingWindow:
		return float64(v.Limit) / v.Every.Seconds(), v.Every
	case *quotas.SlidingWindow:
		return rate(*v, taskDur)
	}
	if c, ok := concurrency(l); ok && taskDur > 0 {
		return float64(c.Max-c.Reserved) / taskDur.Seconds(), 0
	}
	return 0, 0
}

// resets returns the instants in (from, to] at which l, a fixed or
// calendar window, starts a window, at most MaxResets; nil for another
// limit.
func resets(l quotas.Limit, from, to time.Time) []time.Time {
	var next func(time.Time) time.Time
	switch v := l.(type) {
	case *quotas.FixedWindow:
		return resets(*v, from, to)
	case *quotas.CalendarWindow:
		return resets(*v, from, to)
	case quotas.FixedWindow:
		// Windows are aligned to the Unix epoch, in microseconds as the
		// limiter counts them.
		every := v.Every.Microseconds()
		if every <= 0 {
			return nil
		}
		next = func(t time.Time) time.Time {
			us := t.UnixMicro()
			return time.UnixMicro(us - us%every + every).In(from.Location())
		}
	case quotas.CalendarWindow:
		sched, err := calendar.Parse(v.Cron, v.TZ)
		if err != nil {
			return nil // checked when the policy was parsed
		}
		next = func(t time.Time) time.Time { return sched.Next(t).In(from.Location()) }
	default:
		return nil
	}
	var out []time.Time
	for t := next(from); !t.IsZero() && !t.After(to) && len(out) < MaxResets; t = next(t) {
		out = append(out, t)
	}
	return out
}
