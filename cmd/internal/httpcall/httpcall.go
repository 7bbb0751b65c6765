// Package httpcall is the worker's built-in "http:call" task handler: it
// sends the HTTP request a task's payload describes and maps the answer onto
// asynq's and taskrl's outcomes.
//
// The payload is JSON:
//
//	{"url": "https://api.example.com/v1/send", "method": "POST",
//	 "business_id": "b7", "headers": {"Authorization": "Bearer ..."},
//	 "body": {"any": "JSON"}}
//
// The request carries the payload's headers, Idempotency-Key set to the
// asynq task ID (which a task keeps however often the middleware makes it
// wait), X-Business-ID when business_id is set,
// and, when there is a body, the raw JSON of "body" with Content-Type
// application/json (unless the payload's headers set another). The two
// handler-set headers win over payload headers of the same name; a "Host"
// payload header sets the request's host; the method (default POST) is
// upper-cased.
//
// Answers:
//   - 2xx: the task is done;
//   - 429: taskrl.Throttled with the Retry-After the server sent (seconds or
//     an HTTP date; missing, garbled or past means 0, which taskrl treats as
//     1s): the middleware backs every worker off and reschedules the task;
//   - any other 4xx, an unfollowed 1xx/3xx, or a status beyond 599: an error
//     wrapping asynq.SkipRetry, so asynq archives the task with the status
//     and up to 200 bytes of the response body as the reason;
//   - rate-limit headers (RateLimit-Remaining/-Reset, RateLimit, or
//     X-RateLimit-Remaining/-Reset) saying nothing remains: on a 2xx, the
//     task succeeds and taskrl.Pause holds its rules until the reset; on a
//     429 without Retry-After, the reset is the wait;
//   - 503 with a Retry-After in the future: taskrl.Throttled, as a 429 (the
//     server said when to come back), reported as 5xx;
//   - other 5xx and network errors: a plain error, retried by asynq as usual;
//   - a payload that is not JSON, lacks a url, has a url that is not
//     absolute http(s), a bad method or a bad header: an error wrapping
//     asynq.SkipRetry naming the field;
//   - a request the egress policy refuses (see NewClient), on the first hop
//     or a redirect: nothing is sent; an error wrapping asynq.SkipRetry
//     with the reason.
//
// Actual cost: whatever the status, once an answer came back, each of the
// task's rules with a cost and a settle header (WithSettleHeaders: the
// worker's http.settle_headers) takes the whole number that header of the
// answer carries as the call's actual cost (taskrl.SettleFromHeaders):
// the middleware gives the
// difference from the estimate back, or charges it, when the handler
// returns. An absent header, or one that is not a whole number of at least
// 0, leaves the estimate (logged at debug level).
//
// Redirects are followed up to MaxRedirects hops, each checked by the
// egress policy like the first. When a hop changes the host (or port, or
// goes from https to http), the payload's headers and any Authorization,
// Cookie and Proxy-Authorization are dropped: only the handler's own
// headers (User-Agent, Idempotency-Key, X-Business-ID, Content-Type) go on.
//
// Application code of the binaries, imported by cmd/worker and cmd/internal/metrics.
package httpcall

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/taskrl"
)

// TypeHTTPCall is the asynq task type the handler serves.
const TypeHTTPCall = "http:call"

// Result classes passed to the hook of WithResultHook, one per attempt.
const (
	Class2xx   = "2xx"   // success
	Class429   = "429"   // upstream throttled
	Class4xx   = "4xx"   // client error other than 429: archived
	Class5xx   = "5xx"   // server error: retried
	ClassOther = "other" // unfollowed 1xx/3xx or a status beyond 599: archived
	ClassError = "error" // no response: network error, timeout, cancellation
	// ClassRefused: the egress policy refused the request; nothing was sent.
	ClassRefused = "refused"
)

// Classes lists every result class, e.g. to pre-create metric series.
var Classes = []string{Class2xx, Class429, Class4xx, Class5xx, ClassOther, ClassError, ClassRefused}

