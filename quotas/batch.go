package quotas

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxInFlight is how many script calls a Limiter keeps in flight on a single
// Redis before requests queue: few enough that concurrent requests share
// calls, enough that Redis works on one call while the client prepares the
// next. With 50 callers on 2 cores, 4 left Redis idle about a fifth of the
// time and 8 made calls too small to share much (BENCHMARKS.md).
const maxInFlight = 6

// job is one request waiting for its script reply.
type job struct {
	ctx  context.Context
	ks   []string
	argv []any // a script call of this request alone: 1, then its arguments
	end  int   // the rules' parameters are argv[specAt:end]
	v    []any // the request's reply
	err  error
	// done is closed once v and err are set; lead receives the batch this
	// job's goroutine must send for the others.
	done   chan struct{}
	lead   chan []*job
	queued bool
}

// batcher joins requests made while maxInFlight script calls are in flight
// into one call, so that concurrent requests share a round trip: group
// commit. A request that arrives while fewer calls are in flight is sent at
// once, so batching adds no wait to a lone request. It is safe for
// concurrent use.
type batcher struct {
	client   redis.UniversalClient
	max      int
	mu       sync.Mutex
	inFlight int
	queue    []*job
}

// do decides one request: it returns the request's reply.
func (b *batcher) do(ctx context.Context, ks []string, argv []any, end int) ([]any, error) {
	j := &job{ctx: ctx, ks: ks, argv: argv, end: end}
	if b.max == 1 {
		b.call([]*job{j})
		return j.v, j.err
	}
	b.mu.Lock()
	if b.inFlight < maxInFlight && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		b.send([]*job{j})
		return j.v, j.err
	}
	j.done, j.lead, j.queued = make(chan struct{}), make(chan []*job, 1), true
	b.queue = append(b.queue, j)
	if b.inFlight < maxInFlight {
		// A call finished between this job's check and now and nobody
		// took the queue: lead it.
		b.mu.Unlock()
		b.promote()
	} else {
		b.mu.Unlock()
	}
	cancelled := ctx.Done()
	for {
		select {
		case <-j.done:
			return j.v, j.err
		case batch := <-j.lead:
			b.send(batch)
			<-j.done
			return j.v, j.err
		case <-cancelled:
			b.mu.Lock()
			if j.queued {
				// Not sent yet: leave without charging anything.
				for i, q := range b.queue {
					if q == j {
						b.queue = append(b.queue[:i], b.queue[i+1:]...)
						break
					}
				}
				b.mu.Unlock()
				return nil, ctx.Err()
			}
			b.mu.Unlock()
			// Already in a batch: its answer comes with the batch's (the
			// call has its own timeouts); and this goroutine may have to
			// lead it.
			cancelled = nil
		}
	}
}

// promote hands the queue, up to max jobs, to its first job's goroutine to
// send, if a call may start.
func (b *batcher) promote() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || b.inFlight >= maxInFlight {
		return
	}
	n := min(len(b.queue), b.max)
	batch := append([]*job(nil), b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	for _, j := range batch {
		j.queued = false
	}
	b.inFlight++
	batch[0].lead <- batch
}

// send runs one script call for batch and then lets the next queued jobs
// go.
func (b *batcher) send(batch []*job) {
	b.call(batch)
	b.mu.Lock()
	b.inFlight--
	b.mu.Unlock()
	b.promote()
}

// call runs one script call for batch and gives every job its reply. It
// builds the EVALSHA command itself, in one slice, and falls back to EVAL
// when Redis does not know the script.
func (b *batcher) call(batch []*job) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		// A shared call outlives any one caller's cancellation.
		ctx = context.WithoutCancel(ctx)
	}
	nk, na := 0, 1
	for _, j := range batch {
		nk += len(j.ks)
		na += len(j.argv) - 1
	}
	cmd := make([]any, 3, 3+nk+na)
	cmd[0], cmd[1], cmd[2] = "evalsha", setScript.Hash(), nk
	for _, j := range batch {
		for _, k := range j.ks {
			cmd = append(cmd, k)
		}
	}
	cmd = append(cmd, len(batch))
	var prev []any
	for _, j := range batch {
		spec := j.argv[specAt:j.end]
		if slices.Equal(spec, prev) {
			// The same rules as the request before: the script reuses what
			// it read of them.
			cmd = append(cmd, j.argv[1:specAt]...)
			cmd = append(cmd, 0)
			cmd = append(cmd, j.argv[j.end:]...)
		} else {
			cmd = append(cmd, j.argv[1:]...)
		}
		prev = spec
	}
	v, err := b.client.Do(ctx, cmd...).Slice()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd[0], cmd[1] = "eval", setText
		v, err = b.client.Do(ctx, cmd...).Slice()
	}
	if err == nil && len(v) != len(batch) {
		err = fmt.Errorf("%d script replies for %d requests", len(v), len(batch))
	}
	for i, j := range batch {
		if err == nil {
			var ok bool
			if j.v, ok = v[i].([]any); !ok {
				j.err = fmt.Errorf("quotas: unexpected script reply %v", v[i])
			}
		} else {
			j.err = fmt.Errorf("quotas: %w", err)
		}
		if j.done != nil {
			close(j.done)
		}
	}
}
