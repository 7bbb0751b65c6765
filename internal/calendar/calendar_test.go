package calendar

import (
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // tests must not depend on the machine's zoneinfo

	"github.com/robfig/cron/v3"
)

func mustLoc(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustParse(t testing.TB, spec, zone string) *Schedule {
	t.Helper()
	s, err := Parse(spec, zone)
	if err != nil {
		t.Fatalf("Parse(%q, %q): %v", spec, zone, err)
	}
	return s
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

// local builds a wall-clock time in zone; only for readings that exist once.
func local(t testing.TB, zone string, y int, mo time.Month, d, h, mi int) time.Time {
	return time.Date(y, mo, d, h, mi, 0, 0, mustLoc(t, zone))
}

// TestWindowTable checks windows against instants computed by hand.
// 2026 DST dates: US spring forward Sun 8 Mar, fall back Sun 1 Nov; EU
// (last Sundays) 29 Mar and 25 Oct. PST = UTC-8, PDT = UTC-7, GMT/BST = 0/+1,
// CET/CEST = +1/+2.
func TestWindowTable(t *testing.T) {
	const (
		la     = "America/Los_Angeles"
		london = "Europe/London"
		berlin = "Europe/Berlin"
	)
	tests := []struct {
		name       string
		spec, zone string
		at         time.Time
		start, end string // RFC 3339, UTC
		dur        time.Duration
	}{
		{"LA midnight ordinary day", "0 0 * * *", la, local(t, la, 2026, 6, 15, 12, 0),
			"2026-06-15T07:00:00Z", "2026-06-16T07:00:00Z", 24 * time.Hour},
		{"LA midnight spring forward", "0 0 * * *", la, local(t, la, 2026, 3, 8, 12, 0),
			"2026-03-08T08:00:00Z", "2026-03-09T07:00:00Z", 23 * time.Hour},
		{"LA midnight fall back", "0 0 * * *", la, local(t, la, 2026, 11, 1, 12, 0),
			"2026-11-01T07:00:00Z", "2026-11-02T08:00:00Z", 25 * time.Hour},
		{"LA @daily fall back", "@daily", la, local(t, la, 2026, 11, 1, 12, 0),
			"2026-11-01T07:00:00Z", "2026-11-02T08:00:00Z", 25 * time.Hour},
		{"LA midnight at start instant", "0 0 * * *", la, utc("2026-03-09T07:00:00Z"),
			"2026-03-09T07:00:00Z", "2026-03-10T07:00:00Z", 24 * time.Hour},
		{"LA midnight just before end", "0 0 * * *", la, utc("2026-03-09T06:59:59.999999999Z"),
			"2026-03-08T08:00:00Z", "2026-03-09T07:00:00Z", 23 * time.Hour},

		{"London spring forward", "0 0 * * *", london, local(t, london, 2026, 3, 29, 12, 0),
			"2026-03-29T00:00:00Z", "2026-03-29T23:00:00Z", 23 * time.Hour},
		{"London fall back", "0 0 * * *", london, local(t, london, 2026, 10, 25, 12, 0),
			"2026-10-24T23:00:00Z", "2026-10-26T00:00:00Z", 25 * time.Hour},

		{"monthly leap February", "0 0 1 * *", "", utc("2028-02-15T00:00:00Z"),
			"2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{"monthly common February", "0 0 1 * *", "", utc("2027-02-15T00:00:00Z"),
			"2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{"monthly January end", "0 0 1 * *", "UTC", utc("2027-01-31T23:59:59Z"),
			"2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", 31 * 24 * time.Hour},

		{"yearly last microsecond", "0 0 1 1 *", "", utc("2026-12-31T23:59:59.999999Z"),
			"2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", 365 * 24 * time.Hour},
		{"@yearly last microsecond", "@yearly", "", utc("2026-12-31T23:59:59.999999Z"),
			"2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", 365 * 24 * time.Hour},
		{"yearly start inclusive", "0 0 1 1 *", "", utc("2027-01-01T00:00:00Z"),
			"2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", 365 * 24 * time.Hour},
		{"@annually start inclusive", "@annually", "", utc("2027-01-01T00:00:00Z"),
			"2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z", 365 * 24 * time.Hour},
		{"yearly leap year", "@yearly", "", utc("2028-07-01T00:00:00Z"),
			"2028-01-01T00:00:00Z", "2029-01-01T00:00:00Z", 366 * 24 * time.Hour},

		// 2026-06-08, 2026-06-15, 2026-03-23, 2026-03-30, 2026-10-19 and
		// 2026-10-26 are Mondays.
		{"Berlin weekly ordinary", "0 9 * * 1", berlin, local(t, berlin, 2026, 6, 10, 12, 0),
			"2026-06-08T07:00:00Z", "2026-06-15T07:00:00Z", 168 * time.Hour},
		{"Berlin weekly at tick", "0 9 * * 1", berlin, utc("2026-06-15T07:00:00Z"),
			"2026-06-15T07:00:00Z", "2026-06-22T07:00:00Z", 168 * time.Hour},
		{"Berlin weekly spring forward", "0 9 * * 1", berlin, local(t, berlin, 2026, 3, 29, 12, 0),
			"2026-03-23T08:00:00Z", "2026-03-30T07:00:00Z", 167 * time.Hour},
		{"Berlin weekly fall back", "0 9 * * mon", berlin, local(t, berlin, 2026, 10, 25, 12, 0),
			"2026-10-19T07:00:00Z", "2026-10-26T08:00:00Z", 169 * time.Hour},

		// 02:30 is skipped on 8 March and happens once (PST) on 1 November.
		{"LA 02:30 skipped", "30 2 * * *", la, local(t, la, 2026, 3, 8, 12, 0),
			"2026-03-07T10:30:00Z", "2026-03-09T09:30:00Z", 47 * time.Hour},
		{"LA 02:30 fall back before", "30 2 * * *", la, utc("2026-11-01T09:00:00Z"),
			"2026-10-31T09:30:00Z", "2026-11-01T10:30:00Z", 25 * time.Hour},
		{"LA 02:30 fall back after", "30 2 * * *", la, local(t, la, 2026, 11, 1, 12, 0),
			"2026-11-01T10:30:00Z", "2026-11-02T10:30:00Z", 24 * time.Hour},
		// 01:30 happens once on 8 March and twice on 1 November.
		{"LA 01:30 spring forward", "30 1 * * *", la, utc("2026-03-08T20:00:00Z"),
			"2026-03-08T09:30:00Z", "2026-03-09T08:30:00Z", 23 * time.Hour},
		{"LA 01:30 fall back first", "30 1 * * *", la, utc("2026-11-01T08:00:00Z"),
			"2026-10-31T08:30:00Z", "2026-11-01T08:30:00Z", 24 * time.Hour},
		{"LA 01:30 fall back doubled", "30 1 * * *", la, utc("2026-11-01T09:00:00Z"),
			"2026-11-01T08:30:00Z", "2026-11-01T09:30:00Z", time.Hour},
		{"LA 01:30 fall back after", "30 1 * * *", la, utc("2026-11-01T20:00:00Z"),
			"2026-11-01T09:30:00Z", "2026-11-02T09:30:00Z", 24 * time.Hour},
		{"LA hourly fall back", "0 * * * *", la, utc("2026-11-01T09:10:00Z"),
			"2026-11-01T09:00:00Z", "2026-11-01T10:00:00Z", time.Hour},
		{"LA hourly spring forward", "@hourly", la, utc("2026-03-08T09:59:00Z"),
			"2026-03-08T09:00:00Z", "2026-03-08T10:00:00Z", time.Hour},

		// Zones where robfig's own Next is not self-consistent.
		// Lord Howe 2026-04-05: 02:00 +11 -> 01:30 +10:30 (at 15:00Z on 4 Apr).
		{"Lord Howe 02:00 after half-hour fall back", "0 2 * * *", "Australia/Lord_Howe", utc("2026-04-04T15:29:00Z"),
			"2026-04-03T15:00:00Z", "2026-04-04T15:30:00Z", 24*time.Hour + 30*time.Minute},
		// Santiago 2026-09-06 (Sunday): 00:00 -04 -> 01:00 -03 (at 04:00Z).
		{"Santiago Saturday 01:00 across midnight shift", "0 1 * * 6", "America/Santiago", utc("2026-09-06T15:00:00Z"),
			"2026-09-05T05:00:00Z", "2026-09-12T04:00:00Z", 167 * time.Hour},
		{"Santiago midnight skipped", "0 0 * * *", "America/Santiago", utc("2026-09-06T15:00:00Z"),
			"2026-09-05T04:00:00Z", "2026-09-07T03:00:00Z", 47 * time.Hour},

		// Past the tz table (2037) Go's ZoneBounds misbehaves at the end of
		// leap years in southern-hemisphere zones (see segmentEnd).
		// NZDT = UTC+13.
		{"Auckland yearly at Go ZoneBounds quirk", "@yearly", "Pacific/Auckland", utc("2040-12-31T00:00:00Z"),
			"2039-12-31T11:00:00Z", "2040-12-31T11:00:00Z", 366 * 24 * time.Hour},
		{"Auckland noon at Go ZoneBounds quirk", "0 12 * * *", "Pacific/Auckland", utc("2040-12-31T00:00:00Z"),
			"2040-12-30T23:00:00Z", "2040-12-31T23:00:00Z", 24 * time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, tc.spec, tc.zone)
			start, end := s.Window(tc.at)
			if !start.Equal(utc(tc.start)) || !end.Equal(utc(tc.end)) {
				t.Fatalf("Window(%v) = [%v, %v), want [%s, %s)", tc.at.UTC(), start.UTC(), end.UTC(), tc.start, tc.end)
			}
			if d := end.Sub(start); d != tc.dur {
				t.Errorf("window lasts %v, want %v", d, tc.dur)
			}
			if start.Location() != s.Location() || end.Location() != s.Location() {
				t.Errorf("locations %v, %v; want %v", start.Location(), end.Location(), s.Location())
			}
			if p, n := s.Prev(tc.at), s.Next(tc.at); !p.Equal(start) || !n.Equal(end) {
				t.Errorf("Prev/Next = %v, %v; Window = %v, %v", p, n, start, end)
			}
		})
	}
}

