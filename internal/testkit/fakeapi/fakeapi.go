// Package fakeapi is a strict stand-in for a third-party HTTP API with
// published rate limits, for the examples and the end-to-end tests: it
// answers 429 Too Many Requests the moment a caller exceeds any of its
// limits, and records every call so that a test can check what the remote
// side saw.
//
// Its limits (any may be disabled) are
//   - a global GCRA rate (Limits.Global),
//   - a GCRA rate per business, keyed by the X-Business-ID header
//     (Limits.PerBusiness), and
//   - a fixed-window quota aligned to the Unix epoch (Limits.Quota), and
//   - a GCRA rate over points (Limits.Points), each request costing the
//     points its X-Cost header asks (a whole number; absent or not one: 1),
//     as cost-based APIs (Shopify's GraphQL, HubSpot's) limit: when
//     Limits.ActualCost is set, the answer carries X-Actual-Cost, what the
//     request really cost, and the difference is given back at once.
//
// It can also be a service that never refuses but slows down above a
// number of calls at once (Limits.Slots), as internal services do.
//
// A request is admitted only if every limit admits it, and then every limit is
// charged; a 429 charges nothing. Decisions use the API's own clock (the local
// clock by default: it is the remote side), under one mutex, with GCRA
// arithmetic of its own (gcra.go): the judge shares no code with the
// limiter it judges.
//
// Every request must carry an Idempotency-Key header (400 otherwise). Answers:
//   - 200 with {"ok":true,...} when admitted;
//   - 429 with Retry-After in whole seconds (rounded up, at least 1) and
//     X-RateLimit-Scope naming the limit (ScopeGlobal, ScopeBusiness,
//     ScopeQuota, or ScopeForced during ThrottleFor), when any limit denies:
//     Retry-After is the longest wait among the limits that deny;
//   - 400 when Idempotency-Key is missing.
//
// Any method and path are accepted. A key answered 200 again is answered 200
// again (and charged) but counted in Stats.Duplicates: a strict vendor would
// not bill it twice, but a caller that repeats a successful call has a bug.
//
// Example and test support, imported by examples/, examplekit, cmd/internal/e2e and bench/.
package fakeapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Headers the API reads and writes.
const (
	// HeaderIdempotencyKey identifies a logical call; it is required.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderBusinessID selects the per-business limit's key; a request
	// without it counts against business "".
	HeaderBusinessID = "X-Business-ID"
	// HeaderScope names the limit that denied a request (on 429 only).
	HeaderScope = "X-RateLimit-Scope"
	// HeaderCost is the points a request asks of Limits.Points.
	HeaderCost = "X-Cost"
	// HeaderActualCost is the points a request really cost (on 200, when
	// Limits.ActualCost is set).
	HeaderActualCost = "X-Actual-Cost"
)

// Scopes: the limit a 429 was answered for (Call.Scope, HeaderScope).
const (
	ScopeGlobal   = "global"
	ScopeBusiness = "business"
	ScopeQuota    = "quota"
	ScopePoints   = "points"
	ScopeForced   = "forced"
)

// Limits are the API's published limits and behaviour. The zero value has no
// limits: every request with an Idempotency-Key is answered 200 at once.
type Limits struct {
	// Global limits all requests together. The zero Limit (default)
	// disables it; any other value must be valid (Limit).
	Global Limit
	// PerBusiness limits the requests of each X-Business-ID value
	// separately. The zero Limit (default) disables it.
	PerBusiness Limit
	// Quota limits all requests together per fixed window. The zero Quota
	// (default) disables it.
	Quota Quota
	// Points limits the points of all requests together, each request
	// asking the points of its X-Cost header (1 when absent or not a whole
	// number of at least 1). The zero Limit (default) disables it.
	Points Limit
	// ActualCost, when set, is what a request asking cost points really
	// costs: answered in X-Actual-Cost on a 200, and the difference (when
	// less) given back to Points at once. nil (default): the cost asked.
	ActualCost func(cost int) int
	// Latency is how long the API takes to answer each request, after it
	// has decided (so the decision is made at arrival). Default 0. A request
	// whose client goes away while it waits is still recorded as decided.
	Latency time.Duration
	// Slots, when above 0, makes every admitted request slower when more
	// than Slots are in service at once (this one included, c of them):
	// it takes Latency x (1 + 4 (c - Slots) / Slots), a quarter more calls
	// taking twice as long. 0 (default): Latency whatever the load.
	// SetSlots changes it.
	Slots int
	// Now is the API's clock. Default time.Now. Tests set it to drive
	// window resets and GCRA refills without sleeping.
	Now func() time.Time
}

