package taskrl

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// BenchmarkHandlerNewGoroutine runs each task through the middleware on a
// new goroutine, as asynq does, beside 300 idle goroutines (a worker's
// asynq, Redis and HTTP goroutines), which keep the runtime's starting
// stack small: what growStack saves shows here, not in a loop on one
// goroutine. "other" matches no rule; "http:call" a prefetching GCRA rule
// that never binds. The handler decodes the payload as JSON.
func BenchmarkHandlerNewGoroutine(b *testing.B) {
	p, err := policy.Parse([]byte(`rules:
  - name: peak
    match: {type: "http:call"}
    prefetch: 9ms
    gcra: {rate: 1000000, per: 1s, burst: 100000}
`))
	if err != nil {
		b.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: redistest.Client(b), Prefix: redistest.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	idle := make(chan struct{})
	defer close(idle)
	for i := 0; i < 300; i++ {
		go func() { <-idle }()
	}
	payload := []byte(`{"url": "http://127.0.0.1:1/v1/charge", "method": "POST", "business_id": "b1", "headers": {"a": "b"}, "body": {"x": [1, 2, 3]}}`)
	h := m.Handler(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
		var v map[string]any
		return json.Unmarshal(t.Payload(), &v)
	}))
	for _, typ := range []string{"other", "http:call"} {
		task := asynq.NewTask(typ, payload)
		b.Run(typ, func(b *testing.B) {
			b.ReportAllocs()
			done := make(chan error)
			for i := 0; i < b.N; i++ {
				go func() { done <- h.ProcessTask(context.Background(), task) }()
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
