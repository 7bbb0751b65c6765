package campaign

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPayloadRoundRobin(t *testing.T) {
	s := Spec{URL: "http://api.example/send?a=1&b=<2>", Count: 7, Businesses: 3}.Normalize()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 7 || s.Type != "http:call" || s.Queue != "default" {
		t.Fatalf("normalized %+v", s)
	}
	for i := 0; i < 7; i++ {
		var p map[string]string
		if err := json.Unmarshal(s.Payload(i), &p); err != nil {
			t.Fatalf("payload %d %s: %v", i, s.Payload(i), err)
		}
		want := map[string]string{"url": s.URL, "method": "POST", "business_id": "b" + string(rune('1'+i%3))}
		if len(p) != 3 || p["url"] != want["url"] || p["method"] != "POST" || p["business_id"] != want["business_id"] {
			t.Errorf("payload %d = %v, want %v", i, p, want)
		}
	}
	if got, want := string(s.Payload(4)), `{"url":"http://api.example/send?a=1&b=<2>","method":"POST","business_id":"b2"}`; got != want {
		t.Errorf("payload 4 = %s, want %s", got, want)
	}
}

func TestPayloadsCompacted(t *testing.T) {
	s := Spec{Payloads: []json.RawMessage{json.RawMessage(`{ "business_id" : "b9" }`)}}.Normalize()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := string(s.Payload(0)); got != `{"business_id":"b9"}` {
		t.Errorf("payload %s", got)
	}
}

func TestValidate(t *testing.T) {
	neg := -1
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{URL: "http://x", Count: 0}, "count: must be at least 1"},
		{Spec{URL: "http://x", Count: 1, Businesses: -2}, "businesses: must be at least 1"},
		{Spec{URL: "x", Count: 1}, `url: "x" is not an absolute http or https URL`},
		{Spec{Count: 1}, "url: required"},
		{Spec{URL: "http://x", Count: 1, MaxRetry: &neg}, "max_retry: must not be negative"},
		{Spec{URL: "http://x", Count: 1, Type: TypeFanout}, "type:"},
		{Spec{URL: "http://x", Count: 1, Queue: " "}, "queue: must not be blank"},
		{Spec{Payloads: []json.RawMessage{}}, "payloads: no payloads"},
		{Spec{Payloads: []json.RawMessage{json.RawMessage(`{}`), json.RawMessage(`"s"`)}}, "payload 2: not a JSON object"},
		{Spec{Payloads: []json.RawMessage{json.RawMessage(`{}`)}, Count: 3}, "exclusive"},
		{Spec{URL: "http://x", Count: 1, Cron: "0 9 * *"}, "cron: bad cron spec"},
		{Spec{URL: "http://x", Count: 1, Cron: "@daily", TZ: "Mars/Base"}, `unknown time zone "Mars/Base"`},
		{Spec{URL: "http://x", Count: 1, TZ: "Europe/Paris"}, "tz: set without cron"},
		{Spec{URL: "http://x", Count: 1, Name: "a:b"}, "campaign name"},
		{Spec{URL: "http://x", Count: 1, Prefix: "a{"}, "prefix:"},
	} {
		err := c.spec.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want it to contain %q", c.spec, err, c.want)
		}
	}
}

func TestDefaultName(t *testing.T) {
	a := Spec{URL: "http://x", Count: 10, Cron: "@every 1s"}
	b := Spec{URL: "http://x", Count: 10, Cron: "@every 1s", Queue: "default", Businesses: 1, TZ: "UTC", Prefix: "taskrl:"}
	c := Spec{URL: "http://x", Count: 11, Cron: "@every 1s"}
	if a.DefaultName() != b.DefaultName() {
		t.Errorf("defaults change the name: %s vs %s", a.DefaultName(), b.DefaultName())
	}
	if a.DefaultName() == c.DefaultName() {
		t.Errorf("different campaigns share the name %s", a.DefaultName())
	}
	if err := ValidateName(a.DefaultName()); err != nil {
		t.Error(err)
	}
}

