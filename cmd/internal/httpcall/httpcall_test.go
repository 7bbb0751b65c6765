package httpcall

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// request is what the test server saw.
type request struct {
	Method string
	Path   string
	Header http.Header
	Body   string
	Host   string
}

// recorder is a test server that records requests and answers with reply.
type recorder struct {
	*httptest.Server
	mu    sync.Mutex
	reqs  []request
	reply func(w http.ResponseWriter, r *http.Request)
}

func newRecorder(t *testing.T, reply func(w http.ResponseWriter, r *http.Request)) *recorder {
	t.Helper()
	rec := &recorder{reply: reply}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, request{Method: r.Method, Path: r.URL.RequestURI(), Header: r.Header.Clone(), Body: string(b), Host: r.Host})
		rec.mu.Unlock()
		if rec.reply != nil {
			rec.reply(w, r)
		}
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (r *recorder) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.reqs...)
}

func (r *recorder) only(t *testing.T) request {
	t.Helper()
	reqs := r.requests()
	if len(reqs) != 1 {
		t.Fatalf("server saw %d requests, want 1", len(reqs))
	}
	return reqs[0]
}

func status(code int, body string, header ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, body)
	}
}

// Calls made without an asynq server carry Idempotency-Key orig-1.
func init() {
	taskID = func(ctx context.Context) string {
		if id, ok := asynq.GetTaskID(ctx); ok {
			return id
		}
		return "orig-1"
	}
}

// task builds an http:call task.
func task(t *testing.T, payload any) *asynq.Task {
	t.Helper()
	b, ok := payload.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(payload); err != nil {
			t.Fatal(err)
		}
	}
	return asynq.NewTask(TypeHTTPCall, b)
}

// classes records the result hook's calls.
type classes struct {
	mu  sync.Mutex
	got []string
}

func (c *classes) hook(class string) {
	c.mu.Lock()
	c.got = append(c.got, class)
	c.mu.Unlock()
}

func (c *classes) want(t *testing.T, want ...string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.Join(c.got, ",") != strings.Join(want, ",") {
		t.Errorf("result classes %q, want %q", c.got, want)
	}
}

func run(t *testing.T, payload any) (*classes, error) {
	t.Helper()
	c := &classes{}
	h := NewHandler(nil, WithResultHook(c.hook))
	return c, h.ProcessTask(context.Background(), task(t, payload))
}

func TestSuccessHeadersAndBody(t *testing.T) {
	srv := newRecorder(t, status(201, "created"))
	body := `{"to": "a@example.com",  "n": [1, 2.50, 12345678901234567890]}`
	payload := []byte(`{"url": "` + srv.URL + `/v1/send?x=1", "business_id": "b7",
		"headers": {"Authorization": "Bearer s3cret", "x-trace": "t 1"}, "body": ` + body + `}`)
	c, err := run(t, payload)
	if err != nil {
		t.Fatalf("2xx: got error %v", err)
	}
	c.want(t, Class2xx)
	r := srv.only(t)
	if r.Method != "POST" {
		t.Errorf("method %q, want POST (the default)", r.Method)
	}
	if r.Path != "/v1/send?x=1" {
		t.Errorf("path %q", r.Path)
	}
	if r.Body != body {
		t.Errorf("body %q, want the payload's body verbatim %q", r.Body, body)
	}
	for k, want := range map[string]string{
		"Content-Type":    "application/json",
		"Idempotency-Key": "orig-1",
		"X-Business-Id":   "b7",
		"Authorization":   "Bearer s3cret",
		"X-Trace":         "t 1",
		"User-Agent":      "taskrl-worker",
	} {
		if got := r.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
}

func TestMethodsAndBodies(t *testing.T) {
	cases := []struct {
		name, payload        string // payload after the url field
		method, body, ctype  string
		contentLengthPresent bool
	}{
		{"get no body", `"method": "GET"`, "GET", "", "", false},
		{"lower-case method", `"method": "put", "body": {"a": 1}`, "PUT", `{"a": 1}`, "application/json", true},
		{"null body", `"body": null`, "POST", "", "", false},
		{"absent body", `"business_id": "b1"`, "POST", "", "", false},
		{"string body", `"body": "hello"`, "POST", `"hello"`, "application/json", true},
		{"number body", `"body": 12345678901234567890`, "POST", `12345678901234567890`, "application/json", true},
		{"array body", `"body": [1, {"b": null}]`, "POST", `[1, {"b": null}]`, "application/json", true},
		{"content type from headers", `"headers": {"content-type": "application/vnd.x+json"}, "body": {}`, "POST", `{}`, "application/vnd.x+json", true},
		{"custom method", `"method": "PURGE"`, "PURGE", "", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRecorder(t, status(204, ""))
			_, err := run(t, []byte(`{"url": "`+srv.URL+`", `+tc.payload+`}`))
			if err != nil {
				t.Fatal(err)
			}
			r := srv.only(t)
			if r.Method != tc.method || r.Body != tc.body || r.Header.Get("Content-Type") != tc.ctype {
				t.Errorf("got %s %q content-type %q, want %s %q %q", r.Method, r.Body, r.Header.Get("Content-Type"), tc.method, tc.body, tc.ctype)
			}
		})
	}
}

