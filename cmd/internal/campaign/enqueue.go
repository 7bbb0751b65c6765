package campaign

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/hibiken/asynq"
)

// DefaultParallel is how many enqueue calls Enqueue keeps in flight when
// given a parallelism below 1.
const DefaultParallel = 32

// Source builds task i of a batch and the options to enqueue it with.
// It is called from several goroutines at once and must be safe for that.
type Source func(i int) (*asynq.Task, []asynq.Option)

// Counts says what Enqueue did.
type Counts struct {
	// Enqueued is how many tasks were enqueued.
	Enqueued int
	// Existing is how many tasks were not enqueued because a task with the
	// same asynq TaskID already existed (asynq.ErrTaskIDConflict): they
	// were enqueued before, e.g. by an earlier attempt of a fan-out.
	Existing int
}

// Enqueue enqueues tasks from..to-1 built by src through client, with up to
// parallel calls in flight (DefaultParallel if parallel < 1): asynq enqueues
// one task per round trip, so the calls overlap on the client's connection
// pool (size it at least parallel).
//
// It stops dispatching at the first error, or when ctx is done, lets the
// calls in flight finish (so Counts is exact) and returns the error, naming
// the task's index; tasks after it may or may not have been enqueued by then,
// and Counts says how many were. asynq.ErrTaskIDConflict is not an error: the
// task counts as Existing. If done is not nil it is incremented (atomically)
// once per task handled, for progress displays.
func Enqueue(ctx context.Context, client *asynq.Client, from, to, parallel int, src Source, done *atomic.Int64) (Counts, error) {
	if to <= from {
		return Counts{}, ctx.Err()
	}
	if parallel < 1 {
		parallel = DefaultParallel
	}
	parallel = min(parallel, to-from)
	var (
		next               atomic.Int64
		stop               atomic.Bool
		enqueued, existing atomic.Int64
		errOnce            sync.Once
		firstErr           error
		wg                 sync.WaitGroup
	)
	next.Store(int64(from))
	// The calls themselves are not cancelled with ctx: a call cut off
	// midway may or may not have enqueued its task, and then the counts
	// would lie.
	callCtx := context.WithoutCancel(ctx)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stop.Store(true)
	}
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				if err := ctx.Err(); err != nil {
					fail(err)
					return
				}
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				task, opts := src(i)
				_, err := client.EnqueueContext(callCtx, task, opts...)
				switch {
				case err == nil:
					enqueued.Add(1)
				case errors.Is(err, asynq.ErrTaskIDConflict):
					existing.Add(1)
				default:
					fail(fmt.Errorf("task %d: %w", i, err))
					return
				}
				if done != nil {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return Counts{Enqueued: int(enqueued.Load()), Existing: int(existing.Load())}, firstErr
}
