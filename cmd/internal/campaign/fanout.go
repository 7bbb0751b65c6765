package campaign

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
)

// FanoutRetention is how long asynq keeps a fanned-out task after it
// completes, so that its ID stays taken while a failed fan-out may still be
// retried and resume (see the package documentation).
const FanoutRetention = time.Hour

// DefaultChunk is how many tasks a fan-out enqueues between two checkpoints
// of its progress.
const DefaultChunk = 1000

// FanoutOption configures NewFanoutHandler.
type FanoutOption func(*fanout)

// WithLogger sets the logger of the fan-out handler. Default slog.Default().
func WithLogger(l *slog.Logger) FanoutOption {
	return func(f *fanout) {
		if l != nil {
			f.log = l
		}
	}
}

// WithParallel sets how many enqueue calls a fan-out keeps in flight.
// Default (and for n < 1) DefaultParallel.
func WithParallel(n int) FanoutOption {
	return func(f *fanout) {
		if n >= 1 {
			f.parallel = n
		}
	}
}

type fanout struct {
	rdb      redis.UniversalClient
	client   *asynq.Client
	log      *slog.Logger
	parallel int
	chunk    int
}

// NewFanoutHandler returns the asynq handler of TypeFanout tasks: it
// enqueues the campaign a fan-out's Spec describes, once per tick of its
// schedule however many fan-out tasks arrive for that tick (see the package
// documentation), into rdb, which must be the Redis of the campaign's queue.
//
// A fan-out whose payload is not a valid Spec is archived (asynq.SkipRetry)
// with the reason. A fan-out for a tick another fan-out claimed returns nil
// and logs it. Redis errors are returned, so asynq retries the fan-out, which
// then resumes the same tick. The handler is safe for concurrent use.
//
// In a worker:
//
//	mux.Handle(campaign.TypeFanout, campaign.NewFanoutHandler(rdb))
func NewFanoutHandler(rdb redis.UniversalClient, opts ...FanoutOption) asynq.Handler {
	f := &fanout{
		rdb:      rdb,
		client:   asynq.NewClientFromRedisClient(rdb),
		log:      slog.Default(),
		parallel: DefaultParallel,
		chunk:    DefaultChunk,
	}
	for _, o := range opts {
		o(f)
	}
	return f
}

// campaignKeys builds the Redis keys of one campaign. Every key carries the
// campaign name as its hash tag.
type campaignKeys struct{ base string }

func keysFor(s Spec) campaignKeys {
	return campaignKeys{base: s.Prefix + "campaign:{" + keys.Encode(s.Name) + "}:"}
}

// claim holds the ID of the fan-out task that fans out the tick.
func (k campaignKeys) claim(tick time.Time) string {
	return k.base + strconv.FormatInt(tick.Unix(), 10)
}

// done holds how many of the tick's tasks are known to be enqueued.
func (k campaignKeys) done(tick time.Time) string {
	return k.claim(tick) + ":done"
}

// task holds the tick (Unix seconds) a fan-out task belongs to.
func (k campaignKeys) task(id string) string {
	return k.base + "task:" + keys.Encode(id)
}

// TaskID returns the asynq task ID of task i of a campaign's tick:
// NAME ":" TICK_UNIX ":" I.
func TaskID(name string, tick time.Time, i int) string {
	return name + ":" + strconv.FormatInt(tick.Unix(), 10) + ":" + strconv.Itoa(i)
}

// decodeFanout parses and validates a fan-out payload.
func decodeFanout(payload []byte) (Spec, *Schedule, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, nil, fmt.Errorf("campaign: fan-out payload is not a campaign: %v", err)
	}
	s = s.Normalize()
	if err := s.Validate(); err != nil {
		return Spec{}, nil, fmt.Errorf("campaign: fan-out payload: %v", err)
	}
	if s.Name == "" {
		return Spec{}, nil, errors.New("campaign: fan-out payload: name: required")
	}
	if s.Cron == "" {
		return Spec{}, nil, errors.New("campaign: fan-out payload: cron: required")
	}
	sched, err := ParseSchedule(s.Cron, s.TZ)
	if err != nil {
		return Spec{}, nil, fmt.Errorf("campaign: fan-out payload: cron: %v", err)
	}
	return s, sched, nil
}