// checkInvariants verifies the tiling properties at t.
func checkInvariants(t testing.TB, s *Schedule, at time.Time) {
	t.Helper()
	p, n := s.Prev(at), s.Next(at)
	if p.IsZero() || n.IsZero() {
		t.Fatalf("%v at %v: Prev = %v, Next = %v", s, at, p, n)
	}
	if p.After(at) || !n.After(at) {
		t.Fatalf("%v at %v: want Prev <= t < Next, got %v, %v", s, at, p, n)
	}
	if got := s.Next(p.Add(-time.Microsecond)); !got.Equal(p) {
		t.Fatalf("%v at %v: Prev = %v is not a tick: Next(Prev-1µs) = %v", s, at, p, got)
	}
	if got := s.Next(p); !got.Equal(n) {
		t.Fatalf("%v at %v: tick between Prev = %v and Next = %v: Next(Prev) = %v", s, at, p, n, got)
	}
	if got := s.Prev(n); !got.Equal(n) {
		t.Fatalf("%v at %v: Prev(Next) = %v, want %v", s, at, got, n)
	}
}

var propertySpecs = []struct{ spec, zone string }{
	{"*/15 * * * *", "America/Los_Angeles"},
	{"0 */6 * * *", "Europe/London"},
	{"30 2 * * *", "America/Los_Angeles"},
	{"30 1 * * *", "America/Los_Angeles"},
	{"0 0 29 2 *", ""},
	{"0 0 29 2 *", "Asia/Tokyo"},
	{"0 0 * * *", "America/Los_Angeles"},
	{"0 9 * * 1", "Europe/Berlin"},
	{"@monthly", "Australia/Sydney"},
	{"0 0 1 1 *", "Pacific/Auckland"},
	{"* * * * *", "Asia/Kolkata"},
	{"0 2 * * *", "Australia/Lord_Howe"},
	{"0 1 * * 6", "America/Santiago"},
	{"0 0 * * *", "America/Havana"},
	{"5 4 31 * *", "Pacific/Chatham"},
}

