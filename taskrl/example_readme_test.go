package taskrl_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// callVendor and retryAfter stand for the handler's own code in the
// README's snippet.
func callVendor(ctx context.Context, idempotencyKey string, payload []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.vendor.example/v1/send", strings.NewReader(string(payload)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", idempotencyKey)
	return http.DefaultClient.Do(req)
}

func retryAfter(resp *http.Response) time.Duration {
	s, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	return time.Duration(s) * time.Second
}

// Example_readme is the README's library snippet ("Use it from Go"),
// compiled with the package's tests: TestReadmeSnippet checks that the
// README shows this body as it is.
func Example_readme() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	p, err := policy.LoadFile("policy.yaml") // or policy.Parse, policy.New
	if err != nil {
		log.Fatal(err)
	}
	mw, err := taskrl.New(taskrl.Config{Policy: p, Client: rdb})
	if err != nil {
		log.Fatal(err)
	}
	defer mw.Close()

	srv := asynq.NewServerFromRedisClient(rdb, mw.ServerConfig(asynq.Config{Concurrency: 20}))
	mux := asynq.NewServeMux()
	mux.Use(mw.Handler) // every task passes its rules before the handler runs
	mux.HandleFunc("vendor:call", func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx) // the same however often the task waits
		resp, err := callVendor(ctx, id, t.Payload())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			// Every worker backs off this task's rules; the task waits, its retries untouched.
			return taskrl.Throttled(retryAfter(resp), errors.New(resp.Status))
		}
		return nil
	})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// TestReadmeSnippet: the README's Go snippet is Example_readme's body, so
// it compiles against the current API.
func TestReadmeSnippet(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n## Use it from Go\n.*?```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no Go snippet under \"## Use it from Go\"")
	}
	src, err := os.ReadFile("example_readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	body := regexp.MustCompile("(?s)\nfunc Example_readme\\(\\) \\{\n(.*?)\n\\}\n").FindSubmatch(src)
	if body == nil {
		t.Fatal("no Example_readme in example_readme_test.go")
	}
	var lines []string
	for _, l := range strings.Split(string(body[1]), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	if want := strings.Join(lines, "\n") + "\n"; string(m[1]) != want {
		t.Errorf("README.md's Go snippet is not Example_readme's body; README:\n%s\nExample_readme:\n%s", m[1], want)
	}
}