func TestHandlerHeadersWin(t *testing.T) {
	srv := newRecorder(t, status(200, "ok"))
	_, err := run(t, map[string]any{
		"url": srv.URL, "business_id": "b2",
		"headers": map[string]string{"Idempotency-Key": "forged", "X-Business-ID": "other", "Host": "api.example.com"},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := srv.only(t)
	if got := r.Header.Get("Idempotency-Key"); got != "orig-1" {
		t.Errorf("Idempotency-Key %q, want the task's origin ID", got)
	}
	if got := r.Header.Get("X-Business-ID"); got != "b2" {
		t.Errorf("X-Business-ID %q, want the payload's business_id", got)
	}
	if r.Host != "api.example.com" {
		t.Errorf("Host %q, want the one from the payload's headers", r.Host)
	}
}

func TestNoBusinessID(t *testing.T) {
	srv := newRecorder(t, status(200, "ok"))
	if _, err := run(t, map[string]any{"url": srv.URL}); err != nil {
		t.Fatal(err)
	}
	if h := srv.only(t).Header; h.Get("X-Business-ID") != "" || len(h.Values("X-Business-Id")) != 0 {
		t.Errorf("X-Business-ID sent without business_id: %q", h.Values("X-Business-Id"))
	}
}

// TestNumericBusinessID: a numeric business_id (which a policy key renders
// as written) is sent as written, not refused.
func TestNumericBusinessID(t *testing.T) {
	srv := newRecorder(t, status(200, "ok"))
	if _, err := run(t, map[string]any{"url": srv.URL, "business_id": json.Number("12345678901")}); err != nil {
		t.Fatal(err)
	}
	if got := srv.only(t).Header.Get("X-Business-ID"); got != "12345678901" {
		t.Errorf("X-Business-ID %q, want 12345678901", got)
	}
}

func TestTooManyRequests(t *testing.T) {
	future := time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	cases := []struct {
		name, retryAfter string
		min, max         time.Duration
	}{
		{"seconds", "7", 7 * time.Second, 7 * time.Second},
		{"http date", future, 28 * time.Second, 30 * time.Second},
		{"past date", past, 0, 0},
		{"garbled", "soon", 0, 0},
		{"negative", "-5", 0, 0},
		{"missing", "", 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.retryAfter != "" {
				hdr = []string{"Retry-After", tc.retryAfter}
			}
			srv := newRecorder(t, status(429, `{"error":"slow down"}`, hdr...))
			c, err := run(t, map[string]any{"url": srv.URL})
			c.want(t, Class429)
			var te *taskrl.ThrottledError
			if !errors.As(err, &te) {
				t.Fatalf("429: got %v, want a *taskrl.ThrottledError", err)
			}
			if te.RetryAfter < tc.min || te.RetryAfter > tc.max {
				t.Errorf("RetryAfter %v, want in [%v, %v]", te.RetryAfter, tc.min, tc.max)
			}
			if errors.Is(err, asynq.SkipRetry) {
				t.Error("429 must not skip retry")
			}
			if !strings.Contains(err.Error(), "429") || !strings.Contains(err.Error(), "slow down") {
				t.Errorf("error %q lacks the status or the body", err)
			}
		})
	}
}

// TestUnavailableRetryAfter: a 503 that says when to come back is a
// throttle like a 429; without a usable Retry-After it is an ordinary
// server error.
func TestUnavailableRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		retryAfter string
		want       time.Duration // 0: not a throttle
	}{{"12", 12 * time.Second}, {"", 0}, {"soon", 0}, {"0", 0}} {
		var hdr []string
		if tc.retryAfter != "" {
			hdr = []string{"Retry-After", tc.retryAfter}
		}
		srv := newRecorder(t, status(503, "overloaded", hdr...))
		c, err := run(t, map[string]any{"url": srv.URL})
		c.want(t, Class5xx)
		var te *taskrl.ThrottledError
		switch {
		case tc.want > 0 && (!errors.As(err, &te) || te.RetryAfter != tc.want):
			t.Errorf("503 Retry-After %q: got %v, want a throttle for %v", tc.retryAfter, err, tc.want)
		case tc.want == 0 && (err == nil || errors.As(err, &te) || errors.Is(err, asynq.SkipRetry)):
			t.Errorf("503 Retry-After %q: got %v, want a plain error", tc.retryAfter, err)
		}
	}
}

