// Package examplekittest holds what the runnable examples' tests share:
// running an example with its output in the test log, pointing it at the
// test harness's real redis-server (internal/testkit/redistest), and checking that
// it left nothing behind there.
package examplekittest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// Run calls an example's run(ctx, cfg, out) as its main would, logs what it
// printed, stops t at once if it fails, and returns what it measured.
func Run[C, R any](t testing.TB, run func(context.Context, C, io.Writer) (R, error), cfg C) R {
	t.Helper()
	var out bytes.Buffer
	res, err := run(context.Background(), cfg, &out)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// RedisURL is the URL of the harness's shared redis-server, for an
// example's REDIS_URL.
func RedisURL(t testing.TB) string {
	return "redis://" + redistest.Addr(t)
}

// CheckCleanedUp fails t if the harness's shared redis-server still holds
// anything of a run of example: a key under its taskrl prefix
// ("taskrl-example:EXAMPLE-*"), a key of one of its asynq queues
// ("asynq:{EXAMPLE-*"), or one of those queues in asynq's list of queues.
func CheckCleanedUp(t testing.TB, example string) {
	t.Helper()
	rdb := redistest.Client(t)
	ctx := context.Background()
	for _, pattern := range []string{"taskrl-example:" + example + "-*", "asynq:{" + example + "-*"} {
		if keys, err := rdb.Keys(ctx, pattern).Result(); err != nil || len(keys) > 0 {
			t.Errorf("left behind %q: %v %v", pattern, keys, err)
		}
	}
	if q, err := rdb.SMembers(ctx, "asynq:queues").Result(); err != nil || strings.Contains(" "+strings.Join(q, " "), " "+example+"-") {
		t.Errorf("asynq:queues still lists %v (%v)", q, err)
	}
}