// TestProperties checks Prev(t) <= t < Next(t), that Prev(t) is a tick and
// that no tick lies between Prev(t) and Next(t), for random instants.
func TestProperties(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 1000
	}
	lo, hi := utc("2020-01-01T00:00:00Z").UnixNano(), utc("2035-12-31T23:59:59Z").UnixNano()
	for i, ps := range propertySpecs {
		s := mustParse(t, ps.spec, ps.zone)
		r := rand.New(rand.NewPCG(1, uint64(i)))
		for range n {
			at := time.Unix(0, lo+r.Int64N(hi-lo))
			switch r.IntN(4) { // also hit exact ticks and sub-second neighbours
			case 0:
				at = s.Prev(at)
			case 1:
				at = s.Prev(at).Add(-time.Nanosecond)
			}
			checkInvariants(t, s, at)
		}
	}
}

// matches is an oracle for the tick set that does not use robfig's Next: the
// wall-clock reading of x in the zone matches every field.
func matches(s *Schedule, x time.Time) bool {
	l := x.In(s.loc)
	w := &s.wall
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	if x.Nanosecond() != 0 || !bit(w.Second, l.Second()) || !bit(w.Minute, l.Minute()) ||
		!bit(w.Hour, l.Hour()) || !bit(w.Month, int(l.Month())) {
		return false
	}
	const star = 1 << 63
	dom, dow := bit(w.Dom, l.Day()), bit(w.Dow, int(l.Weekday()))
	if w.Dom&star != 0 || w.Dow&star != 0 {
		return dom && dow
	}
	return dom || dow
}