func TestRetryAfterParse(t *testing.T) {
	now := time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                               0,
		"0":                              0,
		" 120 ":                          2 * time.Minute,
		"1.5":                            0,
		"abc":                            0,
		"99999999999999999999999":        365 * 24 * time.Hour,
		"Mon, 10 Mar 2025 12:00:45 GMT":  45 * time.Second,
		"Monday, 10-Mar-25 12:01:00 GMT": time.Minute,     // RFC 850
		"Mon Mar 10 12:00:05 2025":       5 * time.Second, // ANSI C
		"Mon, 10 Mar 2025 11:59:00 GMT":  0,
		"Mon, 10 Mar 2025 12:00:00 GMT":  0,
		"Mon, 99 Mar 2025 12:00:00 GMT":  0,
	}
	for v, want := range cases {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestClientErrorsSkipRetry(t *testing.T) {
	long := strings.Repeat("x", 150) + "é" + strings.Repeat("y", 500) + "TAIL"
	cases := []struct {
		code          int
		body, snippet string
	}{
		{400, "{\"error\":\n\t\"bad request\"}", `{"error": "bad request"}`},
		{404, "no such thing", "no such thing"},
		{422, long, strings.Repeat("x", 150) + "é"},
		{401, "", "401 Unauthorized"},
	}
	for _, tc := range cases {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			srv := newRecorder(t, status(tc.code, tc.body))
			c, err := run(t, map[string]any{"url": srv.URL + "/p?token=SECRET"})
			c.want(t, Class4xx)
			if !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("%d: got %v, want an error wrapping asynq.SkipRetry", tc.code, err)
			}
			var te *taskrl.ThrottledError
			if errors.As(err, &te) {
				t.Error("a 4xx other than 429 is not a throttle")
			}
			msg := err.Error()
			if !strings.Contains(msg, http.StatusText(tc.code)) || !strings.Contains(msg, tc.snippet) {
				t.Errorf("error %q lacks the status or snippet %q", msg, tc.snippet)
			}
			if strings.Contains(msg, "TAIL") || strings.Contains(msg, "SECRET") {
				t.Errorf("error %q quotes more than the snippet or the query string", msg)
			}
			if !strings.Contains(msg, "POST "+srv.URL+"/p") {
				t.Errorf("error %q does not name the target", msg)
			}
		})
	}
}

func TestServerErrorsRetry(t *testing.T) {
	for _, code := range []int{500, 502, 503} {
		srv := newRecorder(t, status(code, "upstream down"))
		c, err := run(t, map[string]any{"url": srv.URL})
		c.want(t, Class5xx)
		if err == nil || errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("%d: got %v, want a plain error (ordinary retry)", code, err)
		}
		var te *taskrl.ThrottledError
		if errors.As(err, &te) {
			t.Errorf("%d is not a throttle", code)
		}
		if !strings.Contains(err.Error(), http.StatusText(code)) || !strings.Contains(err.Error(), "upstream down") {
			t.Errorf("error %q lacks the status or body", err)
		}
	}
}

