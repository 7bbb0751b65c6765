package simulate

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// Vendor is the remote side's global limit over time: a strict GCRA that
// answers 429 saying when to try again as RetryAfter says (by default in
// whole seconds, rounded up, at least 1, as internal/testkit/fakeapi
// does), or a service that never refuses but slows down above a number of
// calls at once (Phase.Slots). The phases follow each other; the last
// holds until the end.
type Vendor struct {
	Phases     []Phase
	RetryAfter RetryAfter
}

// RetryAfter is how a vendor's 429 says when to try again.
type RetryAfter int

const (
	// WholeSeconds: Retry-After in whole seconds, rounded up, at least 1
	// (most APIs, and fakeapi).
	WholeSeconds RetryAfter = iota
	// Exact: the exact wait, as a fractional Retry-After or a reset
	// header in milliseconds says it.
	Exact
	// NoRetryAfter: nothing; the middleware waits 1 s.
	NoRetryAfter
)

// ParseRetryAfter reads whole, exact or none.
func ParseRetryAfter(s string) (RetryAfter, error) {
	for r, name := range retryAfterNames {
		if s == name {
			return RetryAfter(r), nil
		}
	}
	return 0, fmt.Errorf("retry-after must be whole, exact or none, got %q", s)
}

var retryAfterNames = []string{"whole", "exact", "none"}

// String is the name ParseRetryAfter reads.
func (r RetryAfter) String() string { return retryAfterNames[r] }

// wait is how long the middleware waits after a 429 whose exact wait is
// exact.
func (r RetryAfter) wait(exact time.Duration) time.Duration {
	switch r {
	case Exact:
		if exact > 0 {
			return exact
		}
	case WholeSeconds:
		return time.Duration(math.Ceil(max(exact.Seconds(), 1))) * time.Second
	}
	return time.Second
}

// Phase is the vendor's limit for a while.
type Phase struct {
	// Limit is the vendor's rate; unset (zero) in a phase of Slots.
	Limit gcra.Limit
	// Slots, when set, makes the vendor a service that answers every call
	// and slows down above Slots calls at once: with c calls in service, a
	// call takes Spec.Latency x (1 + 4 (c - Slots) / Slots) when c is
	// above Slots (a quarter more calls, twice as long), each call
	// 10 % faster or slower at random.
	Slots int
	// For is how long the phase lasts; 0 in the last phase: until the end.
	For time.Duration
}

// At returns the limit in force at offset d from the start and the index
// of its phase.
func (v Vendor) At(d time.Duration) (gcra.Limit, int) {
	for i, p := range v.Phases {
		if p.For == 0 || d < p.For || i == len(v.Phases)-1 {
			return p.Limit, i
		}
		d -= p.For
	}
	return gcra.Limit{}, -1
}

// String formats v as ParseVendor reads it.
func (v Vendor) String() string {
	var parts []string
	for _, p := range v.Phases {
		if p.Slots > 0 {
			s := strconv.Itoa(p.Slots) + " at once"
			if p.For > 0 {
				s += " for " + p.For.String()
			}
			parts = append(parts, s)
			continue
		}
		s := rateString(p.Limit)
		if p.Limit.Burst > 1 {
			s += " burst " + strconv.Itoa(p.Limit.Burst)
		}
		if p.For > 0 {
			s += " for " + p.For.String()
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

func rateString(l gcra.Limit) string {
	per := l.Period.String()
	switch l.Period {
	case time.Second:
		per = "s"
	case time.Minute:
		per = "m"
	case time.Hour:
		per = "h"
	}
	return strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/" + per
}

// ParseVendor reads a vendor spec: phases separated by commas, each
// "RATE/PER [burst B] [for DURATION]", e.g. "20/s for 1m, 5/s for 1m,
// 20/s" (PER is s, m, h or a Go duration such as 10s; burst defaults to 1;
// every phase but the last needs a duration), or "N at once [for
// DURATION]", a service that slows down above N calls at once
// (Phase.Slots); the phases of one vendor are all rates or all services.
func ParseVendor(spec string) (Vendor, error) {
	var v Vendor
	for i, raw := range strings.Split(spec, ",") {
		bad := func(format string, args ...any) (Vendor, error) {
			return Vendor{}, fmt.Errorf("vendor phase %d (%q): %s", i+1, strings.TrimSpace(raw), fmt.Sprintf(format, args...))
		}
		f := strings.Fields(raw)
		if len(f) == 0 {
			return bad("empty")
		}
		if len(f) >= 3 && f[1] == "at" && f[2] == "once" {
			n, err := strconv.Atoi(f[0])
			if err != nil || n < 1 {
				return bad("bad number of calls at once %q", f[0])
			}
			p := Phase{Slots: n}
			switch {
			case len(f) == 3:
			case len(f) == 5 && f[3] == "for":
				if p.For, err = time.ParseDuration(f[4]); err != nil || p.For <= 0 {
					return bad("bad duration %q", f[4])
				}
			default:
				return bad("expected N at once [for DURATION]")
			}
			v.Phases = append(v.Phases, p)
			continue
		}
		rate, per, ok := strings.Cut(f[0], "/")
		if !ok {
			return bad("the rate must be RATE/PER, e.g. 20/s, or N at once")
		}
		r, err := strconv.ParseFloat(rate, 64)
		if err != nil {
			return bad("bad rate %q", rate)
		}
		p := Phase{Limit: gcra.Limit{Rate: r, Burst: 1}}
		switch per {
		case "s":
			p.Limit.Period = time.Second
		case "m":
			p.Limit.Period = time.Minute
		case "h":
			p.Limit.Period = time.Hour
		default:
			if p.Limit.Period, err = time.ParseDuration(per); err != nil {
				return bad("bad period %q (s, m, h or a duration such as 10s)", per)
			}
		}
		for f = f[1:]; len(f) > 0; f = f[2:] {
			if len(f) < 2 {
				return bad("%q needs a value", f[0])
			}
			switch f[0] {
			case "burst":
				if p.Limit.Burst, err = strconv.Atoi(f[1]); err != nil {
					return bad("bad burst %q", f[1])
				}
			case "for":
				if p.For, err = time.ParseDuration(f[1]); err != nil || p.For <= 0 {
					return bad("bad duration %q", f[1])
				}
			default:
				return bad("unknown word %q; expected burst or for", f[0])
			}
		}
		if err := p.Limit.Validate(); err != nil {
			return bad("%v", err)
		}
		v.Phases = append(v.Phases, p)
	}
	for i, p := range v.Phases[:len(v.Phases)-1] {
		if p.For == 0 {
			return Vendor{}, fmt.Errorf("vendor phase %d: needs a duration (for ...): only the last phase lasts until the end", i+1)
		}
	}
	for i, p := range v.Phases {
		if (p.Slots > 0) != (v.Phases[0].Slots > 0) {
			return Vendor{}, fmt.Errorf("vendor phase %d: a vendor is rates (RATE/PER) or a service (N at once), not both", i+1)
		}
	}
	return v, nil
}

// service reports whether v has a phase of Slots.
func (v Vendor) service() bool {
	for _, p := range v.Phases {
		if p.Slots > 0 {
			return true
		}
	}
	return false
}
