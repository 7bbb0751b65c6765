// Package calendar computes calendar-window boundaries ("ticks") for quotas
// such as "10,000 calls per day, resetting at midnight America/Los_Angeles".
//
// A window is defined by a standard 5-field cron spec plus an IANA time zone.
// The window containing an instant t runs from the latest tick <= t
// (inclusive) to the earliest tick > t (exclusive), so windows tile time with
// no gaps and no overlaps. The Redis script that enforces a quota decides with
// the Redis server's clock, so Go computes a short list of consecutive ticks
// around an approximate time (Schedule.Ticks) and the script picks the window
// that contains the server's time.
//
// # Which instants are ticks
//
// Specs are parsed with github.com/robfig/cron/v3 (cron.ParseStandard
// syntax, including descriptors such as "@daily"). The set of ticks is
// defined as: every instant, at a whole second, whose wall-clock reading in
// the schedule's zone matches all fields of the spec (with cron's usual rule
// that when both day-of-month and day-of-week are restricted, either may
// match). Next(t) is the earliest tick > t (robfig's Next semantics) and
// Prev(t) is the latest tick <= t, both over that one set, so for every t:
//
//	Prev(t) <= t < Next(t), and no tick lies strictly between them.
//
// For zones whose daylight-saving shifts are whole hours and do not happen at
// midnight (all of the US and Europe, among others) this set is exactly what
// robfig's SpecSchedule.Next produces; the tests check this against robfig
// instant by instant. Next is nevertheless not a thin wrapper around robfig's
// Next: in zones whose shift happens at midnight (e.g. America/Santiago) or
// is 30 minutes (Australia/Lord_Howe) robfig's Next is not self-consistent —
// its answer depends on where the search starts (for example "0 2 * * *" in
// Lord_Howe skips the repeated-hour 02:00 from 01:59 but finds it from
// 01:59:59.5, and "0 1 * * 6" in Santiago fires on the Sunday after the
// midnight shift when searching from Saturday). Windows built on it would not
// tile. So this package uses robfig/cron only to parse the spec into its
// field bit sets, and searches matching wall-clock readings itself, directly
// on the calendar fields, separately within each stretch of constant UTC
// offset (found with time.Time.ZoneBounds), mapping the matches back to
// instants. This is also much faster than robfig's minute-by-minute Next,
// and it has no 5-year search limit (robfig's Next returns the zero time
// after 29 February 2096 for "0 0 29 2 *", as 2100 is not a leap year).
//
// # Daylight-saving days
//
// A tick happens when the local clock shows a matching reading, so:
//
//   - A reading that the clock skips (spring forward) produces no tick that
//     day.
//   - A reading that the clock shows twice (fall back) produces two ticks,
//     one in each offset, exactly as robfig's Next does.
//
// Examples for America/Los_Angeles in 2026 (spring forward Sunday 8 March at
// 02:00 PST -> 03:00 PDT; fall back Sunday 1 November at 02:00 PDT -> 01:00
// PST):
//
//   - "0 0 * * *": midnight exists every day, so there is one tick per day.
//     The window for 8 March is [Mar 8 00:00 PST, Mar 9 00:00 PDT), 23 hours;
//     the window for 1 November is [Nov 1 00:00 PDT, Nov 2 00:00 PST),
//     25 hours. Every other window is 24 hours.
//   - "30 2 * * *": 02:30 does not exist on 8 March, so there is no tick that
//     day: the window [Mar 7 02:30 PST, Mar 9 02:30 PDT) lasts 47 hours. On
//     1 November 02:30 happens once (PST): [Oct 31 02:30 PDT, Nov 1 02:30 PST)
//     lasts 25 hours.
//   - "30 1 * * *": on 8 March 01:30 PST exists; [Mar 8 01:30 PST,
//     Mar 9 01:30 PDT) lasts 23 hours. On 1 November 01:30 happens twice, so
//     there are two ticks, 01:30 PDT (08:30Z) and 01:30 PST (09:30Z): the
//     windows are [Oct 31 01:30 PDT, Nov 1 01:30 PDT) 24 h, then a 1-hour
//     window [Nov 1 01:30 PDT, Nov 1 01:30 PST), then [Nov 1 01:30 PST,
//     Nov 2 01:30 PST) 24 h. A daily quota on such a spec therefore gets an
//     extra one-hour window (with a fresh allowance) once a year; prefer specs
//     whose time is outside the zone's shifted hours, such as midnight in the
//     US and Europe.
//
// # Results
//
// All returned instants are whole seconds in the schedule's location
// (Schedule.Location); compare them with time.Time.Equal or convert them
// (for example with UnixMicro) rather than using ==. Inputs may be in any
// location and may carry monotonic clock readings (those are ignored).
//
// Time zone data comes from the Go runtime (the system zoneinfo database, or
// time/tzdata if the binary embeds it). Workers that share a quota must use
// the same tz database version for ticks around a rule change to agree.
//
// Foundation layer, imported by quotas (calendar windows) and cmd/internal/campaign (cron ticks).
package calendar

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// neverFiresRef is the fixed reference from which Parse checks that a spec
// fires at all.
var neverFiresRef = time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC)