func TestOtherStatus(t *testing.T) {
	srv := newRecorder(t, status(304, ""))
	c, err := run(t, map[string]any{"url": srv.URL, "method": "GET"})
	c.want(t, ClassOther)
	if !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "304") {
		t.Fatalf("304: got %v, want a SkipRetry error naming the status", err)
	}
}

func TestNetworkError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, err := run(t, map[string]any{"url": "http://" + addr + "/x?key=SECRET"})
	c.want(t, ClassError)
	if err == nil || errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("connection refused: got %v, want a plain error", err)
	}
	if strings.Contains(err.Error(), "SECRET") {
		t.Errorf("error %q leaks the query string", err)
	}
}

func TestTimeouts(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	t.Run("client timeout", func(t *testing.T) {
		c := &classes{}
		h := NewHandler(NewClient(50*time.Millisecond, nil), WithResultHook(c.hook))
		err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": srv.URL}))
		if err == nil || errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("got %v, want a plain timeout error", err)
		}
		c.want(t, ClassError)
	})
	t.Run("task deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := NewHandler(nil).ProcessTask(ctx, task(t, map[string]any{"url": srv.URL}))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want context.DeadlineExceeded", err)
		}
	})
}

func TestBadPayloads(t *testing.T) {
	srv := newRecorder(t, status(200, "ok"))
	cases := []struct {
		name, payload, field string
	}{
		{"not json", `{"url": `, "not a valid JSON object"},
		{"not an object", `[1, 2]`, "not a valid JSON object"},
		{"url of wrong type", `{"url": 5}`, "url"},
		{"no url", `{"method": "GET"}`, "url: required"},
		{"relative url", `{"url": "/v1/send"}`, "url: must be an absolute http or https URL"},
		{"ftp url", `{"url": "ftp://example.com/f"}`, "url: must be an absolute http or https URL"},
		{"unparsable url", `{"url": "http://[::1"}`, "url:"},
		{"bad method", `{"url": "` + srv.URL + `", "method": "GE T"}`, "method: not a valid HTTP method"},
		{"bad header name", `{"url": "` + srv.URL + `", "headers": {"X Bad": "v"}}`, "headers: invalid header name"},
		{"bad header value", `{"url": "` + srv.URL + `", "headers": {"X-Ok": "a\r\nInjected: 1"}}`, `headers["X-Ok"]`},
		{"bad business id", `{"url": "` + srv.URL + `", "business_id": "b1\nX: y"}`, "business_id"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := run(t, []byte(tc.payload))
			if !errors.Is(err, asynq.SkipRetry) {
				t.Fatalf("got %v, want an error wrapping asynq.SkipRetry", err)
			}
			if !strings.Contains(err.Error(), "payload: "+tc.field) && !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %q", err, tc.field)
			}
			c.want(t) // nothing sent
		})
	}
	if n := len(srv.requests()); n != 0 {
		t.Errorf("bad payloads sent %d requests", n)
	}
}

// TestDrainsBodies checks that error bodies are read to the end and closed,
// so the connection is reused: five calls answered with 10 KB error pages
// use one connection.
func TestDrainsBodies(t *testing.T) {
	var conns atomic.Int64
	page := strings.Repeat("e", 10<<10)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, page)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	h := NewHandler(nil)
	for i := 0; i < 5; i++ {
		if err := h.ProcessTask(context.Background(), task(t, map[string]any{"url": srv.URL, "body": i})); !errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("5 sequential calls opened %d connections, want 1 (bodies not drained?)", n)
	}
}

func TestSnippet(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", ""},
		{"  a\n\tb\r\n  c  ", "a b c"},
		{"bad \xff\xfe utf8", "bad utf8"},
		{strings.Repeat("a", 200), strings.Repeat("a", 200)},
		{strings.Repeat("a", 201), strings.Repeat("a", 197) + "…"},
		{strings.Repeat("a", 196) + "€€€", strings.Repeat("a", 196) + "…"},
	}
	for _, tc := range cases {
		got := snippet([]byte(tc.in))
		if got != tc.want {
			t.Errorf("snippet(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if len(got) > snippetLen || !utf8.ValidString(got) {
			t.Errorf("snippet(%q) = %q: %d bytes or invalid UTF-8", tc.in, got, len(got))
		}
	}
}

