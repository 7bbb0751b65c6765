package gcra

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/batch"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
)

//go:embed gcra.lua
var gcraLua string

// gcraProgram runs as a script: its library is small.
var gcraProgram = script.NewScriptProgram(gcraLua, "gcra")

// DefaultPrefix is the key prefix used when Config.Prefix is empty.
const DefaultPrefix = "taskrl:"

// explicitTTLFloor is the shortest TTL a key gets when the limiter runs on an
// explicit clock: keys still expire by the server's clock, which an explicit
// clock may outrun, so they must outlive the run that drives it.
const explicitTTLFloor = time.Hour

// Config configures a Limiter.
type Config struct {
	// Client is the Redis connection: a *redis.Client, *redis.ClusterClient
	// or *redis.Ring. Required.
	Client redis.UniversalClient
	// Prefix starts every key the limiter writes. Default DefaultPrefix
	// ("taskrl:"). At most 64 printable ASCII bytes without spaces, '{' or
	// '}'.
	Prefix string
	// Now, when set, supplies the time of every decision instead of the
	// Redis server's TIME. It exists for tests and simulations; leave it nil
	// in production so that worker clocks never enter a decision. Keys
	// written under an explicit clock live at least an hour of server time.
	Now func() time.Time
	// MaxBatch is how many concurrent requests one script call may carry
	// on a single Redis (a *redis.Client): while a few calls are in
	// flight, requests wait and go together in the next call, one round
	// trip for all of them, each still decided atomically on its own key,
	// in arrival order. A lone request never waits. A Redis error (such as
	// a timeout) fails every request of the call. 0 means 32; 1 sends
	// every request in its own call. On Redis Cluster and Ring every
	// request has its own call.
	MaxBatch int
}

// Limiter is a GCRA rate limiter whose state lives in Redis, so every process
// sharing the Redis shares the limit. Each decision is one run of one script
// on one key (EVALSHA, loading the script again after a script flush;
// concurrent decisions may share a call, Config.MaxBatch), so decisions are
// atomic across any number of processes, and each key lives only until it
// is back at its full burst.
//
// A Limiter is safe for concurrent use.
type Limiter struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
	batch  *batch.Batcher // nil on Cluster and Ring
}

// New validates cfg and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("gcra: Config.Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if err := keys.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("gcra: Config.Prefix: %w", err)
	}
	switch {
	case cfg.MaxBatch < 0:
		return nil, fmt.Errorf("gcra: Config.MaxBatch must not be negative, got %d", cfg.MaxBatch)
	case cfg.MaxBatch == 0:
		cfg.MaxBatch = 32
	}
	l := &Limiter{client: cfg.Client, prefix: cfg.Prefix, now: cfg.Now}
	if _, single := cfg.Client.(*redis.Client); single {
		l.batch = batch.New(cfg.Client, gcraProgram, joinRequests, "gcra", cfg.MaxBatch)
	}
	return l, nil
}

// joinRequests is the batch.Join of the script: the number of requests,
// then each request's 7 arguments.
func joinRequests(cmd []any, jobs []*batch.Job) []any {
	cmd = append(cmd, len(jobs))
	for _, j := range jobs {
		cmd = append(cmd, j.Args...)
	}
	return cmd
}

// Key returns the Redis key holding the state of key. The key is built with
// internal encoding: any bytes are allowed in key, and the result always has
// the form PREFIX "gcra:{" ENCODED "}", at most about 140 bytes, hash-tagged on
// the encoded key.
func (l *Limiter) Key(key string) string {
	return keys.GCRA(l.prefix, key)
}

// Allow is AllowN with a cost of 1.
func (l *Limiter) Allow(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.AllowN(ctx, key, limit, 1)
}

// AllowN admits a request of cost n against key if it conforms to limit now,
// charging it; otherwise it charges nothing and RetryAfter says how long
// until it would conform. A cost of 0 peeks without charging, and a cost
// above limit.Burst is never allowed (RetryAfter is Never). A denial is a
// Result; the error is for invalid input and Redis failures.
func (l *Limiter) AllowN(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	return l.run(ctx, key, limit, n, opAllow, 0)
}

// Peek reports the state of key under limit without charging: whether a
// request would be allowed, Remaining and ResetAfter. It is AllowN with cost 0.
func (l *Limiter) Peek(ctx context.Context, key string, limit Limit) (Result, error) {
	return l.run(ctx, key, limit, 0, opAllow, 0)
}

// Reserve books the earliest moment a request of cost n conforms, if that
// moment is at most maxWait away, and charges it now: Allowed is true and the
// caller must wait Delay before acting. This is how a task is rescheduled to
// exactly when it may run. If the moment is further than maxWait, nothing is
// charged, Allowed is false and RetryAfter is the wait. Cancel a booking with
// Refund. A cost above limit.Burst is never booked.
func (l *Limiter) Reserve(ctx context.Context, key string, limit Limit, n int, maxWait time.Duration) (Result, error) {
	return l.run(ctx, key, limit, n, opReserve, maxWait)
}

// Refund gives back n units charged to key, as if the requests had never
// been made; refunding more than was charged leaves the key full, never in
// credit. Use it when an admitted request did not happen or a reservation is
// cancelled.
func (l *Limiter) Refund(ctx context.Context, key string, limit Limit, n int) (Result, error) {
	return l.run(ctx, key, limit, n, opRefund, 0)
}

// Reset deletes the state of key: it is back at its full burst.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	return l.client.Del(ctx, l.Key(key)).Err()
}

func (l *Limiter) run(ctx context.Context, key string, limit Limit, n int, o op, maxWait time.Duration) (Result, error) {
	args, err := l.args(limit, n, o, maxWait)
	if err != nil {
		return Result{}, err
	}
	var reply []any
	k := []string{l.Key(key)}
	if l.batch != nil {
		reply, err = l.batch.Do(ctx, k, args, 0)
	} else {
		cmd := append(gcraProgram.Head(1), k[0], 1)
		var all []any
		all, err = gcraProgram.Run(ctx, l.client, append(cmd, args...)).Slice()
		if err != nil {
			err = fmt.Errorf("gcra: %w", err)
		} else if len(all) == 1 {
			reply, _ = all[0].([]any)
		}
	}
	if err != nil {
		return Result{}, err
	}
	return parseReply(reply, limit)
}

// args returns the script arguments of one request (gcra.lua).
func (l *Limiter) args(limit Limit, n int, o op, maxWait time.Duration) ([]any, error) {
	r, err := newRequest(limit, n, o, maxWait)
	if err != nil {
		return nil, err
	}
	now, ttlFloor := int64(-1), int64(0)
	if l.now != nil {
		if now, err = checkTime(l.now()); err != nil {
			return nil, err
		}
		ttlFloor = explicitTTLFloor.Milliseconds()
	}
	return []any{r.em, r.burst, r.n, int(o), r.maxWait, now, ttlFloor}, nil
}

// parseReply reads one request's script reply.
func parseReply(reply []any, limit Limit) (Result, error) {
	if len(reply) != 6 {
		return Result{}, fmt.Errorf("gcra: unexpected script reply %v", reply)
	}
	var v [6]int64
	for i, x := range reply {
		n, ok := x.(int64)
		if !ok {
			return Result{}, fmt.Errorf("gcra: unexpected script reply %v", reply)
		}
		v[i] = n
	}
	d := decision{allowed: v[0] == 1, remaining: v[1], retryAfter: v[2], resetAfter: v[3], delay: v[4]}
	return d.result(limit, v[5]), nil
}