// Schedule is a parsed cron spec in a time zone. Create it with Parse.
//
// A Schedule is immutable and safe for concurrent use by multiple goroutines.
// The zero Schedule (and a nil *Schedule) is not valid: its methods other
// than String panic.
type Schedule struct {
	spec string            // the spec as given (trimmed), for String
	loc  *time.Location    // the schedule's zone; never nil or time.Local
	wall cron.SpecSchedule // the parsed field bit sets; Location is unused
}

// Parse parses a standard 5-field cron spec (minute hour day-of-month month
// day-of-week, the syntax of robfig/cron/v3's cron.ParseStandard, including
// descriptors like "@daily", "@weekly", "@monthly", "@yearly", "@hourly") and
// an IANA zone name ("" means UTC).
//
// Errors name what is wrong, e.g.
//
//	bad cron spec "0 0 * *": expected exactly 5 fields, found 4
//	bad cron spec "61 * * * *": minute field "61": end of range (61) above maximum (59): 61
//	unknown time zone "Mars/Base"
//
// Parse rejects a spec containing "CRON_TZ=" or "TZ=" (the zone is its own
// argument), "@every" (not a calendar schedule), the zone name "Local"
// (machine-dependent), and a spec that never fires (no tick within 5 years of
// 2000-01-01, e.g. "0 0 30 2 *"). It is safe for concurrent use.
func Parse(spec, zone string) (*Schedule, error) {
	spec = strings.TrimSpace(spec)
	bad := func(format string, args ...any) error {
		return fmt.Errorf("bad cron spec %q: %s", spec, fmt.Sprintf(format, args...))
	}
	if spec == "" {
		return nil, bad("empty spec")
	}
	if strings.Contains(spec, "TZ=") {
		return nil, bad("CRON_TZ= and TZ= are not allowed in the spec; pass the time zone separately")
	}

	if strings.HasPrefix(spec, "@every") {
		return nil, bad("@every is not a calendar schedule")
	}
	if !strings.HasPrefix(spec, "@") {
		fields := strings.Fields(spec)
		if len(fields) != 5 {
			return nil, bad("expected exactly 5 fields, found %d", len(fields))
		}
		// Parse each field on its own first, so the error can name the field.
		names := [5]string{"minute", "hour", "day-of-month", "month", "day-of-week"}
		for i, f := range fields {
			probe := [5]string{"*", "*", "*", "*", "*"}
			probe[i] = f
			if _, perr := parseStandard(strings.Join(probe[:], " ")); perr != nil {
				return nil, bad("%s field %q: %v", names[i], f, perr)
			}
		}
	}

	parsed, err := parseStandard(spec)
	if err != nil {
		return nil, bad("%v", err)
	}
	ss, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, bad("not a calendar schedule")
	}
	loc, err := LoadZone(zone)
	if err != nil {
		return nil, err
	}

	s := &Schedule{spec: spec, loc: loc, wall: *ss}
	s.wall.Location = nil
	if s.nextWall(neverFiresRef, neverFiresRef.Year()+4).IsZero() { // 2000 through 2004
		return nil, bad("never fires (no tick within 5 years of %s)", neverFiresRef.Format("2006-01-02"))
	}
	return s, nil
}

// parseStandard calls cron.ParseStandard, turning a panic inside the parser
// into an error.
func parseStandard(spec string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("cron parser panicked: %v", r)
		}
	}()
	return cron.ParseStandard(spec)
}

// LoadZone returns the IANA time zone zone ("" means UTC), as Parse takes
// it, or an error naming what is wrong with it: unknown, or "Local".
func LoadZone(zone string) (*time.Location, error) {
	if zone == "" {
		return time.UTC, nil
	}
	if zone == "Local" {
		return nil, errors.New(`time zone "Local" is not allowed: it depends on the machine; use an IANA name such as "America/Los_Angeles"`)
	}
	loc, err := time.LoadLocation(zone)
	if err != nil || loc == time.Local {
		return nil, fmt.Errorf("unknown time zone %q", zone)
	}
	return loc, nil
}

// MustParse is like Parse but panics on error. It is meant for specs fixed in
// code and tests.
func MustParse(spec, zone string) *Schedule {
	s, err := Parse(spec, zone)
	if err != nil {
		panic("calendar: " + err.Error())
	}
	return s
}

