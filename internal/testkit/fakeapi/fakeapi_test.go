package fakeapi

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable clock for the API under test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// t0 is 17:00:00 UTC, on a 10-second window boundary.
var t0 = time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC)

func newAPI(t *testing.T, l Limits) (*API, *clock) {
	t.Helper()
	c := &clock{t: t0}
	l.Now = c.now
	a, err := New(l)
	if err != nil {
		t.Fatal(err)
	}
	return a, c
}

// answer is what one request got.
type answer struct {
	status     int
	retryAfter string
	scope      string
}

func call(a *API, key, business string) answer {
	r := httptest.NewRequest(http.MethodPost, "/v1/send", strings.NewReader(`{}`))
	if key != "" {
		r.Header.Set(HeaderIdempotencyKey, key)
	}
	if business != "" {
		r.Header.Set(HeaderBusinessID, business)
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	return answer{w.Code, w.Header().Get("Retry-After"), w.Header().Get(HeaderScope)}
}

func want(t *testing.T, got answer, status int, retryAfter, scope string) {
	t.Helper()
	if got != (answer{status, retryAfter, scope}) {
		t.Fatalf("got %d Retry-After %q scope %q, want %d Retry-After %q scope %q", got.status, got.retryAfter, got.scope, status, retryAfter, scope)
	}
}

// lastCall returns the record of the latest call.
func lastCall(a *API) Call {
	c := a.Calls()
	return c[len(c)-1]
}

func TestGlobalEmissionInterval(t *testing.T) {
	a, c := newAPI(t, Limits{Global: Limit{Rate: 20, Period: time.Second, Burst: 1}})
	want(t, call(a, "k1", ""), 200, "", "")
	// A second call within the emission interval (50ms) is refused with
	// the exact wait, rounded up to a whole second in Retry-After.
	c.add(10 * time.Millisecond)
	want(t, call(a, "k2", ""), 429, "1", ScopeGlobal)
	if got := lastCall(a).RetryAfter; got != 40*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 40ms", got)
	}
	c.add(40 * time.Millisecond)
	want(t, call(a, "k2", ""), 200, "", "")
}

func TestSetGlobal(t *testing.T) {
	a, c := newAPI(t, Limits{Global: Limit{Rate: 20, Period: time.Second, Burst: 1}})
	want(t, call(a, "k1", ""), 200, "", "")
	if err := a.SetGlobal(Limit{Rate: 5, Period: time.Second, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	// The TAT carries over (50ms ahead); at 5/s the next call is 200ms on.
	c.add(60 * time.Millisecond)
	want(t, call(a, "k2", ""), 200, "", "")
	c.add(150 * time.Millisecond)
	want(t, call(a, "k3", ""), 429, "1", ScopeGlobal)
	if err := a.SetGlobal(Limit{Rate: -1, Period: time.Second, Burst: 1}); err == nil {
		t.Fatal("an invalid limit was accepted")
	}
	if err := a.SetGlobal(Limit{}); err != nil {
		t.Fatal(err)
	}
	want(t, call(a, "k3", ""), 200, "", "")
}

func TestGlobalBurst(t *testing.T) {
	a, c := newAPI(t, Limits{Global: Limit{Rate: 20, Period: time.Second, Burst: 5}})
	for i := 0; i < 5; i++ {
		want(t, call(a, fmt.Sprint(i), ""), 200, "", "")
	}
	want(t, call(a, "5", ""), 429, "1", ScopeGlobal)
	if got := lastCall(a).RetryAfter; got != 50*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 50ms", got)
	}
	// A denied call charges nothing: the next slot is still 50ms away.
	c.add(50 * time.Millisecond)
	want(t, call(a, "5", ""), 200, "", "")
	want(t, call(a, "6", ""), 429, "1", ScopeGlobal)
}

func TestRetryAfterRoundsUp(t *testing.T) {
	// 0.4/s: emission interval 2.5s.
	a, c := newAPI(t, Limits{Global: Limit{Rate: 2, Period: 5 * time.Second, Burst: 1}})
	want(t, call(a, "a", ""), 200, "", "")
	want(t, call(a, "b", ""), 429, "3", ScopeGlobal) // 2.5s
	c.add(500 * time.Millisecond)
	want(t, call(a, "b", ""), 429, "2", ScopeGlobal) // exactly 2s
	c.add(1999 * time.Millisecond)
	want(t, call(a, "b", ""), 429, "1", ScopeGlobal) // 1ms
	c.add(time.Millisecond)
	want(t, call(a, "b", ""), 200, "", "")
}

func TestPerBusinessIndependent(t *testing.T) {
	a, c := newAPI(t, Limits{PerBusiness: Limit{Rate: 2, Period: time.Second, Burst: 1}})
	want(t, call(a, "1", "b1"), 200, "", "")
	want(t, call(a, "2", "b1"), 429, "1", ScopeBusiness)
	if got := lastCall(a).RetryAfter; got != 500*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 500ms", got)
	}
	// Other businesses, and requests without the header, have their own
	// buckets.
	want(t, call(a, "3", "b2"), 200, "", "")
	want(t, call(a, "4", ""), 200, "", "")
	want(t, call(a, "5", "b1:x"), 200, "", "")
	want(t, call(a, "6", ""), 429, "1", ScopeBusiness)
	c.add(500 * time.Millisecond)
	want(t, call(a, "2", "b1"), 200, "", "")
}

