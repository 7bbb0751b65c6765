package quotas_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/quotas"
)

// monday9 is the explicit clock the examples run on, so their output is
// exact. Production code leaves Config.Now nil: the Redis server's clock
// decides.
var monday9 = time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC) // 09:00 in Los Angeles

func exampleLimiter(now *time.Time) *quotas.Limiter {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()}) // your Redis
	l, err := quotas.New(quotas.Config{Client: rdb, Prefix: redistest.NewPrefix("example"), Now: func() time.Time { return *now }})
	if err != nil {
		panic(err)
	}
	return l
}

// A vendor allows 20 calls/s, 10,000 calls per day resetting at midnight in
// Los Angeles, and 2 calls/s per customer. One Allow decides all three
// atomically, in one round trip.
func Example() {
	now := monday9
	limiter := exampleLimiter(&now)
	vendor, err := quotas.NewSet(
		quotas.Rule{Name: "vendor-peak", Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 5})},
		quotas.Rule{Name: "vendor-daily", Limit: quotas.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		quotas.Rule{Name: "per-customer", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})},
	)
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, customer := range []string{"c1", "c2", "c1"} {
		d, err := limiter.Allow(ctx, vendor, quotas.Request{Keys: []string{"", "", customer}})
		if err != nil {
			panic(err)
		}
		if d.Allowed {
			fmt.Printf("%s: allowed, %d calls left today\n", customer, d.Rules[1].Remaining)
		} else {
			fmt.Printf("%s: denied by %s, retry in %v\n", customer, d.Rule, d.RetryAfter)
		}
	}
	// Output:
	// c1: allowed, 9999 calls left today
	// c2: allowed, 9998 calls left today
	// c1: denied by per-customer, retry in 500ms
}

func ExampleLimiter_Reserve() {
	now := monday9
	limiter := exampleLimiter(&now)
	// A backfill may run 2 tasks per second and 3 per 10-second window.
	set, _ := quotas.NewSet(
		quotas.Rule{Name: "rate", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})},
		quotas.Rule{Name: "window", Limit: quotas.FixedWindow{Limit: 3, Every: 10 * time.Second}},
	)
	for i := 0; i < 5; i++ {
		d, _ := limiter.Reserve(context.Background(), set, quotas.Request{}, time.Minute)
		fmt.Printf("task %d runs in %v\n", i, d.Delay)
	}
	// Output:
	// task 0 runs in 0s
	// task 1 runs in 500ms
	// task 2 runs in 1s
	// task 3 runs in 10s
	// task 4 runs in 10.5s
}

func ExampleLimiter_Release() {
	now := monday9
	limiter := exampleLimiter(&now)
	ctx := context.Background()
	// At most 2 calls in flight per business.
	set, _ := quotas.NewSet(quotas.Rule{Name: "in-flight", Limit: quotas.Concurrency{Max: 2, Lease: 30 * time.Second}})
	var held []quotas.Lease
	for _, task := range []string{"t1", "t2", "t3"} {
		d, _ := limiter.Allow(ctx, set, quotas.Request{Keys: []string{"b7"}, Holder: task})
		fmt.Println(task, d.Allowed)
		held = append(held, d.Leases...)
	}
	limiter.Release(ctx, held[0]) // t1 is done
	d, _ := limiter.Allow(ctx, set, quotas.Request{Keys: []string{"b7"}, Holder: "t3"})
	fmt.Println("t3", d.Allowed)
	// Output:
	// t1 true
	// t2 true
	// t3 false
	// t3 true
}