// TestRealServer runs the handler in a real asynq server: the
// Idempotency-Key of a task is its asynq ID, and a 4xx is archived with the
// status and the body as the reason.
func TestRealServer(t *testing.T) {
	rc := redistest.Client(t)
	queue := redistest.Queue(t, rc, "httpcall")
	keys := make(chan string, 10)
	srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"error":"no such account"}`)
			return
		}
		keys <- r.Header.Get("Idempotency-Key")
	})
	inspector := asynq.NewInspectorFromRedisClient(rc)

	mux := asynq.NewServeMux()
	mux.Handle(TypeHTTPCall, NewHandler(nil))
	as := asynq.NewServerFromRedisClient(rc, asynq.Config{
		Queues: map[string]int{queue: 1}, Concurrency: 2, LogLevel: asynq.ErrorLevel,
		TaskCheckInterval: 50 * time.Millisecond,
	})
	if err := as.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer as.Shutdown()

	client := asynq.NewClientFromRedisClient(rc)
	payload, _ := json.Marshal(map[string]any{"url": srv.URL + "/ok"})
	if _, err := client.Enqueue(asynq.NewTask(TypeHTTPCall, payload), asynq.Queue(queue), asynq.TaskID("task-id-1")); err != nil {
		t.Fatal(err)
	}
	waitKey(t, keys, "task-id-1")

	missing, _ := json.Marshal(map[string]any{"url": srv.URL + "/missing"})
	info, err := client.Enqueue(asynq.NewTask(TypeHTTPCall, missing), asynq.Queue(queue), asynq.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ti, err := inspector.GetTaskInfo(queue, info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ti.State == asynq.TaskStateArchived {
			if !strings.Contains(ti.LastErr, "404 Not Found") || !strings.Contains(ti.LastErr, "no such account") {
				t.Errorf("archived with reason %q, want the status and the body", ti.LastErr)
			}
			if ti.Retried != 0 {
				t.Errorf("retried %d times before archiving, want 0", ti.Retried)
			}
			break
		}
		if ti.State == asynq.TaskStateRetry || time.Now().After(deadline) {
			t.Fatalf("4xx task is %v (last error %q), want archived", ti.State, ti.LastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitKey(t *testing.T, keys <-chan string, want string) {
	t.Helper()
	select {
	case got := <-keys:
		if got != want {
			t.Errorf("Idempotency-Key %q, want %q", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no request with Idempotency-Key %q within 30s", want)
	}
}

func TestQuotaSpent(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		name  string
		hdr   []string
		reset time.Duration
		spent bool
	}{
		{"no headers", nil, 0, false},
		{"draft fields", []string{"RateLimit-Remaining", "0", "RateLimit-Reset", "30"}, 30 * time.Second, true},
		{"draft fields, some left", []string{"RateLimit-Remaining", "3", "RateLimit-Reset", "30"}, 0, false},
		{"structured, names", []string{"RateLimit", "limit=100, remaining=0, reset=12"}, 12 * time.Second, true},
		{"structured, letters", []string{"RateLimit", `"default";r=0;t=7`}, 7 * time.Second, true},
		{"structured, some left", []string{"RateLimit", `"default";r=5;t=7`}, 0, false},
		{"structured, a later policy spent", []string{"RateLimit", `"sec";r=5;t=1, "day";r=0;t=3600`}, time.Hour, true},
		{"structured, an earlier policy spent", []string{"RateLimit", `"day";r=0;t=3600, "sec";r=5;t=1`}, time.Hour, true},
		{"structured, resets not mixed", []string{"RateLimit", `"a";r=3;t=3600, "b";r=0;t=2`}, 2 * time.Second, true},
		{"x- unix milliseconds", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1800000030000"}, 30 * time.Second, true},
		{"x- delta", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "45"}, 45 * time.Second, true},
		{"x- unix seconds", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1800000090"}, 90 * time.Second, true},
		{"x- unix seconds past", []string{"X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "1799999000"}, 0, true},
		{"no reset", []string{"X-RateLimit-Remaining", "0"}, 0, true},
		{"garbled remaining", []string{"RateLimit-Remaining", "none", "RateLimit-Reset", "30"}, 0, false},
		{"reset beyond a day", []string{"RateLimit-Remaining", "0", "RateLimit-Reset", "999999999"}, 24 * time.Hour, true},
	} {
		h := http.Header{}
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			h.Set(tc.hdr[i], tc.hdr[i+1])
		}
		if reset, spent := quotaSpent(h, now); reset != tc.reset || spent != tc.spent {
			t.Errorf("%s: quotaSpent = %v, %v; want %v, %v", tc.name, reset, spent, tc.reset, tc.spent)
		}
	}
}

// TestTooManyRequestsResetHeader: a 429 without Retry-After waits for the
// reset its rate-limit headers give.
func TestTooManyRequestsResetHeader(t *testing.T) {
	srv := newRecorder(t, status(429, "slow down", "RateLimit-Remaining", "0", "RateLimit-Reset", "9"))
	_, err := run(t, map[string]any{"url": srv.URL})
	var te *taskrl.ThrottledError
	if !errors.As(err, &te) || te.RetryAfter != 9*time.Second {
		t.Fatalf("got %v, want a throttle for 9s", err)
	}
}

// TestSettleHeader: under the middleware, a rule of burst 10 refilling one
// unit a minute with cost "{{.units}}" and settle header X-Actual-Cost: a
// call of 5 units answered "X-Actual-Cost: 1" leaves 9 units, so a call of
// 9 units passes at once; answered without the header (or with a garbled
// one), the estimate of 5 stands and a call of 9 would wait minutes.
func TestSettleHeader(t *testing.T) {
	for _, tc := range []struct {
		answer string // X-Actual-Cost of the first call; "" none
		runs   bool   // the second call of 9 runs at once
	}{{"1", true}, {"", false}, {"abc", false}} {
		t.Run("X-Actual-Cost="+tc.answer, func(t *testing.T) {
			rc := redistest.Client(t)
			queue := redistest.Queue(t, rc, "settle")
			calls := make(chan string, 10)
			srv := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.answer != "" {
					w.Header().Set("X-Actual-Cost", tc.answer)
				}
				calls <- r.URL.Path
			})
			p, err := policy.Parse([]byte(`