func TestAllOrNothing(t *testing.T) {
	a, _ := newAPI(t, Limits{
		Global:      Limit{Rate: 10, Period: time.Second, Burst: 2},
		PerBusiness: Limit{Rate: 1, Period: time.Second, Burst: 1},
	})
	want(t, call(a, "1", "b1"), 200, "", "")
	// Denied by b1's limit: the global charge is undone...
	want(t, call(a, "2", "b1"), 429, "1", ScopeBusiness)
	// ...so the global burst still has room for one.
	want(t, call(a, "3", "b2"), 200, "", "")
	want(t, call(a, "4", "b3"), 429, "1", ScopeGlobal)
	if got := lastCall(a).RetryAfter; got != 100*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 100ms", got)
	}
	// Both deny: the longer wait (b1's 1s; global's 100ms) is answered.
	want(t, call(a, "5", "b1"), 429, "1", ScopeBusiness)
	if got := lastCall(a).RetryAfter; got != time.Second {
		t.Fatalf("RetryAfter %v, want 1s", got)
	}
}

func TestQuotaWindowReset(t *testing.T) {
	a, c := newAPI(t, Limits{
		Quota:  Quota{Limit: 3, Every: 10 * time.Second},
		Global: Limit{Rate: 100, Period: time.Second, Burst: 100},
	})
	c.set(t0.Add(7*time.Second + 500*time.Millisecond))
	for i := 0; i < 3; i++ {
		want(t, call(a, fmt.Sprint(i), ""), 200, "", "")
	}
	want(t, call(a, "3", ""), 429, "3", ScopeQuota) // window ends at :10, 2.5s away
	if got := lastCall(a).RetryAfter; got != 2500*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 2.5s", got)
	}
	c.set(t0.Add(10*time.Second - time.Nanosecond))
	want(t, call(a, "3", ""), 429, "1", ScopeQuota)
	c.set(t0.Add(10 * time.Second)) // the next window
	for i := 3; i < 6; i++ {
		want(t, call(a, fmt.Sprint(i), ""), 200, "", "")
	}
	want(t, call(a, "6", ""), 429, "10", ScopeQuota)
	// The quota's denials charged no GCRA: 6 of the burst of 100 are used.
	if s := a.Stats(); s.OK != 6 || s.Throttled != 3 || s.ThrottledBy[ScopeQuota] != 3 {
		t.Fatalf("stats %+v", s)
	}
	// A GCRA denial does not count against the window.
	b, c2 := newAPI(t, Limits{
		Quota:  Quota{Limit: 2, Every: time.Minute},
		Global: Limit{Rate: 1, Period: time.Second, Burst: 1},
	})
	want(t, call(b, "a", ""), 200, "", "")
	want(t, call(b, "b", ""), 429, "1", ScopeGlobal)
	c2.add(time.Second)
	want(t, call(b, "b", ""), 200, "", "")
	c2.add(time.Second)
	want(t, call(b, "c", ""), 429, "58", ScopeQuota)
}