// An adaptive concurrency rule learns how many calls a backend takes at
// once from the latency each call reports when its slot is released.
func ExampleLease_Outcome() {
	now := monday9
	limiter := exampleLimiter(&now)
	ctx := context.Background()
	set, _ := quotas.NewSet(quotas.Rule{Name: "backend", Limit: quotas.Concurrency{Adaptive: true, Min: 1, Max: 50, Lease: 30 * time.Second}})
	slots := func() int {
		d, _ := limiter.Status(ctx, set, quotas.Request{Holder: "-"})
		return d.Rules[0].Slots
	}
	fmt.Println("slots at the start:", slots())
	// Calls one at a time, answered in 40 ms: slow start adds a slot per
	// call while at least half the slots are in use (1 of 1, 1 of 2).
	for i := 0; i < 3; i++ {
		d, _ := limiter.Allow(ctx, set, quotas.Request{Holder: "t"})
		now = now.Add(40 * time.Millisecond)
		limiter.Release(ctx, d.Leases[0].Outcome(40*time.Millisecond, false))
	}
	fmt.Println("after three fast calls:", slots())
	d, _ := limiter.Allow(ctx, set, quotas.Request{Holder: "t"})
	now = now.Add(time.Second)
	limiter.Release(ctx, d.Leases[0].Outcome(time.Second, true)) // the backend shed it
	fmt.Println("after an overload:", slots())
	// Output:
	// slots at the start: 1
	// after three fast calls: 3
	// after an overload: 2
}

func ExampleLimiter_Renew() {
	now := monday9
	limiter := exampleLimiter(&now)
	ctx := context.Background()
	set, _ := quotas.NewSet(quotas.Rule{Name: "one", Limit: quotas.Concurrency{Max: 1, Lease: 30 * time.Second}})
	d, _ := limiter.Allow(ctx, set, quotas.Request{Holder: "t1"})
	now = now.Add(20 * time.Second)
	ok, _ := limiter.Renew(ctx, d.Leases[0]) // heartbeat: 30s from now
	fmt.Println("renewed:", ok)
	now = now.Add(40 * time.Second) // the holder crashed: its lease ran out
	ok, _ = limiter.Renew(ctx, d.Leases[0])
	fmt.Println("renewed:", ok)
	// Output:
	// renewed: true
	// renewed: false
}

func ExampleLimiter_Refund() {
	now := monday9
	limiter := exampleLimiter(&now)
	ctx := context.Background()
	set, _ := quotas.NewSet(quotas.Rule{Name: "daily", Limit: quotas.CalendarWindow{Limit: 100, Cron: "@daily"}})
	d, _ := limiter.Allow(ctx, set, quotas.Request{Cost: 10})
	fmt.Println(d.Rules[0].Remaining)
	limiter.Refund(ctx, set, quotas.Request{Cost: 10}, d) // the batch was never sent
	st, _ := limiter.Status(ctx, set, quotas.Request{})
	fmt.Println(st.Rules[0].Remaining)
	// Output:
	// 90
	// 100
}

func ExampleLimiter_Status() {
	now := monday9
	limiter := exampleLimiter(&now)
	set, _ := quotas.NewSet(quotas.Rule{Name: "sliding", Limit: quotas.SlidingWindow{Limit: 5, Every: time.Minute}})
	ctx := context.Background()
	limiter.Allow(ctx, set, quotas.Request{Cost: 2})
	now = now.Add(45 * time.Second)
	limiter.Allow(ctx, set, quotas.Request{Cost: 1})
	st, _ := limiter.Status(ctx, set, quotas.Request{})
	r := st.Rules[0]
	fmt.Printf("%s: used %d, remaining %d, oldest leaves in %v\n", r.Name, r.Used, r.Remaining, r.ResetAfter)
	// Output: sliding: used 3, remaining 2, oldest leaves in 15s
}

func ExampleNewSet() {
	_, err := quotas.NewSet(
		quotas.Rule{Name: "daily", Limit: quotas.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 2, Lease: 30 * time.Second, Reserved: 2}},
	)
	fmt.Println(err)
	// Output: quotas: rule "slots": invalid limit: reserved must be between 0 and max-1 (1), got 2
}