// TestOracleAroundTransitions compares Next and Prev with a minute-by-minute
// scan of the oracle around every UTC-offset change in 2024-2026 and
// 2040-2041 (past the tz table), in zones with ordinary, midnight and
// half-hour shifts.
func TestOracleAroundTransitions(t *testing.T) {
	zones := []string{"America/Los_Angeles", "Europe/London", "America/Santiago",
		"Australia/Lord_Howe", "Pacific/Auckland", "America/Havana", "Pacific/Chatham", "Asia/Beirut", "America/Asuncion"}
	specs := []string{"0 0 * * *", "30 1 * * *", "0 2 * * *", "*/15 * * * *", "0 1 * * 6", "45 1 * * *", "0 23 * * *", "59 * * * 0"}
	step := 3 * time.Minute
	if testing.Short() || raceEnabled {
		step = 17 * time.Minute
	}
	for _, zone := range zones {
		loc := mustLoc(t, zone)
		var transitions []time.Time
		for _, years := range [][2]int{{2024, 2027}, {2040, 2042}} {
			for x := time.Date(years[0], 1, 1, 0, 0, 0, 0, loc); x.Year() < years[1]; {
				end := segmentEnd(x)
				if end.IsZero() {
					break
				}
				if _, o1 := x.Zone(); true {
					if _, o2 := end.Zone(); o1 != o2 {
						transitions = append(transitions, end)
					}
				}
				x = end
			}
		}
		if len(transitions) == 0 {
			t.Fatalf("%s: no transitions found", zone)
		}
		for _, spec := range specs {
			s := mustParse(t, spec, zone)
			for _, tr := range transitions {
				from, to := tr.Add(-50*time.Hour).Truncate(time.Minute), tr.Add(50*time.Hour)
				var ticks []time.Time
				for x := from; x.Before(to); x = x.Add(time.Minute) {
					if matches(s, x) {
						ticks = append(ticks, x)
					}
				}
				for x := from.Add(25 * time.Hour); x.Before(to.Add(-25 * time.Hour)); x = x.Add(step) {
					for _, at := range []time.Time{x, x.Add(-time.Nanosecond), x.Add(29 * time.Second)} {
						i := sort.Search(len(ticks), func(i int) bool { return ticks[i].After(at) })
						if i < len(ticks) {
							if got := s.Next(at); !got.Equal(ticks[i]) {
								t.Fatalf("%v: Next(%v) = %v, oracle %v", s, at.In(loc), got.In(loc), ticks[i].In(loc))
							}
						}
						if i > 0 && at.Sub(ticks[i-1]) < 24*time.Hour {
							if got := s.Prev(at); !got.Equal(ticks[i-1]) {
								t.Fatalf("%v: Prev(%v) = %v, oracle %v", s, at.In(loc), got.In(loc), ticks[i-1].In(loc))
							}
						}
					}
				}
			}
		}
	}
}

