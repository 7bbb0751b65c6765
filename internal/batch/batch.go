// Package batch joins concurrent calls of one Lua script on a single Redis
// into one call: group commit. While a few calls are in flight, requests
// that arrive wait and go together in the next call, one round trip for
// all of them; a request that arrives while fewer calls are in flight is
// sent at once, so batching adds no wait to a lone request. The script
// decides the requests of a call one after the other, each on its own.
//
// Foundation layer, imported by gcra and quotas.
package batch

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/script"
)

// MaxInFlight is how many script calls a Batcher keeps in flight before
// requests queue: few enough that concurrent requests share calls, enough
// that Redis works on one call while the client prepares the next. With 50
// callers on 2 cores, 4 left Redis idle about a fifth of the time and 8
// made calls too small to share much (BENCHMARKS.md).
const MaxInFlight = 6

// Job is one request waiting for its script reply.
type Job struct {
	Ctx  context.Context
	Keys []string
	// Args are the request's own script arguments, as Join expects them.
	Args []any
	// End is for Join: where in Args a part it may compact ends.
	End int
	// Requests is how many requests Args holds, each with a reply of its
	// own (0 means 1).
	Requests int
	// Reply and Err are set once the call returned: the request's reply,
	// or for a job of several requests, theirs, in order.
	Reply []any
	Err   error

	// done is closed once Reply and Err are set; lead receives the batch
	// this job's goroutine must send for the others.
	done   chan struct{}
	lead   chan []*Job
	queued bool
}

// Join appends to argv the script arguments of a call carrying batch, in
// order, and returns it. The script replies with one element per job.
type Join func(argv []any, batch []*Job) []any

// Batcher sends requests of one script, joined into shared calls. It is
// safe for concurrent use.
type Batcher struct {
	client   redis.UniversalClient
	prog     *script.Program
	join     Join
	name     string // starts error messages
	max      int
	mu       sync.Mutex
	inFlight int
	queue    []*Job
}

// New returns a Batcher of prog on client that puts at most max requests
// (1 or more) in one call; name starts its error messages.
func New(client redis.UniversalClient, prog *script.Program, join Join, name string, max int) *Batcher {
	return &Batcher{client: client, prog: prog, join: join, name: name, max: max}
}

// Do sends one request and returns its reply.
func (b *Batcher) Do(ctx context.Context, keys []string, args []any, end int) ([]any, error) {
	return b.do(&Job{Ctx: ctx, Keys: keys, Args: args, End: end})
}

// DoN sends n requests, decided one after the other in the same call, and
// returns their replies, each a []any.
func (b *Batcher) DoN(ctx context.Context, keys []string, args []any, n int) ([]any, error) {
	return b.do(&Job{Ctx: ctx, Keys: keys, Args: args, Requests: n})
}

// do sends j and returns its reply.
func (b *Batcher) do(j *Job) ([]any, error) {
	ctx := j.Ctx
	if b.max == 1 {
		b.Call([]*Job{j})
		return j.Reply, j.Err
	}
	b.mu.Lock()
	if b.inFlight < MaxInFlight && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		b.send([]*Job{j})
		return j.Reply, j.Err
	}
	j.done, j.lead, j.queued = make(chan struct{}), make(chan []*Job, 1), true
	b.queue = append(b.queue, j)
	if b.inFlight < MaxInFlight {
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
			return j.Reply, j.Err
		case batch := <-j.lead:
			b.send(batch)
			<-j.done
			return j.Reply, j.Err
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

// Queued returns how many requests wait for a call.
func (b *Batcher) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// promote hands the queue, up to max jobs, to its first job's goroutine to
// send, if a call may start.
func (b *Batcher) promote() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 || b.inFlight >= MaxInFlight {
		return
	}
	n := min(len(b.queue), b.max)
	batch := append([]*Job(nil), b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	for _, j := range batch {
		j.queued = false
	}
	b.inFlight++
	batch[0].lead <- batch
}

// send runs one script call for batch and then lets the next queued jobs
// go.
func (b *Batcher) send(batch []*Job) {
	b.Call(batch)
	b.mu.Lock()
	b.inFlight--
	b.mu.Unlock()
	b.promote()
}

// Call runs one call of the program for batch, whatever is in flight, and
// gives every job its reply (script.Program.Run: FCALL or EVALSHA, loading
// the program where the server lacks it).
func (b *Batcher) Call(batch []*Job) {
	ctx := batch[0].Ctx
	if len(batch) > 1 {
		// A shared call outlives any one caller's cancellation.
		ctx = context.WithoutCancel(ctx)
	}
	b.call(ctx, batch)
}

// Own runs jobs of one caller under its ctx, in calls of at most the
// Batcher's max jobs each, one after the other, whatever is in flight.
func (b *Batcher) Own(ctx context.Context, jobs []*Job) {
	for len(jobs) > 0 {
		n := min(len(jobs), b.max)
		b.call(ctx, jobs[:n])
		jobs = jobs[n:]
	}
}

// call is Call under ctx.
func (b *Batcher) call(ctx context.Context, batch []*Job) {
	nk, na := 0, 1
	for _, j := range batch {
		nk += len(j.Keys)
		na += len(j.Args)
	}
	cmd := append(make([]any, 0, 3+nk+na), b.prog.Head(nk)...)
	for _, j := range batch {
		for _, k := range j.Keys {
			cmd = append(cmd, k)
		}
	}
	cmd = b.join(cmd, batch)
	v, err := b.prog.Run(ctx, b.client, cmd).Slice()
	n := 0
	for _, j := range batch {
		n += max(j.Requests, 1)
	}
	if err == nil && len(v) != n {
		err = fmt.Errorf("%d script replies for %d requests", len(v), n)
	}
	at := 0
	for _, j := range batch {
		if err == nil {
			m := max(j.Requests, 1)
			rs := v[at : at+m]
			at += m
			for _, r := range rs {
				if _, ok := r.([]any); !ok {
					j.Err = fmt.Errorf("%s: unexpected script reply %v", b.name, r)
				}
			}
			switch {
			case j.Err != nil:
			case m == 1:
				j.Reply = rs[0].([]any)
			default:
				j.Reply = rs
			}
		} else {
			j.Err = fmt.Errorf("%s: %w", b.name, err)
		}
		if j.done != nil {
			close(j.done)
		}
	}
}
