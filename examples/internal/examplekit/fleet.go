package examplekit

import (
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/taskrl"
)

// Fleet is the asynq servers ("workers") an example runs in its process,
// each with its own taskrl middleware. The zero Fleet is empty and ready to
// use; its methods are safe for concurrent use.
type Fleet struct {
	mu      sync.Mutex
	servers []*asynq.Server
	mws     []*taskrl.Middleware
}

// Add adds a started server and the middleware its ServeMux uses, for Stop.
func (f *Fleet) Add(srv *asynq.Server, mw *taskrl.Middleware) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.servers = append(f.servers, srv)
	f.mws = append(f.mws, mw)
}

// Stop shuts every server down, in parallel (each waits for its active
// tasks up to its ShutdownTimeout), and then closes every middleware, as a
// worker process does on exit: a middleware is closed after its server (see
// taskrl.Middleware.Close). It empties the fleet, so a second Stop does
// nothing.
func (f *Fleet) Stop() {
	f.mu.Lock()
	servers, mws := f.servers, f.mws
	f.servers, f.mws = nil, nil
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() { defer wg.Done(); s.Shutdown() }()
	}
	wg.Wait()
	for _, m := range mws {
		m.Close()
	}
}

// Workers describes the workers Env.StartWorkers starts.
type Workers struct {
	// N is how many workers (asynq servers) to start.
	N int
	// Config configures each worker's taskrl middleware. Its Client is
	// set to the worker's own Redis client.
	Config taskrl.Config
	// Queues are the queues each worker serves, with their priorities
	// (asynq.Config.Queues).
	Queues map[string]int
	// Handlers are the task handlers by task type, on every worker.
	Handlers map[string]asynq.Handler
}

// StartWorkers starts w.N workers into e.Fleet, each wired as
// examples/quickstart wires one by hand: its own client of e.Redis, as a
// separate process would have; a middleware from taskrl.New(w.Config) on
// that client; an asynq server on it configured through mw.ServerConfig,
// with 10 goroutines, w.Queues, warnings-only logging and a 3s shutdown
// timeout; and a ServeMux that uses mw.Handler in front of
// w.Handlers. If one fails to start, the ones already started keep running
// until e.Fleet.Stop (or Env.Close).
func (e *Env) StartWorkers(w Workers) error {
	for i := 0; i < w.N; i++ {
		rdb := e.Redis.Client()
		cfg := w.Config
		cfg.Client = rdb
		mw, err := taskrl.New(cfg)
		if err != nil {
			return err
		}
		srv := asynq.NewServerFromRedisClient(rdb, mw.ServerConfig(asynq.Config{
			Concurrency:     10,
			Queues:          w.Queues,
			LogLevel:        asynq.WarnLevel,
			ShutdownTimeout: 3 * time.Second,
		}))
		mux := asynq.NewServeMux()
		mux.Use(mw.Handler)
		for typ, h := range w.Handlers {
			mux.Handle(typ, h)
		}
		if err := srv.Start(mux); err != nil {
			mw.Close()
			return fmt.Errorf("starting worker %d: %w", i+1, err)
		}
		e.Fleet.Add(srv, mw)
	}
	return nil
}