// TestAgreesWithRobfig checks that, in zones with whole-hour shifts away
// from midnight, Next is exactly robfig's SpecSchedule.Next in that zone.
func TestAgreesWithRobfig(t *testing.T) {
	zones := []string{"America/Los_Angeles", "America/New_York", "Europe/London", "Europe/Berlin", "UTC", "Australia/Sydney"}
	specs := []string{"0 0 * * *", "30 2 * * *", "30 1 * * *", "*/15 * * * *", "0 */6 * * *",
		"0 9 * * 1", "@monthly", "0 0 29 2 *", "0 1-3 * * 0", "15 2 1,15 * 1"}
	r := rand.New(rand.NewPCG(7, 7))
	for _, zone := range zones {
		loc := mustLoc(t, zone)
		for _, spec := range specs {
			s := mustParse(t, spec, zone)
			rs, err := cron.ParseStandard(spec)
			if err != nil {
				t.Fatal(err)
			}
			robfig := rs.(*cron.SpecSchedule)
			robfig.Location = loc
			var instants []time.Time
			for range 300 {
				instants = append(instants, time.Unix(utc("2020-01-01T00:00:00Z").Unix()+r.Int64N(16*365*86400), r.Int64N(1e9)))
			}
			// Every 10 minutes through both 2026 transition days.
			for x := time.Date(2026, 1, 1, 0, 0, 0, 0, loc); x.Year() == 2026; {
				_, end := x.ZoneBounds()
				if end.IsZero() {
					break
				}
				for y := end.Add(-30 * time.Hour); y.Before(end.Add(30 * time.Hour)); y = y.Add(10 * time.Minute) {
					instants = append(instants, y, y.Add(-time.Nanosecond))
				}
				x = end
			}
			for _, at := range instants {
				want := robfig.Next(at)
				if want.IsZero() {
					t.Fatalf("robfig found nothing after %v", at)
				}
				if got := s.Next(at); !got.Equal(want) {
					t.Fatalf("%v: Next(%v) = %v, robfig %v", s, at.In(loc), got.In(loc), want.In(loc))
				}
			}
		}
	}
}

// randomSpec builds a random 5-field spec.
func randomSpec(r *rand.Rand) string {
	field := func(lo, hi int) string {
		n := func() int { return lo + r.IntN(hi-lo+1) }
		switch r.IntN(7) {
		case 0, 1:
			return "*"
		case 2:
			return strconv.Itoa(n())
		case 3:
			a, b := n(), n()
			return strconv.Itoa(min(a, b)) + "-" + strconv.Itoa(max(a, b))
		case 4:
			return "*/" + strconv.Itoa(1+r.IntN(hi-lo+1))
		case 5:
			return strconv.Itoa(n()) + "/" + strconv.Itoa(1+r.IntN(7))
		default:
			return strconv.Itoa(n()) + "," + strconv.Itoa(n()) + "," + strconv.Itoa(n())
		}
	}
	return strings.Join([]string{field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 6)}, " ")
}

// TestWallSearchAgreesWithRobfig compares the field-based search with
// robfig's Next for random specs in zones with a fixed offset, where
// robfig's Next is exact.
func TestWallSearchAgreesWithRobfig(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	specs := 0
	for specs < 400 {
		spec := randomSpec(r)
		zone := []string{"UTC", "Asia/Kolkata", "Asia/Kathmandu", "Etc/GMT+5"}[r.IntN(4)]
		s, err := Parse(spec, zone)
		if err != nil {
			continue
		}
		specs++
		rs, err := cron.ParseStandard(spec)
		if err != nil {
			t.Fatal(err)
		}
		robfig := rs.(*cron.SpecSchedule)
		robfig.Location = s.Location()
		for range 50 {
			at := time.Unix(utc("2000-01-01T00:00:00Z").Unix()+r.Int64N(30*365*86400), r.Int64N(2)*r.Int64N(1e9))
			want := robfig.Next(at)
			if want.IsZero() {
				continue // beyond robfig's 5-year limit
			}
			if got := s.Next(at); !got.Equal(want) {
				t.Fatalf("%v: Next(%v) = %v, robfig %v", s, at, got, want)
			}
			checkInvariants(t, s, at)
		}
	}
}

