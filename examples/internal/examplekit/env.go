package examplekit

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// Env is what one run of an example has to itself: a Redis, a stand-in for
// the API its tasks call, a namespace for its queues and keys, and its
// workers.
type Env struct {
	// Redis is the Redis the run uses (Open).
	Redis *Server
	// Client is a client of Redis for the example itself: to enqueue, to
	// inspect the queues and to clean up.
	Client *redis.Client
	// API is the stand-in API, listening at URL.
	API *fakeapi.API
	URL string
	// NS is the run's namespace, Namespace(example): the example's queue
	// names start with it.
	NS string
	// Prefix is the run's taskrl key prefix, "taskrl-example:NS:".
	Prefix string
	// Fleet is the run's workers (StartWorkers, or added by hand).
	Fleet Fleet
}

// Setup opens the Redis at redisURL (Open: "" starts the embedded one),
// starts a stand-in API with limits, and picks the run's namespace. Call
// Close when done.
func Setup(example, redisURL string, limits fakeapi.Limits) (*Env, error) {
	rs, err := Open(redisURL)
	if err != nil {
		return nil, err
	}
	api, err := fakeapi.New(limits)
	if err != nil {
		rs.Close()
		return nil, err
	}
	url, err := api.Start()
	if err != nil {
		rs.Close()
		return nil, err
	}
	ns := Namespace(example)
	return &Env{Redis: rs, Client: rs.Client(), API: api, URL: url, NS: ns, Prefix: "taskrl-example:" + ns + ":"}, nil
}

// Close stops the workers (Fleet.Stop), deletes the queues named and every
// key under Prefix (Cleanup; a failure is printed to out as "cleanup: ..."),
// stops the API and closes Redis. It cleans up even when ctx is done.
func (e *Env) Close(ctx context.Context, out io.Writer, queues ...string) {
	e.Fleet.Stop()
	if err := Cleanup(context.WithoutCancel(ctx), e.Client, e.Prefix, queues...); err != nil {
		fmt.Fprintln(out, "cleanup:", err)
	}
	e.API.Close()
	e.Redis.Close()
}

// Main is an example's main once its flags are parsed into cfg: it calls
// run(ctx, cfg, os.Stdout) with a ctx that SIGINT and SIGTERM cancel, and
// if run fails prints "NAME: FAILED: ..." to stderr and exits 1.
func Main[C, R any](name string, run func(context.Context, C, io.Writer) (R, error), cfg C) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	_, err := run(ctx, cfg, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+": FAILED:", err)
		os.Exit(1)
	}
}
