package examplekit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// EnvVar names the environment variable holding the URL of a real Redis,
// e.g. redis://localhost:6379/0.
const EnvVar = "REDIS_URL"

// Server is the Redis an example runs against. Its methods are safe for
// concurrent use.
type Server struct {
	opt *redis.Options
	mr  *miniredis.Miniredis

	stop, done chan struct{} // age's
	closeOnce  sync.Once

	mu      sync.Mutex
	clients []*redis.Client
}

// ttlTick is how often the embedded server's TTLs are aged.
const ttlTick = 10 * time.Millisecond

// age makes the embedded server's keys expire on the real clock, as they
// would on Redis, to within ttlTick: miniredis only ages TTLs on request.
// Its ClockTTL option does the same on every command, but it walks every
// key in sorted order each time, and with the few thousand keys of a
// campaign that took 60 % of the quickstart's CPU and held its scripts up
// by seconds during the first fan-out.
func (s *Server) age() {
	defer close(s.done)
	t := time.NewTicker(ttlTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mr.FastForward(now.Sub(last))
			last = now
		}
	}
}

// Open connects to the Redis at url (redis://, rediss:// or unix:// syntax,
// as redis.ParseURL reads it; pass os.Getenv(EnvVar)), or, when url is "",
// starts an embedded miniredis on a free loopback port. Call Close when done.
func Open(url string) (*Server, error) {
	if url == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("starting the embedded Redis (miniredis): %w", err)
		}
		s := &Server{opt: &redis.Options{Addr: mr.Addr()}, mr: mr, stop: make(chan struct{}), done: make(chan struct{})}
		go s.age()
		return s, nil
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvVar, err)
	}
	s := &Server{opt: opt}
	if err := s.Client().Ping(context.Background()).Err(); err != nil {
		s.Close()
		return nil, fmt.Errorf("%s: cannot reach Redis at %s: %w", EnvVar, opt.Addr, err)
	}
	return s, nil
}

// Embedded reports whether s is the embedded miniredis.
func (s *Server) Embedded() bool { return s.mr != nil }

// String describes the server for the examples' output, without any
// password: "embedded miniredis at 127.0.0.1:PORT" or "Redis at HOST:PORT
// (REDIS_URL)".
func (s *Server) String() string {
	if s.mr != nil {
		return "embedded miniredis at " + s.opt.Addr + " (set " + EnvVar + " to use a real Redis)"
	}
	return fmt.Sprintf("Redis at %s db %d (%s)", s.opt.Addr, s.opt.DB, EnvVar)
}

// Client returns a new client (its own connection pool) to the server, as a
// separate worker process would have. Close closes it.
func (s *Server) Client() *redis.Client {
	opt := *s.opt
	c := redis.NewClient(&opt)
	s.mu.Lock()
	s.clients = append(s.clients, c)
	s.mu.Unlock()
	return c
}

// ConnOpt returns the server's address and credentials for the asynq
// constructors that open their own connection (asynq.NewScheduler).
func (s *Server) ConnOpt() asynq.RedisClientOpt {
	return asynq.RedisClientOpt{
		Network:   s.opt.Network,
		Addr:      s.opt.Addr,
		Username:  s.opt.Username,
		Password:  s.opt.Password,
		DB:        s.opt.DB,
		TLSConfig: s.opt.TLSConfig,
	}
}

// Close closes every client Client returned and stops the embedded server.
func (s *Server) Close() error {
	s.mu.Lock()
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()
	var errs []error
	for _, c := range clients {
		if err := c.Close(); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if s.mr != nil {
		s.closeOnce.Do(func() {
			close(s.stop)
			<-s.done
			s.mr.Close()
		})
	}
	return errors.Join(errs...)
}

// Namespace returns a name unique to this run, e.g. "quickstart-3f9a1c",
// to derive queue names and a key prefix from. It is made of [a-z0-9-] only,
// so it is safe in Redis key patterns.
func Namespace(example string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return example + "-" + hex.EncodeToString(b)
}

// Cleanup removes what a run left behind: the asynq queues named (with
// their tasks and statistics) and every key starting with prefix (taskrl's
// limiter and pacing state, which would otherwise expire on its own).
// Queues must have no active task (shut the servers down first). It only
// deletes keys whose names start with prefix or with asynq's "asynq:{QUEUE}"
// for the queues given; it never FLUSHes.
func Cleanup(ctx context.Context, rdb *redis.Client, prefix string, queues ...string) error {
	var errs []error
	ins := asynq.NewInspectorFromRedisClient(rdb)
	for _, q := range queues {
		if err := ins.DeleteQueue(q, true); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			errs = append(errs, fmt.Errorf("deleting queue %s: %w", q, err))
		}
		// DeleteQueue leaves the queue's daily and total statistics.
		errs = append(errs, unlinkMatching(ctx, rdb, "asynq:{"+escapeGlob(q)+"}:*"))
	}
	if prefix != "" {
		errs = append(errs, unlinkMatching(ctx, rdb, escapeGlob(prefix)+"*"))
	}
	return errors.Join(errs...)
}

// unlinkMatching deletes the keys matching a SCAN pattern.
func unlinkMatching(ctx context.Context, rdb *redis.Client, pattern string) error {
	iter := rdb.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := rdb.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scanning %q: %w", pattern, err)
	}
	return flush()
}

// escapeGlob escapes the characters SCAN MATCH treats specially.
func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}