func TestNextBeyondRobfigYearLimit(t *testing.T) {
	// 2100 is not a leap year: after 29 Feb 2096 the next is 29 Feb 2104,
	// beyond robfig's 5-year search limit.
	s := mustParse(t, "0 0 29 2 *", "")
	start, end := s.Window(utc("2100-06-01T00:00:00Z"))
	if !start.Equal(utc("2096-02-29T00:00:00Z")) || !end.Equal(utc("2104-02-29T00:00:00Z")) {
		t.Fatalf("Window = [%v, %v)", start, end)
	}
	checkInvariants(t, s, utc("2100-06-01T00:00:00Z"))
}

func TestTicks(t *testing.T) {
	la := mustParse(t, "0 0 * * *", "America/Los_Angeles")
	from, to := utc("2026-03-06T20:00:00Z"), utc("2026-03-10T20:00:00Z")
	b := la.Ticks(from, to, 10)
	want := []string{"2026-03-06T08:00:00Z", "2026-03-07T08:00:00Z", "2026-03-08T08:00:00Z",
		"2026-03-09T07:00:00Z", "2026-03-10T07:00:00Z", "2026-03-11T07:00:00Z"}
	if len(b) != len(want) {
		t.Fatalf("Ticks = %v, want %v", b, want)
	}
	for i := range want {
		if !b[i].Equal(utc(want[i])) || b[i].Location() != la.Location() {
			t.Fatalf("Ticks[%d] = %v, want %s", i, b[i], want[i])
		}
	}

	// Truncation: 5 windows needed, only 3 allowed.
	b = la.Ticks(from, to, 3)
	if len(b) != 4 || !b[0].Equal(utc(want[0])) || !b[3].Equal(utc(want[3])) || b[3].After(to) {
		t.Fatalf("truncated Ticks = %v", b)
	}

	// Point range, range inside one window, reversed range, max < 1.
	for _, tc := range []struct {
		name     string
		from, to time.Time
		max      int
	}{
		{"point", from, from, 5},
		{"inside one window", from, from.Add(time.Hour), 5},
		{"to before from", to, from, 5},
		{"max zero", from, to, 0},
		{"max negative", from, to, -3},
		{"at tick", utc(want[1]), utc(want[1]), 1},
	} {
		b := la.Ticks(tc.from, tc.to, tc.max)
		if len(b) != 2 {
			t.Errorf("%s: Ticks = %v, want 2 ticks", tc.name, b)
			continue
		}
		if ws, we := la.Window(tc.from); !b[0].Equal(ws) || !b[1].Equal(we) {
			t.Errorf("%s: Ticks = %v, want Window(from) = [%v, %v)", tc.name, b, ws, we)
		}
	}

	// Random coverage checks.
	r := rand.New(rand.NewPCG(3, 4))
	for _, ps := range propertySpecs {
		s := mustParse(t, ps.spec, ps.zone)
		for range 200 {
			from := time.Unix(utc("2020-01-01T00:00:00Z").Unix()+r.Int64N(15*365*86400), r.Int64N(1e9))
			to := from.Add(time.Duration(r.Int64N(int64(90 * 24 * time.Hour))))
			max := 1 + r.IntN(40)
			b := s.Ticks(from, to, max)
			if len(b) < 2 || len(b) > max+1 {
				t.Fatalf("%v: Ticks(%v, %v, %d) has %d ticks", s, from, to, max, len(b))
			}
			if !b[0].Equal(s.Prev(from)) {
				t.Fatalf("%v: b[0] = %v, want Prev(from) = %v", s, b[0], s.Prev(from))
			}
			for i := 1; i < len(b); i++ {
				if !b[i].Equal(s.Next(b[i-1])) {
					t.Fatalf("%v: b[%d] = %v is not Next(b[%d]) = %v", s, i, b[i], i-1, s.Next(b[i-1]))
				}
			}
			last := b[len(b)-1]
			if len(b) < max+1 && !last.After(to) {
				t.Fatalf("%v: stopped early at %v <= to %v", s, last, to)
			}
			if b[len(b)-2].After(to) {
				t.Fatalf("%v: more ticks than needed: %v", s, b)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		spec, zone, want string
	}{
		{"0 0 * *", "", `bad cron spec "0 0 * *": expected exactly 5 fields, found 4`},
		{"0 0 * * * *", "", `bad cron spec "0 0 * * * *": expected exactly 5 fields, found 6`},
		{"61 * * * *", "", `bad cron spec "61 * * * *": minute field "61": end of range (61) above maximum (59): 61`},
		{"0 24 * * *", "", `bad cron spec "0 24 * * *": hour field "24": end of range (24) above maximum (23): 24`},
		{"0 0 0 * *", "", `bad cron spec "0 0 0 * *": day-of-month field "0": beginning of range (0) below minimum (1): 0`},
		{"0 0 * 13 *", "", `bad cron spec "0 0 * 13 *": month field "13": end of range (13) above maximum (12): 13`},
		{"0 0 * * 7", "", `bad cron spec "0 0 * * 7": day-of-week field "7": end of range (7) above maximum (6): 7`},
		{"x 0 * * *", "", `bad cron spec "x 0 * * *": minute field "x": failed to parse int from x: strconv.Atoi: parsing "x": invalid syntax`},
		{"", "", `bad cron spec "": empty spec`},
		{"   ", "UTC", `bad cron spec "": empty spec`},
		{"CRON_TZ=America/New_York 0 0 * * *", "", `bad cron spec "CRON_TZ=America/New_York 0 0 * * *": CRON_TZ= and TZ= are not allowed in the spec; pass the time zone separately`},
		{"TZ=UTC 0 0 * * *", "", `bad cron spec "TZ=UTC 0 0 * * *": CRON_TZ= and TZ= are not allowed in the spec; pass the time zone separately`},
		{"0 0 30 2 *", "", `bad cron spec "0 0 30 2 *": never fires (no tick within 5 years of 2000-01-01)`},
		{"0 0 31 4,6,9,11 *", "Europe/Paris", `bad cron spec "0 0 31 4,6,9,11 *": never fires (no tick within 5 years of 2000-01-01)`},
		{"@every 1h", "", `bad cron spec "@every 1h": @every is not a calendar schedule`},
		{"@fortnightly", "", `bad cron spec "@fortnightly": unrecognized descriptor: @fortnightly`},
		{"0 0 * * *", "Mars/Base", `unknown time zone "Mars/Base"`},
		{"0 0 * * *", "../etc/passwd", `unknown time zone "../etc/passwd"`},
		{"0 0 * * *", "Local", `time zone "Local" is not allowed: it depends on the machine; use an IANA name such as "America/Los_Angeles"`},
	}
	for _, tc := range tests {
		s, err := Parse(tc.spec, tc.zone)
		if err == nil {
			t.Errorf("Parse(%q, %q) = %v, want error", tc.spec, tc.zone, s)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("Parse(%q, %q) error\n got: %s\nwant: %s", tc.spec, tc.zone, err, tc.want)
		}
	}
}

func TestParseOK(t *testing.T) {
	for _, tc := range []struct{ spec, zone, str string }{
		{"0 0 * * *", "America/Los_Angeles", "0 0 * * * in America/Los_Angeles"},
		{" @daily ", "", "@daily in UTC"},
		{"0 0 29 2 *", "UTC", "0 0 29 2 * in UTC"},
		{"*/5 9-17 ? jan-mar mon-fri", "Europe/Berlin", "*/5 9-17 ? jan-mar mon-fri in Europe/Berlin"},
		{"0 0 29 2 1", "", "0 0 29 2 1 in UTC"},
	} {
		s := mustParse(t, tc.spec, tc.zone)
		if s.String() != tc.str {
			t.Errorf("String() = %q, want %q", s.String(), tc.str)
		}
	}
}

func TestZeroSchedule(t *testing.T) {
	var zero Schedule
	var nilS *Schedule
	if got := zero.String(); got != "<invalid calendar.Schedule>" {
		t.Errorf("zero String() = %q", got)
	}
	if got := nilS.String(); got != "<invalid calendar.Schedule>" {
		t.Errorf("nil String() = %q", got)
	}
	for name, f := range map[string]func(){
		"zero Next":    func() { zero.Next(time.Now()) },
		"zero Prev":    func() { zero.Prev(time.Now()) },
		"nil Window":   func() { nilS.Window(time.Now()) },
		"nil Ticks":    func() { nilS.Ticks(time.Now(), time.Now(), 2) },
		"zero Ticks":   func() { zero.Ticks(time.Now(), time.Now(), 2) },
		"nil Location": func() { nilS.Location() },
	} {
		func() {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), "zero Schedule") {
					t.Errorf("%s: recovered %v, want a panic naming the zero Schedule", name, r)
				}
			}()
			f()
		}()
	}
}