// Quota is a fixed window: at most Limit requests per window of length
// Every, windows aligned to the Unix epoch (a 10s window runs from :00 to
// :10). The zero Quota is disabled.
type Quota struct {
	// Limit is the requests allowed per window, at least 1.
	Limit int
	// Every is the window's length, positive.
	Every time.Duration
}

// Validate reports what is wrong with l, or nil.
func (l Limits) Validate() error {
	var errs []error
	if l.Global != (Limit{}) {
		if err := l.Global.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("fakeapi: Limits.Global: %w", err))
		}
	}
	if l.PerBusiness != (Limit{}) {
		if err := l.PerBusiness.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("fakeapi: Limits.PerBusiness: %w", err))
		}
	}
	if l.Points != (Limit{}) {
		if err := l.Points.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("fakeapi: Limits.Points: %w", err))
		}
	}
	if l.Quota != (Quota{}) && (l.Quota.Limit < 1 || l.Quota.Every <= 0) {
		errs = append(errs, fmt.Errorf("fakeapi: Limits.Quota: needs Limit >= 1 and Every > 0, got %d per %v", l.Quota.Limit, l.Quota.Every))
	}
	if l.Latency < 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Limits.Latency: must not be negative, got %v", l.Latency))
	}
	if l.Slots < 0 {
		errs = append(errs, fmt.Errorf("fakeapi: Limits.Slots: must not be negative, got %d", l.Slots))
	}
	return errors.Join(errs...)
}

// Call is the record of one request.
type Call struct {
	// Key and Business are the request's Idempotency-Key and X-Business-ID
	// headers ("" when absent).
	Key, Business string
	// Method and Path are the request's method and URL path.
	Method, Path string
	// At is the arrival time on the API's clock.
	At time.Time
	// Status is the HTTP status answered: 200, 429 or 400.
	Status int
	// Scope, on a 429, names the limit that set RetryAfter.
	Scope string
	// RetryAfter, on a 429, is the exact wait (Retry-After is this rounded
	// up to whole seconds).
	RetryAfter time.Duration
	// Cost is the points the request asked (X-Cost, default 1); Actual
	// what it really cost (Limits.ActualCost; Cost without it), on a 200.
	Cost, Actual int
	// InFlight is, on a 200, the requests in service when it arrived, its
	// own included; Took how long it was served (its latency; known once
	// answered).
	InFlight int
	Took     time.Duration
}

// Second is one bucket of the per-second histogram: the calls that arrived
// in [Start, Start+1s).
type Second struct {
	Start         time.Time
	OK, Throttled int
}

// Stats is a snapshot of what the API has seen.
type Stats struct {
	// Calls counts every request; OK those answered 2xx, Throttled 429 and
	// Rejected 400 (no Idempotency-Key).
	Calls, OK, Throttled, Rejected int
	// ThrottledBy counts the 429s by scope (ScopeGlobal, ...).
	ThrottledBy map[string]int
	// DistinctKeys counts the idempotency keys answered 2xx at least once.
	DistinctKeys int
	// Duplicates counts the keys answered 2xx more than once.
	Duplicates int
	// FirstOK and LastOK are the arrival times of the first and last
	// request answered 2xx; zero when there was none.
	FirstOK, LastOK time.Time
	// PerSecond is the histogram of calls by arrival second on the API's
	// clock, in time order; seconds without a call are left out.
	PerSecond []Second
}

// BusiestSecond returns the histogram bucket with the most 2xx answers (the
// earliest of equals); the zero Second when there was none.
func (s Stats) BusiestSecond() Second {
	var best Second
	for _, b := range s.PerSecond {
		if b.OK > best.OK {
			best = b
		}
	}
	return best
}

// API is the fake API: an http.Handler, and, after Start, a server on a
// loopback port. It is safe for concurrent use.
type API struct {
	limits Limits
	now    func() time.Time

	mu          sync.Mutex
	global      tats
	business    tats
	points      tats
	window      int64 // start of the quota's current window, Unix ns
	windowUsed  int
	forcedUntil time.Time
	inService   int // requests admitted and not yet answered
	calls       []Call
	okCount     map[string]int
	perSecond   map[int64]*Second
	stats       Stats

	srv *http.Server
	url string
}