func ExampleCalendarWindow_String() {
	fmt.Println(quotas.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"})
	fmt.Println(quotas.FixedWindow{Limit: 190, Every: 10 * time.Second})
	fmt.Println(quotas.GCRA(gcra.PerSecond(18)))
	// Output:
	// 10000 per "0 0 * * *" in America/Los_Angeles (calendar window)
	// 190 per 10s (fixed window)
	// 18/1s burst 18 (GCRA)
}

// A worker books a slot for a task and hands the receipt on with it; the
// worker that later finds the task cannot run (the vendor throttled
// meanwhile) refunds the booking from the receipt, so the daily quota is
// not spent on a call that never happened.
func ExampleParseReceipt() {
	now := monday9
	limiter := exampleLimiter(&now)
	vendor, _ := quotas.NewSet(
		quotas.Rule{Name: "vendor-peak", Limit: quotas.GCRA(gcra.Limit{Rate: 20, Period: time.Second, Burst: 5})},
		quotas.Rule{Name: "vendor-daily", Limit: quotas.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
	)
	ctx := context.Background()
	req := quotas.Request{Keys: []string{"", ""}}
	d, _ := limiter.Reserve(ctx, vendor, req, time.Minute)
	receipt := d.Receipt() // e.g. in a task header
	fmt.Println("booked; left today:", d.Rules[1].Remaining)

	// Later, in another process:
	booked, err := quotas.ParseReceipt(receipt)
	if err != nil {
		panic(err)
	}
	if err := limiter.Refund(ctx, vendor, req, booked); err != nil {
		panic(err)
	}
	st, _ := limiter.Status(ctx, vendor, req)
	fmt.Println("refunded; left today:", st.Rules[1].Remaining)
	// Output:
	// booked; left today: 9999
	// refunded; left today: 10000
}

// A vendor allows 10 calls/s, shared fairly among businesses (Rule.Fair).
// Business "big", alone, books the next half second. "small" arrives 50 ms
// later and takes over the first of big's bookings not about to start: a
// business with less than its share comes first. Big's task learns it
// before it runs (Held), gives back its own charges (Refund) and books
// again, behind.
func ExampleLimiter_Held() {
	now := monday9
	limiter := exampleLimiter(&now)
	set, _ := quotas.NewSet(
		quotas.Rule{Name: "vendor", Limit: quotas.GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1}), Fair: true},
		quotas.Rule{Name: "business", Limit: quotas.GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})},
	)
	ctx := context.Background()
	req := func(business string) quotas.Request {
		return quotas.Request{Keys: []string{"", business}, Fair: []string{business, ""}}
	}
	var big []quotas.Decision
	for i := 0; i < 5; i++ {
		d, _ := limiter.Reserve(ctx, set, req("big"), time.Minute)
		big = append(big, d)
		fmt.Printf("big %d: booked in %v\n", i, d.Delay)
	}
	now = now.Add(50 * time.Millisecond)
	d, _ := limiter.Reserve(ctx, set, req("small"), time.Minute)
	fmt.Printf("small: booked in %v\n", d.Delay)
	for i, b := range big {
		if held, _ := limiter.Held(ctx, set, req("big"), b); !held {
			_ = limiter.Refund(ctx, set, req("big"), b)
			d, _ := limiter.Reserve(ctx, set, req("big"), time.Minute)
			fmt.Printf("big %d: taken over; booked again in %v\n", i, d.Delay)
		}
	}
	// Output:
	// big 0: booked in 0s
	// big 1: booked in 100ms
	// big 2: booked in 200ms
	// big 3: booked in 300ms
	// big 4: booked in 400ms
	// small: booked in 250ms
	// big 3: taken over; booked again in 450ms
}

func ExampleRuleError() {
	err := quotas.Rule{Name: "vendor", Limit: quotas.FixedWindow{Limit: 190}}.Validate()
	var re *quotas.RuleError
	if errors.As(err, &re) {
		fmt.Printf("%s.%s: %s\n", re.Rule, re.Field, re.Reason)
	}
	fmt.Println(err)
	// Output:
	// vendor.Every: must be at least 1ms, got 0s
	// quotas: rule "vendor": invalid limit: window must be at least 1ms, got 0s
}

