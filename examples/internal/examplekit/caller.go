package examplekit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/taskrl"
)

// defaultClient is Caller's HTTP client when it has none: it keeps
// connections open for the many goroutines of every worker.
var defaultClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// Caller is the asynq handler of a task that makes one call to a
// rate-limited HTTP API, as examples/quickstart's vendorHandler does. It
// sends the task's payload with
//   - Idempotency-Key set to the asynq task ID, which the task keeps
//     however often taskrl makes it wait, so that the API can tell a
//     repeated call;
//   - X-Business-ID set to the payload's "business_id", when it has one.
//
// A 429 becomes taskrl.Throttled with the answer's Retry-After (whole
// seconds), which backs every worker off and reschedules the task without
// spending a retry. Any other answer but a 2xx, and a network error, is an
// error asynq retries; a payload that is not JSON is not retried.
type Caller struct {
	// Method is the request's method. Default POST.
	Method string
	// URL is where to send the request.
	URL string
	// Name is who answers, for the errors: "vendor: 429 Too Many Requests".
	Name string
	// Client sends the requests. Default a client with a 10s timeout that
	// keeps up to 64 idle connections per host.
	Client *http.Client
	// OK and Throttled, when set, count the 2xx answers and the 429s.
	OK, Throttled *atomic.Int64
}

// ProcessTask implements asynq.Handler.
func (c *Caller) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p struct {
		BusinessID string `json:"business_id"`
	}
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("bad payload: %v: %w", err, asynq.SkipRetry)
	}
	method, client := c.Method, c.Client
	if method == "" {
		method = http.MethodPost
	}
	if client == nil {
		client = defaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL, strings.NewReader(string(t.Payload())))
	if err != nil {
		return fmt.Errorf("%v: %w", err, asynq.SkipRetry)
	}
	id, _ := asynq.GetTaskID(ctx)
	req.Header.Set("Idempotency-Key", id)
	if p.BusinessID != "" {
		req.Header.Set("X-Business-ID", p.BusinessID)
	}
	resp, err := client.Do(req)
	if err != nil {
		return err // a network error: asynq retries
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		count(c.Throttled)
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After")) // 0 when missing: taskrl waits 1s
		return taskrl.Throttled(time.Duration(secs)*time.Second, fmt.Errorf("%s: %s", c.Name, resp.Status))
	case resp.StatusCode/100 == 2:
		count(c.OK)
		return nil
	default:
		return fmt.Errorf("%s: %s", c.Name, resp.Status)
	}
}

func count(n *atomic.Int64) {
	if n != nil {
		n.Add(1)
	}
}
