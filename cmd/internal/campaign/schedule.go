package campaign

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/taskrl/taskrl/internal/calendar"
)

// maxSlack bounds Schedule.Slack.
const maxSlack = time.Minute

// Schedule is a campaign's parsed cron spec and time zone: when asynq's
// Scheduler fires the fan-out, and which tick a fan-out belongs to. Build it
// with ParseSchedule. A Schedule is immutable and safe for concurrent use.
type Schedule struct {
	spec   string
	loc    *time.Location
	every  time.Duration      // > 0 for "@every D": ticks at Unix multiples of D
	cal    *calendar.Schedule // otherwise
	period time.Duration
}

// ParseSchedule parses a campaign schedule: a standard 5-field cron spec or a
// descriptor such as "@daily" or "@weekly" (robfig/cron/v3's ParseStandard
// syntax, which asynq's Scheduler uses), in the IANA time zone tz ("" means
// UTC), or "@every D" with D a whole number of seconds, at least 1s.
//
// Ticks of a cron spec are the instants whose wall clock in tz matches it
// (package internal/calendar). asynq's Scheduler fires "@every D" every D
// from when it starts, which differs from process to process; so that every
// process agrees on the ticks, those of "@every D" are the Unix-epoch
// multiples of D, and a fire belongs to the tick it follows.
func ParseSchedule(spec, tz string) (*Schedule, error) {
	spec = strings.TrimSpace(spec)
	if !strings.HasPrefix(spec, "@every") {
		c, err := calendar.Parse(spec, tz)
		if err != nil {
			return nil, err
		}
		s := &Schedule{spec: spec, loc: c.Location(), cal: c}
		s.period = s.shortestGap()
		return s, nil
	}
	if strings.Contains(spec, "TZ=") {
		return nil, fmt.Errorf("bad cron spec %q: CRON_TZ= and TZ= are not allowed in the spec; pass the time zone separately", spec)
	}
	loc, err := LoadZone(tz)
	if err != nil {
		return nil, err
	}
	d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(spec, "@every")))
	if err != nil {
		return nil, fmt.Errorf("bad cron spec %q: %v", spec, err)
	}
	if d < time.Second || d%time.Second != 0 {
		return nil, fmt.Errorf("bad cron spec %q: the interval must be a whole number of seconds, at least 1s", spec)
	}
	if _, err := cron.ParseStandard(spec); err != nil {
		return nil, fmt.Errorf("bad cron spec %q: %v", spec, err)
	}
	return &Schedule{spec: spec, loc: loc, every: d, period: d}, nil
}

// LoadZone loads the IANA time zone tz; "" means UTC. It refuses "Local",
// which would differ from machine to machine.
func LoadZone(tz string) (*time.Location, error) {
	if tz == "" || tz == "UTC" {
		return time.UTC, nil
	}
	if tz == "Local" {
		return nil, errors.New(`time zone "Local" is not allowed: it depends on the machine; use an IANA name such as "America/Los_Angeles"`)
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q", tz)
	}
	return loc, nil
}

// shortestGap returns the shortest time between consecutive ticks among the
// first 64 after a fixed instant, so that every process computes the same.
func (s *Schedule) shortestGap() time.Duration {
	t := s.cal.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC))
	gap := time.Duration(1<<63 - 1)
	for i := 0; i < 64; i++ {
		n := s.cal.Next(t)
		if n.IsZero() {
			break
		}
		gap = min(gap, n.Sub(t))
		t = n
	}
	return gap
}

// String returns the spec and zone, e.g. "0 9 * * 1 in Europe/Paris".
func (s *Schedule) String() string { return s.spec + " in " + s.loc.String() }

// Location returns the schedule's time zone.
func (s *Schedule) Location() *time.Location { return s.loc }

// Period returns the shortest time between two ticks (for a cron spec, among
// 64 consecutive ticks from a fixed date).
func (s *Schedule) Period() time.Duration { return s.period }

// Prev returns the latest tick at or before t.
func (s *Schedule) Prev(t time.Time) time.Time {
	if s.every > 0 {
		sec := int64(s.every / time.Second)
		u := t.Unix()
		return time.Unix(u-mod(u, sec), 0).In(s.loc)
	}
	return s.cal.Prev(t)
}

// Next returns the earliest tick after t.
func (s *Schedule) Next(t time.Time) time.Time {
	if s.every > 0 {
		return s.Prev(t).Add(s.every)
	}
	return s.cal.Next(t)
}

// Slack is how early, at most, a fan-out may run and still belong to the
// coming tick: a quarter of the period, at most a minute. It absorbs a
// scheduler clock running ahead of the Redis server's.
func (s *Schedule) Slack() time.Duration { return min(s.period/4, maxSlack) }

// Tick returns the tick a fan-out running at now (the Redis server's time)
// belongs to: the latest tick at or before now+Slack(). A fan-out that runs
// more than Period()-Slack() after its tick is attributed to a later one.
func (s *Schedule) Tick(now time.Time) time.Time { return s.Prev(now.Add(s.Slack())) }

// UniqueTTL returns the asynq.Unique TTL for the fan-out task: half the
// period in whole seconds, so that a second scheduler's fan-out for the same
// tick is usually refused while the next tick's is not; 0 (no Unique) when
// that is below asynq's minimum of 1s.
func (s *Schedule) UniqueTTL() time.Duration {
	ttl := (s.period / 2).Truncate(time.Second)
	if ttl < time.Second {
		return 0
	}
	return ttl
}

// ClaimTTL returns how long a tick's claim is kept: twice the period, at
// least an hour.
func (s *Schedule) ClaimTTL() time.Duration {
	if s.period > 1<<62/2 {
		return 1 << 62
	}
	return max(2*s.period, time.Hour)
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