// New returns an API with limits l, or an error naming what is wrong with
// them.
func New(l Limits) (*API, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	a := &API{
		limits:    l,
		now:       l.Now,
		okCount:   map[string]int{},
		perSecond: map[int64]*Second{},
		stats:     Stats{ThrottledBy: map[string]int{}},
	}
	if a.now == nil {
		a.now = time.Now
	}
	return a, nil
}

// Start serves the API on a free port of 127.0.0.1 and returns its base URL,
// e.g. "http://127.0.0.1:41234". Call Close when done. Start fails if the
// API is already started or no port can be had.
func (a *API) Start() (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		return "", errors.New("fakeapi: already started")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("fakeapi: listen: %w", err)
	}
	a.srv = &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
	a.url = "http://" + ln.Addr().String()
	go a.srv.Serve(ln) //nolint:errcheck // returns http.ErrServerClosed on Close
	return a.url, nil
}

// URL returns the base URL Start returned, or "" before Start.
func (a *API) URL() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.url
}

// Close stops the server Start started, closing open connections. The
// records stay readable. It is a no-op before Start.
func (a *API) Close() error {
	a.mu.Lock()
	srv := a.srv
	a.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// ThrottleFor makes the API answer every request 429 (scope ScopeForced)
// from now until d has passed, as a vendor does when it sheds load on its
// own: Retry-After is the time left, rounded up. Nothing is charged
// meanwhile. A later call replaces the end of the period.
func (a *API) ThrottleFor(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forcedUntil = a.now().Add(d)
}

// SetGlobal changes the global limit from now on, as a vendor that
// changes its limits during the day does (the bucket's state carries over);
// the zero Limit disables it. It fails, changing nothing, if l is neither
// zero nor valid.
func (a *API) SetGlobal(l Limit) error {
	if l != (Limit{}) {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("fakeapi: SetGlobal: %w", err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limits.Global = l
	return nil
}

// SetSlots changes Limits.Slots from now on (0: no slowdown), as a
// service whose capacity changes does. It fails, changing nothing, if n is
// negative.
func (a *API) SetSlots(n int) error {
	if n < 0 {
		return fmt.Errorf("fakeapi: SetSlots: must not be negative, got %d", n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.limits.Slots = n
	return nil
}

// Stats returns a snapshot of what the API has seen so far.
func (a *API) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.ThrottledBy = make(map[string]int, len(a.stats.ThrottledBy))
	for k, v := range a.stats.ThrottledBy {
		s.ThrottledBy[k] = v
	}
	s.PerSecond = make([]Second, 0, len(a.perSecond))
	for _, b := range a.perSecond {
		s.PerSecond = append(s.PerSecond, *b)
	}
	sort.Slice(s.PerSecond, func(i, j int) bool { return s.PerSecond[i].Start.Before(s.PerSecond[j].Start) })
	return s
}

// Calls returns a copy of every call's record, in arrival order.
func (a *API) Calls() []Call {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Call(nil), a.calls...)
}

// ServeHTTP decides and answers one request (see the package doc).
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, i, latency := a.decide(r)
	if c.Status == http.StatusOK {
		began := time.Now()
		if latency > 0 {
			t := time.NewTimer(latency)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
			}
		}
		a.mu.Lock()
		a.inService--
		a.calls[i].Took = time.Since(began)
		a.mu.Unlock()
		if r.Context().Err() != nil {
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	switch c.Status {
	case http.StatusOK:
		if a.limits.ActualCost != nil {
			w.Header().Set(HeaderActualCost, strconv.Itoa(c.Actual))
		}
		w.WriteHeader(http.StatusOK)
		writeJSON(w, map[string]any{"ok": true, "key": c.Key, "business": c.Business})
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(c.RetryAfter), 10))
		w.Header().Set(HeaderScope, c.Scope)
		w.WriteHeader(http.StatusTooManyRequests)
		writeJSON(w, map[string]any{"error": "rate limited", "scope": c.Scope, "retry_after_ms": c.RetryAfter.Milliseconds()})
	default:
		w.WriteHeader(c.Status)
		writeJSON(w, map[string]any{"error": "missing " + HeaderIdempotencyKey + " header"})
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	_ = json.NewEncoder(w).Encode(v)
}

// retryAfterSeconds is d in whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// decide makes the decision for r at arrival and records it; it returns
// the record, its index in a.calls and, for a 200, how long to take.
func (a *API) decide(r *http.Request) (Call, int, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	c := Call{
		Key:      r.Header.Get(HeaderIdempotencyKey),
		Business: r.Header.Get(HeaderBusinessID),
		Method:   r.Method,
		Path:     r.URL.Path,
		At:       now,
		Cost:     1,
	}
	if n, err := strconv.Atoi(r.Header.Get(HeaderCost)); err == nil && n >= 1 {
		c.Cost = n
	}
	switch {
	case c.Key == "":
		c.Status = http.StatusBadRequest
	default:
		c.Status, c.Scope, c.RetryAfter = a.admit(now, c.Business, c.Cost)
	}
	var latency time.Duration
	if c.Status == http.StatusOK {
		a.inService++
		c.InFlight, latency = a.inService, a.limits.Latency
		if n := a.limits.Slots; n > 0 && c.InFlight > n {
			latency = time.Duration(float64(latency) * (1 + 4*float64(c.InFlight-n)/float64(n)))
		}
		c.Actual = c.Cost
		if a.limits.ActualCost != nil {
			c.Actual = a.limits.ActualCost(c.Cost)
			if l := a.limits.Points; l != (Limit{}) && c.Actual < c.Cost {
				a.points.giveBack(now, "", l, c.Cost-c.Actual)
			}
		}
	}
	a.record(c)
	return c, len(a.calls) - 1, latency
}

// admit decides a request of business at now against every limit, charging
// all of them or none. Called with a.mu held.
func (a *API) admit(now time.Time, business string, cost int) (status int, scope string, wait time.Duration) {
	deny := func(s string, d time.Duration) {
		if d > wait || scope == "" {
			scope, wait = s, d
		}
	}
	if now.Before(a.forcedUntil) {
		deny(ScopeForced, a.forcedUntil.Sub(now))
		return http.StatusTooManyRequests, scope, wait
	}
	q := a.limits.Quota
	if q.Limit > 0 {
		every := int64(q.Every)
		ns := now.UnixNano()
		start := ns - ((ns%every)+every)%every
		if start != a.window {
			a.window, a.windowUsed = start, 0
		}
		if a.windowUsed >= q.Limit {
			deny(ScopeQuota, time.Duration(start+every-ns))
		}
	}
	var charged []func()
	if l := a.limits.Global; l != (Limit{}) {
		if undo, retry := a.global.allow(now, "", l, 1); undo != nil {
			charged = append(charged, undo)
		} else {
			deny(ScopeGlobal, retry)
		}
	}
	if l := a.limits.PerBusiness; l != (Limit{}) {
		if undo, retry := a.business.allow(now, business, l, 1); undo != nil {
			charged = append(charged, undo)
		} else {
			deny(ScopeBusiness, retry)
		}
	}
	if l := a.limits.Points; l != (Limit{}) {
		if undo, retry := a.points.allow(now, "", l, cost); undo != nil {
			charged = append(charged, undo)
		} else {
			deny(ScopePoints, retry)
		}
	}
	if scope != "" {
		// Denied: undo the charges of the limits that admitted. Nothing
		// else ran in between (a.mu is held) and the time is the same, so
		// the refund is exact.
		for _, undo := range charged {
			undo()
		}
		return http.StatusTooManyRequests, scope, wait
	}
	if q.Limit > 0 {
		a.windowUsed++
	}
	return http.StatusOK, "", 0
}

// record adds c to the records and stats. Called with a.mu held.
func (a *API) record(c Call) {
	a.calls = append(a.calls, c)
	s := &a.stats
	s.Calls++
	sec := c.At.Unix() // the floor, also before 1970
	b := a.perSecond[sec]
	if b == nil {
		b = &Second{Start: time.Unix(sec, 0)}
		a.perSecond[sec] = b
	}
	switch c.Status {
	case http.StatusOK:
		s.OK++
		b.OK++
		if s.FirstOK.IsZero() {
			s.FirstOK = c.At
		}
		s.LastOK = c.At
		a.okCount[c.Key]++
		switch a.okCount[c.Key] {
		case 1:
			s.DistinctKeys++
		case 2:
			s.Duplicates++
		}
	case http.StatusTooManyRequests:
		s.Throttled++
		b.Throttled++
		s.ThrottledBy[c.Scope]++
	default:
		s.Rejected++
	}
}