// MaxRedirects is how many redirects a request follows before it fails
// (archived with the reason).
const MaxRedirects = 5

// DefaultTimeout is the per-request timeout of the client NewHandler builds
// when given none.
const DefaultTimeout = 30 * time.Second

// snippetLen bounds the response body quoted in an error.
const snippetLen = 200

// drainLen bounds how much of a response body is read before closing it, so
// that a huge error page cannot stall a worker while the connection can
// usually still be reused.
const drainLen = 64 << 10

// Payload is the JSON payload of an http:call task.
type Payload struct {
	// URL is the absolute http or https URL to call. Required.
	URL string `json:"url"`
	// Method is the HTTP method. Default POST.
	Method string `json:"method,omitempty"`
	// BusinessID, if set, is sent as X-Business-ID (and is what policy key
	// templates usually pick, as {{.business_id}}). A JSON string or a
	// number, sent as written (as a policy key renders it).
	BusinessID ID `json:"business_id,omitempty"`
	// Headers are added to the request.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is sent verbatim as the request body; absent or null means none.
	Body json.RawMessage `json:"body,omitempty"`
}

// ID is a payload identifier given as a JSON string or number; a number
// keeps its text as written (12345678901 stays 12345678901).
type ID string

// UnmarshalJSON implements json.Unmarshaler.
func (id *ID) UnmarshalJSON(b []byte) error {
	var n json.Number
	if err := json.Unmarshal(b, &n); err == nil {
		*id = ID(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("must be a string or a number")
	}
	*id = ID(s)
	return nil
}

// Option configures NewHandler.
type Option func(*handler)

// WithResultHook makes the handler call f with the result class (one of
// Classes) of every request it sends, e.g. to count them in metrics. f is
// called on worker goroutines and must be safe for concurrent use and
// quick.
func WithResultHook(f func(class string)) Option {
	return func(h *handler) { h.hook = f }
}

// WithLogger makes the handler log with l (debug: a settle header that
// could not be read); nil, the default, means slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(h *handler) { h.logger = l }
}

// WithSettleHeaders makes the handler settle each task's actual cost from
// the answer's headers: headers returns, for each call, the response
// header that carries the cost under each rule that has one (rule name →
// header name, e.g. "vendor-points" → "X-Actual-Cost"; see
// taskrl.SettleFromHeaders), so that a reloaded policy file takes effect
// for the calls that follow. headers is called on worker goroutines and
// must be safe for concurrent use; the map it returns is not modified.
// nil, the default, settles nothing.
func WithSettleHeaders(headers func() map[string]string) Option {
	return func(h *handler) { h.settle = headers }
}

// NewClient returns the HTTP client the handler sends with: the given
// per-request timeout (DefaultTimeout when timeout <= 0), a transport that
// keeps up to 64 idle connections per host (so many workers calling one
// API reuse their connections), and guard's egress policy (a nil guard:
// every host, but never the addresses egress.CheckAddr refuses). Every
// request it sends, the first and each redirect, is checked against the
// guard's allow list; every connection it opens is checked on the address
// it dials, after DNS resolution. Redirects: see the package doc. Behind a
// proxy (HTTP_PROXY, HTTPS_PROXY) the address checked is the proxy's; the
// allow list still applies to every URL.
func NewClient(timeout time.Duration, guard *egress.Guard) *http.Client {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if guard == nil {
		guard = new(egress.Guard)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: guard.Control, Resolver: resolver}
	tr.DialContext = dialer.DialContext
	return &http.Client{Timeout: timeout, Transport: guarded{guard, tr}, CheckRedirect: checkRedirect}
}

// resolver resolves host names for NewClient's connections; nil is the
// system's. Tests replace it.
var resolver *net.Resolver

// guarded checks every request against the egress policy before base sends it.
type guarded struct {
	guard *egress.Guard
	base  http.RoundTripper
}

func (g guarded) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := g.guard.CheckURL(req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return g.base.RoundTrip(req)
}

// payloadHeadersKey is the request context key of the payload's header
// names, which a redirect to another host drops.
type payloadHeadersKey struct{}

