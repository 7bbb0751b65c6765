package quotas

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/limits"
)

// Every fault of a rule or its limit is a *RuleError naming the field, by
// its Go name, from Rule.Validate and NewSet alike.
func TestRuleErrorFields(t *testing.T) {
	ok := FixedWindow{Limit: 1, Every: time.Second}
	cases := []struct {
		rule          Rule
		field, reason string
	}{
		{Rule{Name: "", Limit: ok}, "Rule.Name", `"" must be 1-64 characters`},
		{Rule{Name: strings.Repeat("x", 65), Limit: ok}, "Rule.Name", "must be 1-64 characters"},
		{Rule{Name: "a b", Limit: ok}, "Rule.Name", `"a b" contains ' '; allowed are letters, digits, '_', '.' and '-'`},
		{Rule{Name: "r"}, "Rule.Limit", "missing"},
		{Rule{Name: "r", Limit: ok, Fair: true}, "Rule.Fair", "only a GCRA or Concurrency rule can be fair, not a 1 per 1s (fixed window)"},

		{Rule{Name: "r", Limit: GCRA{Rate: -1, Period: time.Second, Burst: 1}}, "Rate", "must be a positive number, got -1"},
		{Rule{Name: "r", Limit: GCRA{Rate: 0, Period: time.Second, Burst: 1}}, "Rate", "must be a positive number, got 0"},
		{Rule{Name: "r", Limit: GCRA{Rate: math.NaN(), Period: time.Second, Burst: 1}}, "Rate", "must be a positive number, got NaN"},
		{Rule{Name: "r", Limit: GCRA{Rate: math.Inf(1), Period: time.Second, Burst: 1}}, "Rate", "must be a positive number, got +Inf"},
		{Rule{Name: "r", Limit: GCRA{Rate: -1, Period: 0, Burst: 0}}, "Rate", "must be a positive number, got -1"},
		{Rule{Name: "r", Limit: GCRA{Rate: 1, Period: 0, Burst: 1}}, "Period", "must be positive, got 0s"},
		{Rule{Name: "r", Limit: GCRA{Rate: 1, Period: -time.Second, Burst: 0}}, "Period", "must be positive, got -1s"},
		{Rule{Name: "r", Limit: GCRA{Rate: 1, Period: time.Second, Burst: 0}}, "Burst", "must be at least 1, got 0"},
		{Rule{Name: "r", Limit: GCRA{Rate: 2e6, Period: time.Second, Burst: 1}}, "", "period/rate is below one microsecond, got 2e+06/1s burst 1 (GCRA)"},
		{Rule{Name: "r", Limit: GCRA{Rate: 1, Period: time.Second, Burst: 9e9}}, "", "burst × period/rate exceeds 35 years, got 1/1s burst 9000000000 (GCRA)"},

		{Rule{Name: "r", Limit: FixedWindow{Limit: 0, Every: time.Second}}, "Limit", "must be at least 1, got 0"},
		{Rule{Name: "r", Limit: FixedWindow{Limit: 1, Every: 0}}, "Every", "must be at least 1ms, got 0s"},
		{Rule{Name: "r", Limit: FixedWindow{Limit: 1, Every: 101 * 365 * 24 * time.Hour}}, "Every", "must be at most 100 years, got 884760h0m0s"},

		{Rule{Name: "r", Limit: SlidingWindow{Limit: -1, Every: time.Second}}, "Limit", "must be at least 1, got -1"},
		{Rule{Name: "r", Limit: SlidingWindow{Limit: 1, Every: time.Microsecond}}, "Every", "must be at least 1ms, got 1µs"},
		{Rule{Name: "r", Limit: SlidingWindow{Limit: limits.MaxSliding + 1, Every: time.Second}}, "Limit", "100001 exceeds 100000 (the log keeps one entry per unit; use a fixed or calendar window)"},

		{Rule{Name: "r", Limit: CalendarWindow{Limit: 0, Cron: "@daily"}}, "Limit", "must be at least 1, got 0"},
		{Rule{Name: "r", Limit: CalendarWindow{Limit: 1, Cron: "0 0 * *"}}, "Cron", `bad cron spec "0 0 * *": expected exactly 5 fields, found 4`},
		{Rule{Name: "r", Limit: CalendarWindow{Limit: 1, Cron: "0 0 30 2 *", TZ: "Europe/Paris"}}, "Cron", `bad cron spec "0 0 30 2 *": never fires`},
		{Rule{Name: "r", Limit: CalendarWindow{Limit: 1, Cron: "@daily", TZ: "Mars/Base"}}, "TZ", `unknown time zone "Mars/Base"`},
		{Rule{Name: "r", Limit: CalendarWindow{Limit: 1, Cron: "0 0 * *", TZ: "Local"}}, "TZ", `time zone "Local" is not allowed`},

		{Rule{Name: "r", Limit: Concurrency{Max: 0, Lease: time.Minute}}, "Max", "must be at least 1, got 0"},
		{Rule{Name: "r", Limit: Concurrency{Max: 1, Lease: time.Millisecond}}, "Lease", "must be at least 1s, got 1ms"},
		{Rule{Name: "r", Limit: Concurrency{Max: 1, Lease: 8 * 24 * time.Hour}}, "Lease", "must be at most 7 days, got 192h0m0s"},
		{Rule{Name: "r", Limit: Concurrency{Max: 2, Lease: time.Minute, Reserved: 2}}, "Reserved", "must be between 0 and max-1 (1), got 2"},
		{Rule{Name: "r", Limit: Concurrency{Max: 2, Lease: time.Minute, Reserved: -1}}, "Reserved", "must be between 0 and max-1 (1), got -1"},
	}
	for _, c := range cases {
		verr := c.rule.Validate()
		_, serr := NewSet(c.rule)
		for _, err := range []error{verr, serr} {
			var re *RuleError
			if !errors.As(err, &re) {
				t.Errorf("%+v: %v (%T), want a *RuleError", c.rule, err, err)
				continue
			}
			if re.Rule != c.rule.Name || re.Field != c.field || !strings.HasPrefix(re.Reason, c.reason) && !strings.HasSuffix(re.Reason, c.reason) {
				t.Errorf("%+v: Rule %q, Field %q, Reason %q; want %q, %q, %q", c.rule, re.Rule, re.Field, re.Reason, c.rule.Name, c.field, c.reason)
			}
		}
		// Outside a set, no position: the rule is named.
		if verr != nil && serr != nil && c.field != "Rule.Name" && verr.Error() != serr.Error() {
			t.Errorf("%+v: Validate %q, NewSet %q", c.rule, verr, serr)
		}
	}
	for _, r := range []Rule{
		{Name: "g", Limit: GCRA(gcra.PerSecond(1)), Fair: true},
		{Name: "w", Limit: FixedWindow{Limit: 1, Every: time.Millisecond}},
		{Name: "c", Limit: CalendarWindow{Limit: 1, Cron: "@daily", TZ: "America/Los_Angeles"}},
		{Name: "s", Limit: SlidingWindow{Limit: limits.MaxSliding, Every: time.Second}},
		{Name: "k", Limit: Concurrency{Max: 2, Lease: time.Second, Reserved: 1}},
	} {
		if err := r.Validate(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// NewSet's errors: a duplicate is a RuleError on the name, an invalid name
// is placed by its position, and a GCRA's error unwraps to gcra's.
func TestNewSetRuleError(t *testing.T) {
	ok := GCRA(gcra.PerSecond(1))
	var re *RuleError
	_, err := NewSet(Rule{Name: "a", Limit: ok}, Rule{Name: "a"})
	if !errors.As(err, &re) || re.Field != "Rule.Name" || re.Rule != "a" || err.Error() != `quotas: rule "a": duplicate name` {
		t.Errorf("duplicate: %v, %+v", err, re)
	}
	_, err = NewSet(Rule{Name: "a", Limit: ok}, Rule{Name: "a/b", Limit: ok})
	if want := `quotas: rule 2: name "a/b" contains '/'`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("bad name: %v, want %s", err, want)
	}
	if err := (Rule{Name: "a/b", Limit: ok}).Validate(); err == nil || !strings.HasPrefix(err.Error(), `quotas: rule "a/b": name "a/b" contains '/'`) {
		t.Errorf("bad name outside a set: %v", err)
	}
	_, err = NewSet(Rule{Name: "g", Limit: GCRA{Rate: 1, Period: time.Second}})
	if !errors.As(err, &re) || re.Field != "Burst" || err.Error() != `quotas: rule "g": gcra: invalid limit 1/1s burst 0: burst must be at least 1` {
		t.Errorf("GCRA: %v, %+v", err, re)
	}
}