func TestQuotaWindowAlignedToEpoch(t *testing.T) {
	// A 7s window: aligned to the Unix epoch, not to the zero time.Time.
	a, c := newAPI(t, Limits{Quota: Quota{Limit: 1, Every: 7 * time.Second}})
	c.set(time.Unix(700, 0).Add(6 * time.Second))
	want(t, call(a, "a", ""), 200, "", "")
	want(t, call(a, "b", ""), 429, "1", ScopeQuota)
	c.set(time.Unix(707, 0))
	want(t, call(a, "b", ""), 200, "", "")
	// Before 1970 too.
	c.set(time.Unix(-7, 0).Add(time.Second))
	want(t, call(a, "c", ""), 200, "", "")
	want(t, call(a, "d", ""), 429, "6", ScopeQuota)
}

func TestThrottleFor(t *testing.T) {
	a, c := newAPI(t, Limits{Global: Limit{Rate: 10, Period: time.Second, Burst: 1}})
	a.ThrottleFor(2 * time.Second)
	want(t, call(a, "a", "b1"), 429, "2", ScopeForced)
	c.add(1500 * time.Millisecond)
	want(t, call(a, "a", "b1"), 429, "1", ScopeForced)
	c.add(500 * time.Millisecond)
	// Forced 429s charged nothing.
	want(t, call(a, "a", "b1"), 200, "", "")
	if s := a.Stats(); s.ThrottledBy[ScopeForced] != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMissingIdempotencyKey(t *testing.T) {
	a, _ := newAPI(t, Limits{Global: Limit{Rate: 1, Period: time.Second, Burst: 1}})
	want(t, call(a, "", "b1"), 400, "", "")
	// A rejected request charged nothing.
	want(t, call(a, "k", "b1"), 200, "", "")
	if s := a.Stats(); s.Rejected != 1 || s.Calls != 2 || s.OK != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestStats(t *testing.T) {
	a, c := newAPI(t, Limits{Global: Limit{Rate: 2, Period: time.Second, Burst: 2}})
	want(t, call(a, "a", "b1"), 200, "", "")
	c.add(300 * time.Millisecond)
	want(t, call(a, "b", "b1"), 200, "", "")
	want(t, call(a, "c", "b1"), 429, "1", ScopeGlobal)
	c.add(900 * time.Millisecond)
	want(t, call(a, "a", "b2"), 200, "", "") // a again: a duplicate
	c.add(2 * time.Second)
	want(t, call(a, "a", "b2"), 200, "", "") // still one duplicate key
	want(t, call(a, "c", ""), 200, "", "")
	s := a.Stats()
	if s.Calls != 6 || s.OK != 5 || s.Throttled != 1 || s.Rejected != 0 {
		t.Errorf("counts %+v", s)
	}
	if s.DistinctKeys != 3 || s.Duplicates != 1 {
		t.Errorf("keys: distinct %d, duplicates %d; want 3, 1", s.DistinctKeys, s.Duplicates)
	}
	if !s.FirstOK.Equal(t0) || !s.LastOK.Equal(t0.Add(3200*time.Millisecond)) {
		t.Errorf("first %v last %v", s.FirstOK, s.LastOK)
	}
	wantSec := []Second{{t0, 2, 1}, {t0.Add(time.Second), 1, 0}, {t0.Add(3 * time.Second), 2, 0}}
	same := len(s.PerSecond) == len(wantSec)
	for i := 0; same && i < len(wantSec); i++ {
		g, w := s.PerSecond[i], wantSec[i]
		same = g.Start.Equal(w.Start) && g.OK == w.OK && g.Throttled == w.Throttled
	}
	if !same {
		t.Errorf("per second\n got %v\nwant %v", s.PerSecond, wantSec)
	}
	if b := s.BusiestSecond(); !b.Start.Equal(t0) {
		t.Errorf("busiest %v", b)
	}
	calls := a.Calls()
	if len(calls) != 6 || calls[2] != (Call{Key: "c", Business: "b1", Method: "POST", Path: "/v1/send", At: t0.Add(300 * time.Millisecond), Status: 429, Scope: ScopeGlobal, RetryAfter: 200 * time.Millisecond, Cost: 1}) {
		t.Errorf("calls %+v", calls)
	}
	// Snapshots are copies.
	s.ThrottledBy[ScopeGlobal] = 99
	s.PerSecond[0].OK = 99
	calls[0].Key = "x"
	if s2 := a.Stats(); s2.ThrottledBy[ScopeGlobal] != 1 || s2.PerSecond[0].OK != 2 || a.Calls()[0].Key != "a" {
		t.Error("snapshot shares memory with the API")
	}
	var empty Stats
	if (empty.BusiestSecond() != Second{}) {
		t.Error("BusiestSecond of no calls")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want string
	}{
		{Limits{Global: Limit{Rate: -1, Period: time.Second, Burst: 1}}, "Limits.Global"},
		{Limits{PerBusiness: Limit{Rate: 1, Burst: 1}}, "Limits.PerBusiness"},
		{Limits{Quota: Quota{Limit: 0, Every: time.Second}}, "Limits.Quota: needs Limit >= 1 and Every > 0, got 0 per 1s"},
		{Limits{Quota: Quota{Limit: 5}}, "Limits.Quota"},
		{Limits{Latency: -time.Second}, "Limits.Latency: must not be negative"},
	} {
		a, err := New(tc.l)
		if err == nil || !strings.Contains(err.Error(), tc.want) || a != nil {
			t.Errorf("New(%+v) = %v, %v; want an error with %q", tc.l, a, err, tc.want)
		}
	}
	if _, err := New(Limits{}); err != nil {
		t.Errorf("zero Limits: %v", err)
	}
}

func TestUnlimited(t *testing.T) {
	a, _ := newAPI(t, Limits{})
	for i := 0; i < 100; i++ {
		want(t, call(a, fmt.Sprint(i), "b"), 200, "", "")
	}
}

// TestServerConcurrent serves real HTTP requests from many goroutines, with
// Stats read meanwhile (run with -race): every request is answered and
// counted once, and no more are admitted than the limits allow.
func TestServerConcurrent(t *testing.T) {
	a, err := New(Limits{
		Global:      Limit{Rate: 1, Period: time.Hour, Burst: 50},
		PerBusiness: Limit{Rate: 1, Period: time.Hour, Burst: 3},
		Latency:     time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	url, err := a.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Start(); err == nil {
		t.Error("second Start succeeded")
	}
	if a.URL() != url {
		t.Errorf("URL %q, Start %q", a.URL(), url)
	}
	const workers, each = 20, 10
	var wg sync.WaitGroup
	statuses := make(chan int, workers*each)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
				_ = a.Stats()
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				req, _ := http.NewRequest(http.MethodPost, url+"/x", nil)
				req.Header.Set(HeaderIdempotencyKey, fmt.Sprintf("%d-%d", w, i))
				req.Header.Set(HeaderBusinessID, fmt.Sprintf("b%d", (w*each+i)%30))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				statuses <- resp.StatusCode
			}
		}()
	}
	wg.Wait()
	close(done)
	close(statuses)
	got := map[int]int{}
	for s := range statuses {
		got[s]++
	}
	s := a.Stats()
	// 30 businesses × burst 3 = 90 > the global burst of 50: exactly 50 pass.
	if got[200] != 50 || got[429] != workers*each-50 || s.OK != 50 || s.Throttled != workers*each-50 || s.Calls != workers*each || s.DistinctKeys != 50 || s.Duplicates != 0 {
		t.Errorf("statuses %v, stats %+v", got, s)
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
}

func TestLatency(t *testing.T) {
	a, err := New(Limits{Latency: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set(HeaderIdempotencyKey, "k")
	start := time.Now()
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if el := time.Since(start); el < 30*time.Millisecond || w.Code != 200 {
		t.Errorf("answered %d after %v, want 200 after at least 30ms", w.Code, el)
	}
	// The call is recorded at arrival, before the latency.
	if at := lastCall(a).At; at.After(start.Add(30 * time.Millisecond)) {
		t.Errorf("recorded at %v, arrival %v", at, start)
	}
	// A client that goes away is not waited for; its call stays recorded.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r = httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	r.Header.Set(HeaderIdempotencyKey, "k2")
	a.ServeHTTP(httptest.NewRecorder(), r)
	if s := a.Stats(); s.OK != 2 {
		t.Errorf("stats %+v", s)
	}
}

func TestCloseBeforeStart(t *testing.T) {
	a, _ := New(Limits{})
	if err := a.Close(); err != nil || a.URL() != "" {
		t.Errorf("Close %v, URL %q", err, a.URL())
	}
}

// TestPoints: a points limit of 30 a second, burst 30, charges each request
// its X-Cost: 10 requests of 3 pass at once and the 11th is answered 429
// (scope points) until 3 points have come back, 100ms later; with an
// actual cost of 1 answered in X-Actual-Cost, 2 points of each come back
// at once, so 28 requests of 3 pass (the 28th needs 27+3 ≤ 30).
func TestPoints(t *testing.T) {
	ask := func(a *API, key string, cost string) *http.Response {
		req := httptest.NewRequest("POST", "/v1/x", nil)
		req.Header.Set(HeaderIdempotencyKey, key)
		req.Header.Set(HeaderCost, cost)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, req)
		return w.Result()
	}
	limit := Limit{Rate: 30, Period: time.Second, Burst: 30}
	a, c := newAPI(t, Limits{Points: limit})
	for i := 0; i < 10; i++ {
		if r := ask(a, fmt.Sprint(i), "3"); r.StatusCode != 200 || r.Header.Get(HeaderActualCost) != "" {
			t.Fatalf("request %d: %d %q", i, r.StatusCode, r.Header.Get(HeaderActualCost))
		}
	}
	if r := ask(a, "x", "3"); r.StatusCode != 429 || r.Header.Get(HeaderScope) != ScopePoints {
		t.Fatalf("11th: %d scope %q", r.StatusCode, r.Header.Get(HeaderScope))
	}
	c.add(99 * time.Millisecond)
	if r := ask(a, "y", "3"); r.StatusCode != 429 {
		t.Fatalf("99ms later: %d", r.StatusCode)
	}
	c.add(2 * time.Millisecond)
	if r := ask(a, "z", "3"); r.StatusCode != 200 {
		t.Fatalf("101ms later: %d", r.StatusCode)
	}

	a, _ = newAPI(t, Limits{Points: limit, ActualCost: func(int) int { return 1 }})
	n := 0
	for ; n < 40; n++ {
		r := ask(a, fmt.Sprint(n), "3")
		if r.StatusCode != 200 {
			break
		}
		if got := r.Header.Get(HeaderActualCost); got != "1" {
			t.Fatalf("X-Actual-Cost %q", got)
		}
	}
	if n != 28 {
		t.Errorf("%d requests of 3 costing 1 passed at once, want 28", n)
	}
	if cs := a.Calls(); cs[0].Cost != 3 || cs[0].Actual != 1 {
		t.Errorf("recorded %+v", cs[0])
	}
}

// TestSlots: above Slots requests at once each takes longer (4 in service
// of 2: three times the latency), the records say how many were in
// service and how long each took, and SetSlots changes it.
func TestSlots(t *testing.T) {
	a, err := New(Limits{Latency: 20 * time.Millisecond, Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			call(a, fmt.Sprint("k", i), "")
		}()
		time.Sleep(2 * time.Millisecond) // in order: 1, 2, 3, 4 in service
	}
	wg.Wait()
	var inFlight []int
	for _, c := range a.Calls() {
		inFlight = append(inFlight, c.InFlight)
		want := 20 * time.Millisecond
		if c.InFlight > 2 {
			want = time.Duration(float64(want) * (1 + 4*float64(c.InFlight-2)/2))
		}
		if c.Status != 200 || c.Took < want || c.Took > want+200*time.Millisecond {
			t.Errorf("%+v: want 200 taking %v", c, want)
		}
	}
	if fmt.Sprint(inFlight) != "[1 2 3 4]" {
		t.Errorf("in service at arrival: %v, want [1 2 3 4]", inFlight)
	}
	if err := a.SetSlots(-1); err == nil {
		t.Error("SetSlots(-1) accepted")
	}
	if err := a.SetSlots(0); err != nil {
		t.Fatal(err)
	}
	call(a, "k9", "")
	if c := lastCall(a); c.Took > 200*time.Millisecond {
		t.Errorf("without slots: %+v", c)
	}
	if _, err := New(Limits{Slots: -1}); err == nil {
		t.Error("Limits.Slots -1 accepted")
	}
}