// ProcessTask fans out one tick of the campaign.
func (f *fanout) ProcessTask(ctx context.Context, t *asynq.Task) error {
	spec, sched, err := decodeFanout(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		return fmt.Errorf("campaign: fan-out of %q: no asynq task ID in the context: %w", spec.Name, asynq.SkipRetry)
	}
	k := keysFor(spec)
	ttl := sched.ClaimTTL()
	log := f.log.With("campaign", spec.Name, "fanout_task", id)

	tick, err := recordTick(ctx, f.rdb, k, sched, id, ttl)
	if err != nil {
		return fmt.Errorf("campaign %q: %w", spec.Name, err)
	}
	log = log.With("tick", tick.UTC().Format(time.RFC3339), "tick_unix", tick.Unix())

	// Claim the tick, or find who has.
	claimed, err := f.rdb.SetNX(ctx, k.claim(tick), id, ttl).Result()
	if err != nil {
		return fmt.Errorf("campaign %q: claim tick %d: %w", spec.Name, tick.Unix(), err)
	}
	if !claimed {
		owner, err := f.rdb.Get(ctx, k.claim(tick)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			// The claim expired between the two calls: the tick is
			// older than its TTL, long done.
			log.Warn("campaign tick claim expired; not fanning out", "outcome", "expired")
			return nil
		case err != nil:
			return fmt.Errorf("campaign %q: read claim of tick %d: %w", spec.Name, tick.Unix(), err)
		case owner != id:
			log.Info("campaign tick already fanned out by another fan-out task", "outcome", "duplicate", "owner", owner)
			return nil
		}
		log.Info("campaign tick claimed by this task before: resuming", "outcome", "resume")
	}

	from := 0
	if !claimed {
		n, err := f.rdb.Get(ctx, k.done(tick)).Int()
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("campaign %q: read progress of tick %d: %w", spec.Name, tick.Unix(), err)
		}
		from = min(max(n, 0), spec.Len())
	}

	start := time.Now()
	total := Counts{}
	opts := spec.Options()
	src := func(i int) (*asynq.Task, []asynq.Option) {
		o := make([]asynq.Option, len(opts), len(opts)+2)
		copy(o, opts)
		return asynq.NewTask(spec.Type, spec.Payload(i)), append(o, asynq.TaskID(TaskID(spec.Name, tick, i)), asynq.Retention(FanoutRetention))
	}
	for lo := from; lo < spec.Len(); lo += f.chunk {
		hi := min(lo+f.chunk, spec.Len())
		c, err := Enqueue(ctx, f.client, lo, hi, f.parallel, src, nil)
		total.Enqueued += c.Enqueued
		total.Existing += c.Existing
		if err != nil {
			log.Error("campaign fan-out failed; asynq will retry it", "enqueued", total.Enqueued, "err", err)
			return fmt.Errorf("campaign %q tick %d: %d tasks enqueued, then: %w", spec.Name, tick.Unix(), total.Enqueued, err)
		}
		if err := f.rdb.Set(ctx, k.done(tick), hi, ttl).Err(); err != nil {
			return fmt.Errorf("campaign %q: save progress of tick %d: %w", spec.Name, tick.Unix(), err)
		}
	}
	log.Info("campaign fanned out", "outcome", "fanned_out", "tasks", spec.Len(), "from", from,
		"enqueued", total.Enqueued, "existing", total.Existing, "queue", spec.Queue, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// recordTick returns the tick the fan-out task id belongs to: the one
// recorded for it (by the scheduler that enqueued it, or by an earlier
// attempt), or else Tick of the Redis server's time, which it records.
func recordTick(ctx context.Context, rdb redis.UniversalClient, k campaignKeys, sched *Schedule, id string, ttl time.Duration) (time.Time, error) {
	if u, err := rdb.Get(ctx, k.task(id)).Int64(); err == nil {
		return time.Unix(u, 0).In(sched.Location()), nil
	} else if !errors.Is(err, redis.Nil) {
		return time.Time{}, fmt.Errorf("read the tick of fan-out task %s: %w", id, err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("read the Redis server's time: %w", err)
	}
	tick := sched.Tick(now)
	ok, err := rdb.SetNX(ctx, k.task(id), tick.Unix(), ttl).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("record the tick of fan-out task %s: %w", id, err)
	}
	if ok {
		return tick, nil
	}
	// Recorded meanwhile (by the scheduler, or a concurrent delivery).
	u, err := rdb.Get(ctx, k.task(id)).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("read the tick of fan-out task %s: %w", id, err)
	}
	return time.Unix(u, 0).In(sched.Location()), nil
}