// credentialHeaders are dropped on a redirect to another host besides the
// payload's own headers.
var credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Cookie2"}

// errTooManyRedirects fails a request after MaxRedirects redirects.
var errTooManyRedirects = fmt.Errorf("stopped after %d redirects", MaxRedirects)

// checkRedirect is the client's CheckRedirect: at most MaxRedirects hops;
// the payload's headers and credentials stay with the first host.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > MaxRedirects {
		return errTooManyRedirects
	}
	first := via[0].URL
	if !strings.EqualFold(hostPort(req.URL), hostPort(first)) || (strings.EqualFold(first.Scheme, "https") && !strings.EqualFold(req.URL.Scheme, "https")) {
		names, _ := req.Context().Value(payloadHeadersKey{}).([]string)
		for _, k := range append(names, credentialHeaders...) {
			req.Header.Del(k)
		}
		req.Host = "" // a payload's Host header named the first host
	}
	return nil
}

// hostPort is u's host and port, the scheme's default port when absent.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if strings.EqualFold(u.Scheme, "https") {
			port = "443"
		}
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// NewHandler returns the http:call handler. It sends requests with client,
// or, when client is nil, with NewClient(DefaultTimeout, nil); the task
// context's deadline applies as well. The handler is safe for concurrent
// use.
func NewHandler(client *http.Client, opts ...Option) asynq.Handler {
	if client == nil {
		client = NewClient(DefaultTimeout, nil)
	}
	h := &handler{client: client}
	for _, o := range opts {
		o(h)
	}
	return h
}

type handler struct {
	client *http.Client
	hook   func(string)
	logger *slog.Logger             // nil: slog.Default()
	settle func() map[string]string // rule name → settle header; nil: none
}

// settleFrom settles the task's actual cost from the answer's header.
func (h *handler) settleFrom(ctx context.Context, header http.Header) error {
	if h.settle == nil {
		return nil
	}
	return taskrl.SettleFromHeaders(ctx, h.settle(), header.Get)
}

func (h *handler) report(class string) {
	if h.hook != nil {
		h.hook(class)
	}
}

// ProcessTask implements asynq.Handler.
func (h *handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	req, target, err := newRequest(ctx, t)
	if err != nil {
		return err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		// *url.Error repeats the whole URL, query string included; name the
		// target without it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var refused *egress.RefusedError
		switch {
		case errors.As(err, &refused):
			h.report(ClassRefused)
			return fmt.Errorf("http:call: %s: %v: %w", target, refused, asynq.SkipRetry)
		case errors.Is(err, errTooManyRedirects):
			h.report(ClassOther)
			return fmt.Errorf("http:call: %s: %v: %w", target, err, asynq.SkipRetry)
		}
		h.report(ClassError)
		return fmt.Errorf("http:call: %s: %w", target, err)
	}
	snippet := drain(resp.Body, resp.StatusCode/100 != 2)
	// The call was made: the answer may say what it actually cost.
	if err := h.settleFrom(ctx, resp.Header); err != nil && !errors.Is(err, taskrl.ErrNoCost) {
		logger := h.logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.Debug("http:call: the answer's actual cost is unreadable", "target", target, "err", err)
	}
	code := resp.StatusCode
	status := resp.Status
	if status == "" {
		status = strconv.Itoa(code)
	}
	answer := func() string {
		if snippet == "" {
			return fmt.Sprintf("%s: %s", target, status)
		}
		return fmt.Sprintf("%s: %s: %s", target, status, snippet)
	}
	now := time.Now()
	switch {
	case code >= 200 && code < 300:
		h.report(Class2xx)
		if reset, spent := quotaSpent(resp.Header, now); spent {
			taskrl.Pause(ctx, reset)
		}
		return nil
	case code == http.StatusTooManyRequests:
		h.report(Class429)
		wait := retryAfter(resp.Header.Get("Retry-After"), now)
		if reset, spent := quotaSpent(resp.Header, now); wait == 0 && spent {
			wait = reset
		}
		return taskrl.Throttled(wait, errors.New(answer()))
	case code >= 400 && code < 500:
		h.report(Class4xx)
		return fmt.Errorf("http:call: %s: %w", answer(), asynq.SkipRetry)
	case code >= 500 && code < 600:
		h.report(Class5xx)
		if wait := retryAfter(resp.Header.Get("Retry-After"), time.Now()); code == http.StatusServiceUnavailable && wait > 0 {
			return taskrl.Throttled(wait, errors.New(answer()))
		}
		return fmt.Errorf("http:call: %s", answer())
	default:
		h.report(ClassOther)
		return fmt.Errorf("http:call: %s: unexpected status: %w", answer(), asynq.SkipRetry)
	}
}