rules:
  - name: points
    match: {type: "http:call"}
    cost: "{{.units}}"
    gcra: {rate: 1, per: 1m, burst: 10}
`))
			if err != nil {
				t.Fatal(err)
			}
			m, err := taskrl.New(taskrl.Config{Policy: p, Client: rc, Prefix: redistest.Prefix(t)})
			if err != nil {
				t.Fatal(err)
			}
			mux := asynq.NewServeMux()
			mux.Use(m.Handler)
			mux.Handle(TypeHTTPCall, NewHandler(nil, WithSettleHeaders(func() map[string]string { return map[string]string{"points": "X-Actual-Cost"} })))
			as := asynq.NewServerFromRedisClient(rc, m.ServerConfig(asynq.Config{
				Queues: map[string]int{queue: 1}, Concurrency: 1, LogLevel: asynq.ErrorLevel,
				TaskCheckInterval: 50 * time.Millisecond,
			}))
			if err := as.Start(mux); err != nil {
				t.Fatal(err)
			}
			defer func() { as.Shutdown(); m.Close() }()
			client := asynq.NewClientFromRedisClient(rc)
			for i, units := range []int{5, 9} {
				payload, _ := json.Marshal(map[string]any{"url": srv.URL + "/" + string(rune('a'+i)), "units": units})
				if _, err := client.Enqueue(asynq.NewTask(TypeHTTPCall, payload), asynq.Queue(queue)); err != nil {
					t.Fatal(err)
				}
				wait := 3 * time.Second
				if i == 1 && !tc.runs {
					wait = time.Second // at once means within milliseconds
				}
				select {
				case <-calls:
				case <-time.After(wait):
					if i == 0 || tc.runs {
						t.Fatalf("the call of %d units did not run within %v", units, wait)
					}
					return // the estimate stood: the call of 9 waits
				}
				if i == 1 && !tc.runs {
					t.Errorf("the call of 9 ran at once: the estimate of 5 did not stand")
				}
			}
		})
	}
}
