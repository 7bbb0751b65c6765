package gcra_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// newExampleLimiter returns a limiter on the test harness's Redis, with a
// fresh key prefix and an explicit clock fixed at a known instant so that the
// printed output is exact. Production code leaves Now nil: the Redis server's
// clock decides.
func newExampleLimiter(now *time.Time) (*gcra.Limiter, *redis.Client) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()})
	l, err := gcra.New(gcra.Config{
		Client: rdb,
		Prefix: redistest.NewPrefix("example"),
		Now:    func() time.Time { return *now },
	})
	if err != nil {
		panic(err)
	}
	return l, rdb
}

var exampleStart = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redistest.SharedAddr()}) // your Redis
	defer rdb.Close()
	limiter, err := gcra.New(gcra.Config{Client: rdb, Prefix: redistest.NewPrefix("example")})
	if err != nil {
		panic(err)
	}
	// 20 calls per second to a vendor, at most 5 at once.
	limit := gcra.Limit{Rate: 20, Period: time.Second, Burst: 5}
	allowed := 0
	for i := 0; i < 8; i++ {
		res, err := limiter.Allow(ctx, "vendor", limit)
		if err != nil {
			panic(err) // Redis unreachable: denial is never an error
		}
		if res.Allowed {
			allowed++
		} else {
			// The next slot opens within one emission interval (50ms).
			fmt.Println("denied; retry after <= 50ms:", res.RetryAfter <= limit.Interval())
			break
		}
	}
	fmt.Println("allowed at once:", allowed)
	// Output:
	// denied; retry after <= 50ms: true
	// allowed at once: 5
}

func ExampleLimiter_AllowN() {
	now := exampleStart
	limiter, rdb := newExampleLimiter(&now)
	defer rdb.Close()
	ctx := context.Background()
	limit := gcra.Limit{Rate: 10, Period: time.Second, Burst: 4} // T = 100ms
	for _, n := range []int{3, 2, 1, 5} {
		res, _ := limiter.AllowN(ctx, "b7", limit, n)
		fmt.Printf("cost %d: allowed=%v remaining=%d retry=%v reset=%v\n", n, res.Allowed, res.Remaining, res.RetryAfter, res.ResetAfter)
	}
	// Output:
	// cost 3: allowed=true remaining=1 retry=0s reset=300ms
	// cost 2: allowed=false remaining=1 retry=100ms reset=300ms
	// cost 1: allowed=true remaining=0 retry=0s reset=400ms
	// cost 5: allowed=false remaining=0 retry=-1ns reset=400ms
}

func ExampleLimiter_Reserve() {
	now := exampleStart
	limiter, rdb := newExampleLimiter(&now)
	defer rdb.Close()
	ctx := context.Background()
	limit := gcra.Limit{Rate: 2, Period: time.Second, Burst: 1} // one slot every 500ms
	// Book slots for five tasks, up to 1.5s ahead; run each after its Delay.
	for i := 0; i < 5; i++ {
		res, _ := limiter.Reserve(ctx, "backfill", limit, 1, 1500*time.Millisecond)
		if res.Allowed {
			fmt.Printf("task %d: run in %v\n", i, res.Delay)
		} else {
			fmt.Printf("task %d: not booked, earliest in %v\n", i, res.RetryAfter)
		}
	}
	// Output:
	// task 0: run in 0s
	// task 1: run in 500ms
	// task 2: run in 1s
	// task 3: run in 1.5s
	// task 4: not booked, earliest in 2s
}

func ExampleLimiter_Peek() {
	now := exampleStart
	limiter, rdb := newExampleLimiter(&now)
	defer rdb.Close()
	ctx := context.Background()
	limit := gcra.PerMinute(30)
	limiter.AllowN(ctx, "vendor", limit, 10)
	now = now.Add(4 * time.Second) // two emissions later
	res, _ := limiter.Peek(ctx, "vendor", limit)
	fmt.Println(res.Remaining, res.ResetAfter)
	// Output: 22 16s
}

func ExampleLimiter_Refund() {
	now := exampleStart
	limiter, rdb := newExampleLimiter(&now)
	defer rdb.Close()
	ctx := context.Background()
	limit := gcra.PerSecond(5)
	limiter.AllowN(ctx, "vendor", limit, 5)
	// Two of the five calls were never made: give their capacity back.
	res, _ := limiter.Refund(ctx, "vendor", limit, 2)
	fmt.Println(res.Remaining)
	// Output: 2
}

func ExampleLimiter_Reset() {
	now := exampleStart
	limiter, rdb := newExampleLimiter(&now)
	defer rdb.Close()
	ctx := context.Background()
	limit := gcra.PerHour(1)
	limiter.Allow(ctx, "vendor", limit)
	limiter.Reset(ctx, "vendor")
	res, _ := limiter.Allow(ctx, "vendor", limit)
	fmt.Println(res.Allowed)
	// Output: true
}

func ExampleLimiter_Key() {
	limiter, _ := gcra.New(gcra.Config{Client: redis.NewClient(&redis.Options{})})
	fmt.Println(limiter.Key("b7"))
	fmt.Println(limiter.Key("tenant:{7}"))
	// Output:
	// taskrl:gcra:{b7}
	// taskrl:gcra:{tenant%3A%7B7%7D}
}

func ExampleNew() {
	_, err := gcra.New(gcra.Config{Client: redis.NewClient(&redis.Options{}), Prefix: "my{app}:"})
	fmt.Println(err)
	// Output: gcra: Config.Prefix: prefix "my{app}:" contains '{'; allowed are printable ASCII characters other than space, '{' and '}'
}

func ExampleLimit_Validate() {
	fmt.Println(gcra.Limit{Rate: 18, Period: time.Second, Burst: 0}.Validate())
	fmt.Println(gcra.Limit{Rate: 18, Period: time.Second, Burst: 3}.Validate())
	// Output:
	// gcra: invalid limit 18/1s burst 0: burst must be at least 1
	// <nil>
}

func ExampleLimit_Interval() {
	fmt.Println(gcra.PerSecond(200).Interval())
	fmt.Println(gcra.Limit{Rate: 3, Period: time.Second, Burst: 1}.Interval()) // rounded up
	// Output:
	// 5ms
	// 333.334ms
}

func ExamplePerDay() {
	fmt.Println(gcra.PerDay(10000), gcra.PerDay(10000).Interval())
	// Output: 10000/24h0m0s burst 10000 8.64s
}

func ExampleModel() {
	// The Model runs the limiter's arithmetic in memory on explicit times:
	// here, how long 100 tasks take under 20/s with a burst of 5.
	var m gcra.Model
	limit := gcra.Limit{Rate: 20, Period: time.Second, Burst: 5}
	now := exampleStart
	var last time.Duration
	for i := 0; i < 100; i++ {
		res, _ := m.Reserve(now, "campaign", limit, 1, time.Hour)
		last = res.Delay
	}
	fmt.Println("last task starts after", last)
	// Output: last task starts after 4.75s
}