// newRequest builds the request an http:call task describes, with ctx as
// its context, and a short description of its target for messages
// ("POST https://host/path", without query string or credentials). A bad
// payload is an error wrapping asynq.SkipRetry that names the field.
func newRequest(ctx context.Context, t *asynq.Task) (*http.Request, string, error) {
	var p Payload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return nil, "", payloadErr("not a valid JSON object: %v", err)
	}
	if p.URL == "" {
		return nil, "", payloadErr("url: required")
	}
	u, err := url.Parse(p.URL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, "", payloadErr("url: %v", err)
	}
	if scheme := strings.ToLower(u.Scheme); (scheme != "http" && scheme != "https") || u.Host == "" {
		return nil, "", payloadErr("url: must be an absolute http or https URL, got %q", clip((&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()))
	}
	method := strings.ToUpper(p.Method)
	if method == "" {
		method = http.MethodPost
	}
	if !IsToken(method) {
		return nil, "", payloadErr("method: not a valid HTTP method: %q", clip(p.Method))
	}
	for k, v := range p.Headers {
		if !IsToken(k) {
			return nil, "", payloadErr("headers: invalid header name %q", clip(k))
		}
		if !validValue(v) {
			return nil, "", payloadErr("headers[%q]: value contains a control character", clip(k))
		}
	}
	if !validValue(string(p.BusinessID)) {
		return nil, "", payloadErr("business_id: contains a control character, cannot be sent as X-Business-ID")
	}
	var body io.Reader
	raw := bytes.TrimSpace(p.Body)
	hasBody := len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
	if hasBody {
		body = bytes.NewReader(raw)
	}
	names := make([]string, 0, len(p.Headers))
	for k := range p.Headers {
		names = append(names, k)
	}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, payloadHeadersKey{}, names), method, p.URL, body)
	if err != nil {
		return nil, "", payloadErr("%v", err)
	}
	for k, v := range p.Headers {
		if http.CanonicalHeaderKey(k) == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	if hasBody && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "taskrl-worker")
	}
	if id := taskID(ctx); id != "" {
		req.Header.Set("Idempotency-Key", id)
	}
	if p.BusinessID != "" {
		req.Header.Set("X-Business-ID", string(p.BusinessID))
	}
	target := method + " " + (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String()
	return req, target, nil
}

func payloadErr(format string, args ...any) error {
	return fmt.Errorf("http:call: payload: %s: %w", fmt.Sprintf(format, args...), asynq.SkipRetry)
}

// retryAfter returns the wait a Retry-After header value asks for, relative
// to now: delta-seconds or an HTTP date (http.ParseTime). A missing or
// garbled value, or a date not after now, is 0. Values beyond a year are
// capped at a year.
func retryAfter(v string, now time.Time) time.Duration {
	const maxWait = 365 * 24 * time.Hour
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			// All digits but too large to parse: as long as we allow.
			if allDigits(v) {
				return maxWait
			}
			return 0
		}
		if secs > uint64(maxWait/time.Second) {
			return maxWait
		}
		return time.Duration(secs) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil || !t.After(now) {
		return 0
	}
	return min(t.Sub(now), maxWait)
}

// maxPause bounds the pause a rate-limit header can ask for.
const maxPause = 24 * time.Hour