// String returns the spec and zone, e.g. "0 0 * * * in America/Los_Angeles".
// A nil or zero Schedule gives "<invalid calendar.Schedule>".
func (s *Schedule) String() string {
	if s == nil || s.loc == nil {
		return "<invalid calendar.Schedule>"
	}
	return s.spec + " in " + s.loc.String()
}

// Location returns the schedule's time zone (UTC when Parse got ""); all
// instants returned by the Schedule are in it.
func (s *Schedule) Location() *time.Location {
	s.check()
	return s.loc
}

func (s *Schedule) check() {
	if s == nil || s.loc == nil {
		panic("calendar: use of nil or zero Schedule; create it with Parse")
	}
}

// Next returns the earliest tick strictly after t (robfig's Next semantics),
// in the schedule's location.
//
// It returns the zero time only if no tick exists within about 200 years
// after t, which cannot happen for a schedule accepted by Parse unless t is
// near the end of time.Time's range.
func (s *Schedule) Next(t time.Time) time.Time {
	s.check()
	return s.next(t)
}

// maxSegments bounds the constant-offset stretches Next walks through: even
// a spec that fires only on 29 February needs at most 8 years, i.e. about 16
// daylight-saving stretches (plus rule changes).
const maxSegments = 1000

func (s *Schedule) next(t time.Time) time.Time {
	// Ticks are whole seconds: the earliest candidate is the next one.
	cur := t.Truncate(time.Second).Add(time.Second).In(s.loc)
	for range maxSegments {
		// Within [cur, end) the UTC offset is constant, so wall-clock time is
		// a fixed shift of the instant and the search can be done in UTC.
		_, off := cur.Zone()
		shift := time.Duration(off) * time.Second
		end := segmentEnd(cur)
		wall := cur.UTC().Add(shift)
		w := s.nextWall(wall, wall.Year()+wallSearchYears)
		if w.IsZero() {
			return time.Time{}
		}
		x := w.Add(-shift)
		if end.IsZero() || x.Before(end) {
			return x.In(s.loc)
		}
		cur = end
	}
	return time.Time{}
}

// segmentEnd returns the end of the stretch of constant UTC offset that
// contains cur (a whole second), or the zero time if the offset never changes
// again.
//
// It is time.Time.ZoneBounds, except for a Go quirk: past the last explicit
// transition of the tz data (2037), where offsets come from the zone's rule
// string, ZoneBounds in a leap year can end a stretch one day before the end
// of the year and then report that same instant as the end of the stretch
// containing it (end == cur), e.g. Pacific/Auckland at 2040-12-31T00:00:00Z.
// The offset does not change there, so continue with the stretch that
// contains a later instant; if that does not help, advance one second at a
// time (correct, if slow).
func segmentEnd(cur time.Time) time.Time {
	_, end := cur.ZoneBounds()
	if end.IsZero() || end.After(cur) {
		return end
	}
	_, off := cur.Zone()
	probe := cur.Add(24 * time.Hour)
	pstart, pend := probe.ZoneBounds()
	if _, poff := probe.Zone(); poff == off && pstart.After(cur) && !pstart.After(probe) {
		if _, boff := pstart.Add(-time.Second).Zone(); boff == off {
			return pstart
		}
	}
	if pstart.IsZero() || !pstart.After(cur) {
		if pend.IsZero() || pend.After(cur) {
			return pend
		}
	}
	return cur.Add(time.Second)
}

// wallSearchYears bounds how far nextWall looks: far more than the 8-year
// longest gap between ticks of any spec (29 February around 2100).
const wallSearchYears = 200

// nextWall returns the earliest matching wall-clock reading >= w, a whole
// second, both expressed as UTC times, or the zero time if there is none up
// to the end of year maxYear. It works on calendar fields directly (no zone
// is involved), skipping non-matching months, days, hours and minutes.
func (s *Schedule) nextWall(w time.Time, maxYear int) time.Time {
	f := &s.wall
	y, mon, d := w.Date()
	mo := int(mon)
	h, mi, sc := w.Clock()
	for y <= maxYear {
		if f.Month&(1<<uint(mo)) == 0 || d > daysIn(y, mo) {
			mo, d, h, mi, sc = mo+1, 1, 0, 0, 0
			if mo > 12 {
				y, mo = y+1, 1
			}
			continue
		}
		if !dayMatches(f, y, mo, d) {
			d, h, mi, sc = d+1, 0, 0, 0
			continue
		}
		nh, ok := nextBit(f.Hour, h, 23)
		if !ok {
			d, h, mi, sc = d+1, 0, 0, 0
			continue
		}
		if nh != h {
			h, mi, sc = nh, 0, 0
		}
		nmi, ok := nextBit(f.Minute, mi, 59)
		if !ok {
			h, mi, sc = h+1, 0, 0
			continue
		}
		if nmi != mi {
			mi, sc = nmi, 0
		}
		nsc, ok := nextBit(f.Second, sc, 59)
		if !ok {
			mi, sc = mi+1, 0
			continue
		}
		return time.Date(y, time.Month(mo), d, h, mi, nsc, 0, time.UTC)
	}
	return time.Time{}
}