func TestScheduleEvery(t *testing.T) {
	s, err := ParseSchedule("@every 10s", "")
	if err != nil {
		t.Fatal(err)
	}
	at := func(sec, ms int64) time.Time { return time.Unix(sec, ms*1e6) }
	for _, c := range []struct {
		now  time.Time
		tick int64
	}{
		{at(1_000_000_020, 0), 1_000_000_020},
		{at(1_000_000_027, 400), 1_000_000_020},
		{at(1_000_000_027, 500), 1_000_000_030},
		// A scheduler firing 1 s early by the Redis clock still gets
		// its tick (slack 2.5 s).
		{at(1_000_000_019, 0), 1_000_000_020},
		{at(1_000_000_017, 400), 1_000_000_010},
	} {
		if got := s.Tick(c.now).Unix(); got != c.tick {
			t.Errorf("Tick(%d.%03d) = %d, want %d", c.now.Unix(), c.now.Nanosecond()/1e6, got, c.tick)
		}
	}
	if s.Period() != 10*time.Second || s.UniqueTTL() != 5*time.Second || s.ClaimTTL() != time.Hour {
		t.Errorf("period %s, unique %s, claim %s", s.Period(), s.UniqueTTL(), s.ClaimTTL())
	}
	if got := s.Next(at(1_000_000_025, 0)).Unix(); got != 1_000_000_030 {
		t.Errorf("Next = %d", got)
	}
	one, _ := ParseSchedule("@every 1s", "UTC")
	if one.UniqueTTL() != 0 {
		t.Errorf("@every 1s: unique TTL %s, want 0 (asynq's minimum is 1s)", one.UniqueTTL())
	}
}

func TestScheduleCron(t *testing.T) {
	s, err := ParseSchedule("0 9 * * 1", "Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	paris := s.Location()
	monday := time.Date(2026, 5, 4, 9, 0, 0, 0, paris)
	for _, now := range []time.Time{
		monday,
		monday.Add(-30 * time.Second), // scheduler clock ahead of Redis
		monday.Add(6 * 24 * time.Hour),
	} {
		if got := s.Tick(now); !got.Equal(monday) {
			t.Errorf("Tick(%s) = %s, want %s", now, got, monday)
		}
	}
	if got := s.Tick(monday.Add(-2 * time.Minute)); !got.Equal(monday.Add(-7 * 24 * time.Hour)) {
		t.Errorf("two minutes early: tick %s, want the week before", got)
	}
	// The week that loses an hour to daylight saving time is the shortest.
	if s.Period() != 167*time.Hour || s.UniqueTTL() != 83*time.Hour+30*time.Minute || s.ClaimTTL() != 334*time.Hour || s.Slack() != time.Minute {
		t.Errorf("period %s, unique %s, claim %s, slack %s", s.Period(), s.UniqueTTL(), s.ClaimTTL(), s.Slack())
	}
	if s.String() != "0 9 * * 1 in Europe/Paris" {
		t.Errorf("String() = %q", s)
	}
}

func TestParseScheduleErrors(t *testing.T) {
	for _, c := range []struct{ spec, tz, want string }{
		{"@every 1500ms", "", "whole number of seconds"},
		{"@every 0s", "", "whole number of seconds"},
		{"@every soon", "", "bad cron spec"},
		{"CRON_TZ=UTC @every 1s", "", "TZ="},
		{"CRON_TZ=UTC 0 9 * * *", "", "TZ="},
		{"0 9 * * *", "Local", "Local"},
		{"@every 1s", "Nowhere/Town", "unknown time zone"},
		{"61 * * * *", "", "minute"},
		{"0 0 30 2 *", "", "never fires"},
	} {
		_, err := ParseSchedule(c.spec, c.tz)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseSchedule(%q, %q): %v, want an error containing %q", c.spec, c.tz, err, c.want)
		}
	}
}