// rateParam finds remaining (r) and reset (t) in the structured RateLimit
// header of the IETF drafts: "limit=100, remaining=0, reset=30" (one
// dictionary) or "default";r=0;t=30 (a list of policies, ';' parameters).
var rateParam = regexp.MustCompile(`(?:^|[\s,;])(remaining|reset|r|t)=(\d+)`)

// structured reads a structured RateLimit field: whether some policy in
// it has nothing remaining, and the latest reset among those.
func structured(v string) (remaining, reset string) {
	items := []string{v} // the dictionary form is one policy
	if strings.Contains(v, ";") {
		items = strings.Split(v, ",")
	}
	spent := int64(-1)
	for _, it := range items {
		var r, t string
		for _, m := range rateParam.FindAllStringSubmatch(it, -1) {
			switch m[1] {
			case "remaining", "r":
				r = m[2]
			case "reset", "t":
				t = m[2]
			}
		}
		switch {
		case r == "0":
			secs, _ := strconv.ParseInt(t, 10, 64)
			if secs > spent {
				spent, remaining, reset = secs, "0", t
			}
		case r != "" && remaining == "":
			remaining = r
		}
	}
	return remaining, reset
}

// quotaSpent reads the rate-limit headers of an answer: the IETF draft's
// RateLimit-Remaining and RateLimit-Reset (or one RateLimit field) and the
// common X-RateLimit-Remaining and X-RateLimit-Reset (delta seconds, Unix
// seconds past 10^9 as GitHub sends, or Unix milliseconds past 10^12). A
// structured field with several policies is spent when any is, until the
// latest reset among those. It reports
// whether they say nothing remains and, if so, how long until the quota
// resets (at most maxPause; 0 when the reset is missing or past).
func quotaSpent(h http.Header, now time.Time) (reset time.Duration, spent bool) {
	remaining, resetV := h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset")
	if remaining == "" {
		remaining, resetV = structured(h.Get("RateLimit"))
	}
	if remaining == "" {
		remaining, resetV = h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")
	}
	if remaining == "" {
		return 0, false // most answers: no parse, whose error allocates
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(remaining), 10, 64); err != nil || n > 0 {
		return 0, false
	}
	secs, err := strconv.ParseInt(strings.TrimSpace(resetV), 10, 64)
	switch {
	case err != nil || secs <= 0:
		return 0, true
	case secs > 1e12: // Unix milliseconds
		reset = time.UnixMilli(secs).Sub(now)
	case secs > 1e9:
		reset = time.Unix(secs, 0).Sub(now)
	default:
		reset = time.Duration(min(secs, int64(maxPause/time.Second))) * time.Second
	}
	return min(max(reset, 0), maxPause), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// drain reads (at most drainLen of) the body and closes it; when keep is
// set it returns the start of the body as a one-line snippet of at most
// snippetLen bytes.
func drain(body io.ReadCloser, keep bool) string {
	defer body.Close()
	var head []byte
	if keep {
		head, _ = io.ReadAll(io.LimitReader(body, snippetLen+utf8.UTFMax))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLen))
	return snippet(head)
}

// snippet turns raw bytes into one line of valid UTF-8 of at most
// snippetLen bytes, control characters as spaces, runs of spaces collapsed,
// "…" marking a cut.
func snippet(b []byte) string {
	s := strings.ToValidUTF8(string(b), "")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ' ' }), " ")
	if len(s) <= snippetLen && len(b) <= snippetLen {
		return s
	}
	const ellipsis = "…"
	cut := min(len(s), snippetLen-len(ellipsis))
	for cut > 0 && cut < len(s) && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// clip bounds user data quoted in an error message.
func clip(s string) string {
	if len(s) <= 100 {
		return s
	}
	cut := 100
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// IsToken reports whether s is a non-empty RFC 9110 token (method and
// header field names, such as the worker's http.settle_headers).
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether s may be sent as a header field value: no
// control characters other than horizontal tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// taskID is the Idempotency-Key of a call: the asynq task ID (a variable
// so that tests can call the handler without an asynq server).
var taskID = func(ctx context.Context) string {
	id, _ := asynq.GetTaskID(ctx)
	return id
}