// TestMonotonicAndLocations checks that inputs with monotonic readings or in
// other locations give the same instants.
func TestMonotonicAndLocations(t *testing.T) {
	s := mustParse(t, "0 0 * * *", "America/Los_Angeles")
	now := time.Now()
	for _, at := range []time.Time{now, now.Round(0), now.UTC(), now.In(mustLoc(t, "Asia/Tokyo"))} {
		a, b := s.Window(at)
		c, d := s.Window(now.Round(0))
		if !a.Equal(c) || !b.Equal(d) {
			t.Fatalf("Window(%v) = [%v, %v), want [%v, %v)", at, a, b, c, d)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	s := mustParse(t, "*/15 * * * *", "America/Los_Angeles")
	want := s.Ticks(utc("2026-11-01T07:00:00Z"), utc("2026-11-01T12:00:00Z"), 100)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				got := s.Ticks(utc("2026-11-01T07:00:00Z"), utc("2026-11-01T12:00:00Z"), 100)
				if len(got) != len(want) {
					t.Errorf("got %d ticks, want %d", len(got), len(want))
					return
				}
			}
		})
	}
	wg.Wait()
	// 07:00Z..12:00Z is 5 hours: 20 quarter-hours plus the closing tick.
	if len(want) != 22 {
		t.Errorf("got %d ticks, want 22: %v", len(want), want)
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []struct{ spec, zone string }{
		{"0 0 * * *", "America/Los_Angeles"},
		{"30 2 * * *", "America/Los_Angeles"},
		{"*/15 * * * *", "Europe/London"},
		{"0 0 29 2 *", ""},
		{"@yearly", "Pacific/Auckland"},
		{"@every 1h", ""},
		{"CRON_TZ=UTC 0 0 * * *", ""},
		{"TZ=", ""},
		{"0 2 * * *", "Australia/Lord_Howe"},
		{"0 1 * * 6", "America/Santiago"},
		{"5-59/7 1,3 1-7 */2 sun", "Asia/Kathmandu"},
		{"0 0 30 2 *", "UTC"},
		{"61 * * * *", "Mars/Base"},
		{"", ""},
	} {
		f.Add(seed.spec, seed.zone)
	}
	instants := []time.Time{
		utc("2000-01-01T00:00:00Z"),
		utc("2026-03-08T10:00:00.5Z"),
		utc("2026-11-01T09:30:00Z"),
		utc("2031-07-15T12:34:56.789Z"),
		utc("2040-02-29T23:59:59.999999999Z"),
	}
	f.Fuzz(func(t *testing.T, spec, zone string) {
		s, err := Parse(spec, zone)
		if err != nil {
			if s != nil {
				t.Fatalf("Parse returned both %v and %v", s, err)
			}
			return
		}
		_ = s.String()
		for _, at := range instants {
			checkInvariants(t, s, at)
		}
		b := s.Ticks(instants[1], instants[1].Add(48*time.Hour), 5)
		if len(b) < 2 {
			t.Fatalf("Ticks = %v", b)
		}
	})
}

func BenchmarkPrev(b *testing.B) {
	for _, spec := range []string{"* * * * *", "0 0 * * *", "0 0 1 1 *", "0 0 29 2 *"} {
		s := MustParse(spec, "America/Los_Angeles")
		at := utc("2026-12-31T23:59:59Z")
		b.Run(spec, func(b *testing.B) {
			for b.Loop() {
				s.Prev(at)
			}
		})
	}
}

func BenchmarkTicks(b *testing.B) {
	s := MustParse("0 0 * * *", "America/Los_Angeles")
	at := utc("2026-11-01T12:00:00Z")
	for b.Loop() {
		s.Ticks(at.Add(-time.Hour), at.Add(time.Hour), 4)
	}
}
