package httpcall

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// FuzzNewRequest decodes hostile http:call payloads: it must never panic,
// and a payload it accepts must make an absolute http(s) request with no
// header value that would split a header.
func FuzzNewRequest(f *testing.F) {
	for _, s := range []string{
		`{"url": "https://api.example/v1/charge", "method": "POST", "business_id": "b1", "headers": {"Authorization": "Bearer x"}, "body": {"n": 1}}`,
		`{"url": "http://[::ffff:169.254.169.254]/latest"}`,
		`{"url": "https://api.example", "business_id": 1e400}`,
		`{"url": "https://api.example", "headers": {"X": "a\r\nInjected: 1"}}`,
		`{"url": "` + strings.Repeat("a", 1<<12) + `"}`,
		strings.Repeat(`{"body":`, 500) + `1` + strings.Repeat(`}`, 500),
		"{\"url\": \"https://api.example\", \"business_id\": \"\xff\xfe\"}",
		`{"url": "javascript:alert(1)"}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		req, target, err := newRequest(context.Background(), asynq.NewTask("http:call", payload))
		if err != nil {
			return
		}
		if req.URL.Scheme != "http" && req.URL.Scheme != "https" || req.URL.Host == "" {
			t.Fatalf("accepted %q: URL %q", payload, req.URL)
		}
		if target == "" {
			t.Fatalf("accepted %q without a target", payload)
		}
		for k, vs := range req.Header {
			for _, v := range vs {
				if strings.ContainsAny(k+v, "\r\n\x00") {
					t.Fatalf("accepted %q: header %q: %q", payload, k, v)
				}
			}
		}
	})
}

// FuzzRetryAfter: any Retry-After value gives a wait between 0 and a year.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"1", "0", "  30 ", "99999999999999999999999", "-5", "Wed, 21 Oct 2026 07:28:00 GMT", "1.5", "\xff", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		if d := retryAfter(v, now); d < 0 || d > 365*24*time.Hour {
			t.Fatalf("Retry-After %q: %v", v, d)
		}
	})
}

// FuzzQuotaSpent: any rate-limit headers give a pause between 0 and
// maxPause, and a pause only when they say nothing remains.
func FuzzQuotaSpent(f *testing.F) {
	for _, s := range [][3]string{
		{"0", "30", ""}, {"5", "30", ""}, {"", "", `limit=100, remaining=0, reset=30`}, {"", "", `"default";r=0;t=99999999999999999999, "b";r=0;t=5`},
		{"0", "1893456000", ""}, {"0", "1893456000000", ""}, {"0", "-1", ""}, {"-0", "9223372036854775807", ""}, {"\xff", "", "r=0;t=\xff"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	now := time.Date(2026, 10, 21, 7, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, remaining, reset, structuredField string) {
		for _, h := range []http.Header{
			{"Ratelimit-Remaining": {remaining}, "Ratelimit-Reset": {reset}},
			{"Ratelimit": {structuredField}},
			{"X-Ratelimit-Remaining": {remaining}, "X-Ratelimit-Reset": {reset}},
		} {
			d, spent := quotaSpent(h, now)
			if d < 0 || d > maxPause || (!spent && d != 0) {
				t.Fatalf("headers %v: pause %v, spent %v", h, d, spent)
			}
		}
	})
}