// A Model decides like a Limiter, in memory and on the times it is given:
// here a backlog of five tasks, booked at once under a vendor's 2 calls/s
// and 4 calls per 10 s window, and a concurrency slot taken when the first
// one runs.
func ExampleModel() {
	m := quotas.NewModel()
	rates, err := quotas.NewSet(
		quotas.Rule{Name: "vendor-rate", Limit: quotas.GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})},
		quotas.Rule{Name: "vendor-window", Limit: quotas.FixedWindow{Limit: 4, Every: 10 * time.Second}},
	)
	if err != nil {
		panic(err)
	}
	for i := 0; i < 5; i++ {
		d, err := m.ReserveAt(monday9, rates, quotas.Request{}, time.Minute)
		if err != nil {
			panic(err)
		}
		fmt.Printf("task %d: booked %v, runs in %v\n", i, d.Allowed, d.Delay)
	}
	slots, err := quotas.NewSet(quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 1, Lease: time.Minute}})
	if err != nil {
		panic(err)
	}
	first, _ := m.AllowAt(monday9, slots, quotas.Request{Holder: "task0"})
	second, _ := m.AllowAt(monday9, slots, quotas.Request{Holder: "task1"})
	fmt.Println("task1 waits", second.RetryAfter, "for", second.Rule)
	released, _ := m.ReleaseAt(monday9.Add(time.Second), first.Leases[0])
	fmt.Println("task0 released its slot:", released)
	// Output:
	// task 0: booked true, runs in 0s
	// task 1: booked true, runs in 500ms
	// task 2: booked true, runs in 1s
	// task 3: booked true, runs in 1.5s
	// task 4: booked true, runs in 10s
	// task1 waits 1m0s for slots
	// task0 released its slot: true
}

// An adaptive rule learns the remote side's limit from its throttles: a
// 429 (reported with Block) cuts the rate, traffic that flows without one
// raises it. On a Model here, with explicit times; a Limiter keeps the
// same state in Redis, shared by every worker.
func ExampleAdaptive() {
	set, err := quotas.NewSet(quotas.Rule{Name: "vendor-learned", Limit: quotas.Adaptive{Max: 40, Min: 1, Per: time.Second}})
	if err != nil {
		panic(err)
	}
	m := quotas.NewModel()
	rate := func(d quotas.Decision) float64 { return float64(time.Second) / float64(d.Rules[0].Interval) }
	now := monday9
	d, _ := m.StatusAt(now, set, quotas.Request{})
	fmt.Printf("start: %.1f/s\n", rate(d))
	d, _ = m.BlockAt(now, set, quotas.Request{}, now.Add(time.Second)) // a 429 with Retry-After: 1
	fmt.Printf("after a 429: %.1f/s\n", rate(d))
	// Calls flow at that rate for half a second after the block without
	// a 429: it is good, and a probe 20 % above it starts.
	for now = now.Add(time.Second); now.Before(monday9.Add(1800 * time.Millisecond)); {
		d, _ = m.AllowAt(now, set, quotas.Request{})
		now = now.Add(d.Rules[0].Interval)
	}
	fmt.Printf("probing: %.1f/s\n", rate(d))
	// Output:
	// start: 40.0/s
	// after a 429: 28.0/s
	// probing: 33.6/s
}

// A rule of 10,000 calls a second is worth less than a Redis call per
// request: with Prefetch, a Limiter takes its units in batches and hands
// them out for 5 ms, without a call. A batch is charged 5 ms ahead in the
// rule's schedule (50 units), so that units handed out late never let more
// than 500 pass at once; requests decided one by one keep the whole burst.
func ExampleRule_Prefetch() {
	now := monday9
	limiter := exampleLimiter(&now)
	hot, err := quotas.NewSet(quotas.Rule{
		Name:     "hot",
		Limit:    quotas.GCRA(gcra.Limit{Rate: 10000, Period: time.Second, Burst: 500}),
		Prefetch: 5 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := range 7 {
		d, err := limiter.Allow(ctx, hot, quotas.Request{})
		if err != nil || !d.Allowed {
			panic(fmt.Sprint(d, err))
		}
		// Every decision here is at the same moment: the first is decided
		// as usual (nothing asked for units within 5 ms: a batch of one
		// would cost the same call), then the batches double. Rules is the
		// state after the batch the unit came from.
		fmt.Printf("request %d: %d of %d left after its batch\n", i+1, d.Rules[0].Remaining, d.Rules[0].Remaining+d.Rules[0].Used)
	}
	// Output:
	// request 1: 499 of 500 left after its batch
	// request 2: 449 of 500 left after its batch
	// request 3: 447 of 500 left after its batch
	// request 4: 447 of 500 left after its batch
	// request 5: 443 of 500 left after its batch
	// request 6: 443 of 500 left after its batch
	// request 7: 443 of 500 left after its batch
}
