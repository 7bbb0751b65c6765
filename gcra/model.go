package gcra

import (
	"fmt"
	"sync"
	"time"
)

// Never is the RetryAfter of a request that can never be allowed: its cost
// exceeds the limit's Burst.
const Never time.Duration = -1

// Result is the outcome of one limiter call. Denied is a result, not an error.
type Result struct {
	// Limit is the limit the call was decided under.
	Limit Limit
	// Allowed reports whether the request was admitted (AllowN) or booked
	// (Reserve). For a peek (cost 0) it reports whether a cost-0 request
	// conforms, which is false only while reservations run past the burst.
	// Refund always reports true.
	Allowed bool
	// Remaining is how many cost-1 requests would be allowed right now,
	// after this call, between 0 and Burst.
	Remaining int
	// RetryAfter is 0 when Allowed. Otherwise it is the exact wait after
	// which the same request would be allowed if nothing else happened in
	// between, or Never when the cost exceeds Burst.
	RetryAfter time.Duration
	// ResetAfter is the time until the key is back at its full burst.
	ResetAfter time.Duration
	// Delay is, for a booked Reserve, how long the caller must wait before
	// acting on its reservation; 0 for every other call.
	Delay time.Duration
	// Now is the instant the decision was made at: the Redis server's TIME,
	// or the limiter's explicit clock.
	Now time.Time
}

// op is the kind of call the arithmetic decides.
type op int

const (
	opAllow op = iota
	opReserve
	opRefund
)

// write says what a decision does to the stored state.
type write int

const (
	keep write = iota
	store
	remove
)

// decision is the output of decide, mirroring the Lua gcra_decide reply.
type decision struct {
	allowed    bool
	tat        int64
	write      write
	remaining  int64
	retryAfter int64
	resetAfter int64
	delay      int64
}

// decide is the GCRA arithmetic in Go, line for line the same as
// internal/script/lua/gcra.lua's gcra_decide. All values are microseconds;
// the caller has validated the limit, the cost and the bounds.
func decide(stored int64, ok bool, now, em, burst, n int64, o op, maxWait int64) decision {
	tol := em * burst
	tat := now
	if ok && stored > now {
		tat = stored
	}
	if o == opRefund {
		nt := tat - n*em
		if nt <= now {
			return decision{allowed: true, tat: now, write: remove, remaining: burst}
		}
		return decision{allowed: true, tat: nt, write: store, remaining: max(0, floorDiv(tol-(nt-now), em)), resetAfter: nt - now}
	}
	left := max(0, floorDiv(tol-(tat-now), em))
	if n > burst {
		return decision{tat: tat, remaining: left, retryAfter: -1, resetAfter: tat - now}
	}
	nt := tat + n*em
	wait := nt - tol - now
	if wait <= 0 || (o == opReserve && wait <= maxWait) {
		w := store
		if n == 0 {
			w = keep
		}
		return decision{allowed: true, tat: nt, write: w, remaining: max(0, floorDiv(tol-(nt-now), em)), resetAfter: nt - now, delay: max(0, wait)}
	}
	return decision{tat: tat, remaining: left, retryAfter: wait, resetAfter: tat - now}
}

// floorDiv is math.floor(a/b) for b > 0, as Lua computes it.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// result converts a decision into a Result.
func (d decision) result(l Limit, now int64) Result {
	return Result{
		Limit:      l,
		Allowed:    d.allowed,
		Remaining:  int(d.remaining),
		RetryAfter: usDuration(d.retryAfter),
		ResetAfter: usDuration(d.resetAfter),
		Delay:      usDuration(d.delay),
		Now:        time.UnixMicro(now),
	}
}

func usDuration(us int64) time.Duration {
	if us < 0 {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// request is a validated call: the limit's interval, the cost and the time.
type request struct {
	em, burst, n, maxWait int64
}

func newRequest(l Limit, n int, o op, maxWait time.Duration) (request, error) {
	em, err := l.interval()
	if err != nil {
		return request{}, err
	}
	if n < 0 {
		return request{}, fmt.Errorf("%w (got %d)", ErrInvalidCost, n)
	}
	if maxWait < 0 {
		maxWait = 0
	}
	mw := maxWait.Microseconds()
	if mw > maxSpan {
		mw = maxSpan
	}
	// Bound n so that n·T stays exact: a cost above the burst is decided
	// without arithmetic on n, and a refund of maxSpan or more empties any key.
	nn, most := int64(n), int64(l.Burst)+1
	if o == opRefund {
		most = maxSpan/em + 1
	}
	nn = min(nn, most)
	return request{em: em, burst: int64(l.Burst), n: nn, maxWait: mw}, nil
}

func checkTime(t time.Time) (int64, error) {
	us := t.UnixMicro()
	if us < 0 || us >= maxTime {
		return 0, fmt.Errorf("gcra: time %s is outside 1970..2041", t.Format(time.RFC3339Nano))
	}
	return us, nil
}

// Model is an in-process GCRA limiter with exactly the arithmetic the Redis
// Limiter runs, driven by explicit times. It is the reference the Redis
// implementation is tested against, and it serves simulations (estimating
// how long a campaign takes) and per-process fallbacks.
//
// The zero value is ready to use. A Model is safe for concurrent use. It
// forgets a key once the key is back at its full burst, so its memory is
// bounded by the keys in use.
type Model struct {
	mu   sync.Mutex
	tats map[string]int64
	ops  int
}

// AllowN decides a request of cost n at time now, like Limiter.AllowN.
func (m *Model) AllowN(now time.Time, key string, l Limit, n int) (Result, error) {
	return m.do(now, key, l, n, opAllow, 0)
}

// Reserve books the earliest slot for a request of cost n no more than
// maxWait after now, like Limiter.Reserve.
func (m *Model) Reserve(now time.Time, key string, l Limit, n int, maxWait time.Duration) (Result, error) {
	return m.do(now, key, l, n, opReserve, maxWait)
}

// Refund gives back n units charged to key, like Limiter.Refund.
func (m *Model) Refund(now time.Time, key string, l Limit, n int) (Result, error) {
	return m.do(now, key, l, n, opRefund, 0)
}

// Reset forgets key, like Limiter.Reset.
func (m *Model) Reset(key string) {
	m.mu.Lock()
	delete(m.tats, key)
	m.mu.Unlock()
}

func (m *Model) do(t time.Time, key string, l Limit, n int, o op, maxWait time.Duration) (Result, error) {
	r, err := newRequest(l, n, o, maxWait)
	if err != nil {
		return Result{}, err
	}
	now, err := checkTime(t)
	if err != nil {
		return Result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tats == nil {
		m.tats = make(map[string]int64)
	}
	stored, ok := m.tats[key]
	d := decide(stored, ok, now, r.em, r.burst, r.n, o, r.maxWait)
	switch d.write {
	case store:
		m.tats[key] = d.tat
	case remove:
		delete(m.tats, key)
	}
	if m.ops++; m.ops >= 4096 && m.ops >= 2*len(m.tats) {
		m.ops = 0
		for k, v := range m.tats {
			if v <= now {
				delete(m.tats, k)
			}
		}
	}
	return d.result(l, now), nil
}