// nextBit returns the smallest v in [from, max] whose bit is set in set.
func nextBit(set uint64, from, max int) (int, bool) {
	if from > max {
		return 0, false
	}
	m := (set >> uint(from)) & (1<<uint(max-from+1) - 1)
	if m == 0 {
		return 0, false
	}
	return from + bits.TrailingZeros64(m), true
}

// starBit marks a field written as "*" (or "?") in robfig's bit sets.
const starBit = 1 << 63

// dayMatches applies cron's day rule exactly as robfig/cron does: if either
// day field was a star, both must match; otherwise either may.
func dayMatches(f *cron.SpecSchedule, y, mo, d int) bool {
	dom := f.Dom&(1<<uint(d)) != 0
	dow := f.Dow&(1<<uint(weekday(y, mo, d))) != 0
	if f.Dom&starBit != 0 || f.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}

// daysIn returns the number of days in month mo of year y (proleptic
// Gregorian calendar, as package time).
func daysIn(y, mo int) int {
	switch mo {
	case 2:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// weekday returns the day of the week (0 = Sunday) of y-mo-d.
func weekday(y, mo, d int) int {
	// Days since 1970-01-01 (a Thursday), after H. Hinnant's days_from_civil.
	if mo <= 2 {
		y--
	}
	era := y / 400
	if y < 0 && y%400 != 0 {
		era--
	}
	yoe := y - era*400
	doy := (153*((mo+9)%12)+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	days := era*146097 + doe - 719468
	return ((days+4)%7 + 7) % 7
}

// lookbacks are the successively wider spans Prev searches before t.
var lookbacks = []time.Duration{
	time.Minute,
	time.Hour,
	26 * time.Hour,
	32 * 24 * time.Hour,
	367 * 24 * time.Hour,
	5 * 366 * 24 * time.Hour,
	30 * 366 * 24 * time.Hour,
	100 * 366 * 24 * time.Hour,
}

// Prev returns the latest tick <= t, in the schedule's location.
//
// It searches backwards with growing look-back (1 minute, 1 hour, 26 hours,
// 32 days, 367 days, 5, 30 and 100 years) for some tick in (t-lookback, t],
// then narrows down to the latest one by bisection, so it costs a few dozen
// Next computations at most, for every-minute and yearly specs alike. It
// returns the zero time only if no tick exists within 100 years before t,
// which cannot happen for a schedule accepted by Parse unless t is near the
// start of time.Time's range.
func (s *Schedule) Prev(t time.Time) time.Time {
	s.check()
	return s.prev(t)
}

func (s *Schedule) prev(t time.Time) time.Time {
	t = t.Round(0) // drop any monotonic reading
	var lo time.Time
	for _, lb := range lookbacks {
		if n := s.next(t.Add(-lb)); !n.IsZero() && !n.After(t) {
			lo = n
			break
		}
	}
	if lo.IsZero() {
		return time.Time{}
	}
	// Invariant: lo is a tick, lo <= hi <= t, and there is no tick in (hi, t].
	hi := t
	for range 200 {
		n := s.next(lo)
		if n.IsZero() || n.After(hi) {
			return lo
		}
		lo = n
		mid := lo.Add(hi.Sub(lo) / 2)
		if m := s.next(mid); !m.IsZero() && !m.After(hi) {
			lo = m
		} else {
			hi = mid
		}
	}
	return lo // unreachable: each round halves [lo, hi] or ends.
}

// Window returns the window [start, end) containing t: start = Prev(t),
// end = Next(t). Both are in the schedule's location.
func (s *Schedule) Window(t time.Time) (start, end time.Time) {
	s.check()
	return s.prev(t), s.next(t)
}

// Ticks returns consecutive ticks b[0] < b[1] < ... < b[k] with
// b[0] = Prev(from) <= from and b[k] > to: the boundaries of every window
// overlapping [from, to]. len(b) >= 2 (if to < from it returns
// [Prev(from), Next(from)]).
//
// If that would need more than max+1 ticks, it returns only the first max+1
// (starting at Prev(from)); callers detect truncation by
// !b[len(b)-1].After(to). A max below 1 is treated as 1. The ticks are in
// the schedule's location.
func (s *Schedule) Ticks(from, to time.Time, max int) []time.Time {
	s.check()
	if max < 1 {
		max = 1
	}
	b := make([]time.Time, 0, min(max+1, 16))
	b = append(b, s.prev(from))
	for len(b) < max+1 {
		n := s.next(b[len(b)-1])
		if n.IsZero() {
			break // only near the end of time.Time's range
		}
		b = append(b, n)
		if n.After(to) {
			break
		}
	}
	return b
}
