package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// FanoutTask returns the fan-out task of a recurring campaign and the options
// its scheduler enqueues it with: on the campaign's queue, asynq.Unique for
// Schedule.UniqueTTL when that is at least 1s. spec must have a Name and a
// Cron; it is validated.
func FanoutTask(spec Spec) (*asynq.Task, []asynq.Option, *Schedule, error) {
	spec = spec.Normalize()
	if err := spec.Validate(); err != nil {
		return nil, nil, nil, err
	}
	if spec.Name == "" {
		return nil, nil, nil, errors.New("name: required for a recurring campaign")
	}
	if spec.Cron == "" {
		return nil, nil, nil, errors.New("cron: required for a recurring campaign")
	}
	sched, err := ParseSchedule(spec.Cron, spec.TZ)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cron: %v", err)
	}
	payload, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, nil, err
	}
	opts := []asynq.Option{asynq.Queue(spec.Queue)}
	if ttl := sched.UniqueTTL(); ttl > 0 {
		opts = append(opts, asynq.Unique(ttl))
	}
	return asynq.NewTask(TypeFanout, payload), opts, sched, nil
}

// RunScheduler runs an asynq Scheduler on rdb that enqueues spec's fan-out
// task (FanoutTask) at every tick of its schedule, until ctx is done; then it
// shuts the scheduler down and returns nil. It returns an error at once when
// spec is invalid or the scheduler cannot start. After each enqueue it
// records which tick the fan-out belongs to (Schedule.Tick of the Redis
// server's time), so that a fan-out a worker runs late still counts for its
// own tick. Log lines go to logger (slog.Default() if nil). rdb stays open.
func RunScheduler(ctx context.Context, rdb redis.UniversalClient, spec Spec, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.Default()
	}
	spec = spec.Normalize()
	task, opts, sched, err := FanoutTask(spec)
	if err != nil {
		return err
	}
	k := keysFor(spec)
	log := logger.With("campaign", spec.Name)
	post := func(info *asynq.TaskInfo, err error) {
		switch {
		case errors.Is(err, asynq.ErrDuplicateTask):
			log.Debug("fan-out already enqueued for this tick by another scheduler")
			return
		case err != nil:
			log.Error("could not enqueue the campaign's fan-out task", "err", err)
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		tick, err := recordTick(rctx, rdb, k, sched, info.ID, sched.ClaimTTL())
		if err != nil {
			// The handler records the tick itself when it runs.
			log.Warn("could not record the fan-out's tick", "fanout_task", info.ID, "err", err)
			return
		}
		log.Info("fan-out enqueued", "fanout_task", info.ID, "tick", tick.UTC().Format(time.RFC3339), "queue", spec.Queue)
	}
	s := asynq.NewSchedulerFromRedisClient(rdb, &asynq.SchedulerOpts{
		Location:        sched.Location(),
		Logger:          asynqLogger{logger},
		LogLevel:        asynq.WarnLevel,
		PostEnqueueFunc: post,
	})
	if _, err := s.Register(spec.Cron, task, opts...); err != nil {
		return fmt.Errorf("register the fan-out with asynq's scheduler: %w", err)
	}
	if err := s.Start(); err != nil {
		return err
	}
	log.Info("campaign scheduled", "schedule", sched.String(), "next_tick", sched.Next(time.Now()).Format(time.RFC3339),
		"queue", spec.Queue, "type", spec.Type, "tasks_per_tick", spec.Len())
	<-ctx.Done()
	s.Shutdown()
	return nil
}

// asynqLogger forwards asynq's log lines to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) log(level slog.Level, args ...any) {
	msg := fmt.Sprint(args...)
	// The scheduler tries to close the client it was given, which it does
	// not own; that is expected, not an error.
	if strings.Contains(msg, "redis connection is shared") {
		level = slog.LevelDebug
	}
	a.l.Log(context.Background(), level, msg, "component", "asynq")
}

func (a asynqLogger) Debug(args ...any) { a.log(slog.LevelDebug, args...) }
func (a asynqLogger) Info(args ...any)  { a.log(slog.LevelInfo, args...) }
func (a asynqLogger) Warn(args ...any)  { a.log(slog.LevelWarn, args...) }
func (a asynqLogger) Error(args ...any) { a.log(slog.LevelError, args...) }
func (a asynqLogger) Fatal(args ...any) { a.log(slog.LevelError, args...) }
