package policy_test

import (
	"fmt"
	"time"

	"github.com/taskrl/taskrl/limits"
	"github.com/taskrl/taskrl/policy"
)

func ExampleParse() {
	p, err := policy.Parse([]byte(`
rules:
  - name: vendor-peak
    match: {type: "http:*"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: vendor-daily
    match: {type: "http:call"}
    quota: {limit: 10000, cron: "0 0 * * *", tz: "America/Los_Angeles"}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1.8, per: 1s}
  - name: bulk
    match: {queue: bulk}
    sliding: {limit: 100, every: 1m}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	b := p.Bind("http:call", "default")
	for _, r := range b.Rules() {
		fmt.Printf("%s: %v\n", r.Name, r.Limit)
	}
	keys, err := b.Keys([]byte(`{"url": "https://api.example.com", "business_id": "b7"}`))
	fmt.Printf("keys %q, error %v\n", keys, err)
	fmt.Println("email:send on default bound:", p.Bind("email:send", "default") != nil)
	// Output:
	// vendor-peak: 18/1s burst 3 (GCRA)
	// vendor-daily: 10000 per "0 0 * * *" in America/Los_Angeles (calendar window)
	// per-business: 1.8/1s burst 1 (GCRA)
	// keys ["" "" "b7"], error <nil>
	// email:send on default bound: false
}

func ExampleParse_error() {
	_, err := policy.Parse([]byte(`
rules:
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: -1, per: 1s}
  - name: vendor-window
    match: {type: "http:call"}
    quota: {limit: 190, every: 10}
`))
	fmt.Println(err)
	// Output:
	// policy: line 6: rule "per-business": gcra.rate: must be a positive number, got -1
	// policy: line 9: rule "vendor-window": quota.every: 10 needs a unit, e.g. 10s (Go duration syntax: ms, s, m, h)
}

func ExampleLoadFile() {
	p, err := policy.LoadFile("testdata/design.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(p.Rules()), "rules; when Redis is unavailable:", p.FailureMode())
	_, err = policy.LoadFile("testdata/missing.yaml")
	fmt.Println(err)
	// Output:
	// 5 rules; when Redis is unavailable: closed
	// policy testdata/missing.yaml: cannot open: no such file or directory
}

func ExampleNew() {
	p, err := policy.New(
		policy.Rule{
			Name:  "backfill",
			Match: policy.Match{Queue: "bulk"},
			Limit: limits.GCRA{Rate: 50, Period: time.Second, Burst: 5},
		},
		policy.Rule{
			Name:       "per-tenant",
			Match:      policy.Match{Type: "report:*"},
			Key:        "tenant-{{.tenant.id}}",
			DefaultKey: "tenant-none",
			Limit:      limits.Concurrency{Max: 2, Lease: time.Minute},
		},
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	b := p.Bind("report:weekly", "bulk")
	keys, _ := b.Keys([]byte(`{"tenant": {"id": 42}}`))
	fmt.Printf("%q\n", keys)
	keys, _ = b.Keys([]byte(`{}`))
	fmt.Printf("%q\n", keys)
	// Output:
	// ["" "tenant-42"]
	// ["" "tenant-none"]
}

func ExampleBinding_Keys() {
	p, _ := policy.Parse([]byte(`
rules:
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s}
`))
	b := p.Bind("http:call", "default")
	keys, err := b.Keys([]byte(`{"business_id": 12345678901}`))
	fmt.Printf("%q %v\n", keys, err)
	_, err = b.Keys([]byte(`{"url": "https://api.example.com"}`))
	fmt.Println(err)
	// Output:
	// ["12345678901"] <nil>
	// taskrl: rule "per-business": payload has no field "business_id"
}

// A per-customer 429 should hold back that customer, not every customer
// behind the shared vendor rule: the throttle list says which rules an
// upstream throttle blocks.
func ExamplePolicy_WithThrottle() {
	p, err := policy.Parse([]byte(`
throttle: [per-business]
rules:
  - name: vendor
    match: {type: "http:call"}
    gcra: {rate: 18, per: 1s}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s}
`))
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Throttle())
	_, err = p.WithThrottle("per-customer")
	fmt.Println(err)
	// Output:
	// [per-business]
	// policy: throttle[1]: no rule is named "per-customer"
}

// A soft rule may exceed its limit by a share; Raised gives the limit it
// enforces, for its own limit or an override's.
func ExampleRule_Raised() {
	r := policy.Rule{Name: "internal-api", Match: policy.Match{Queue: "bulk"}, Soft: 0.1,
		Limit: limits.SlidingWindow{Limit: 100, Every: time.Minute}}
	fmt.Println(r.Raised(r.Limit))
	fmt.Println(r.Raised(limits.FixedWindow{Limit: 7, Every: time.Second}))
	// Output:
	// 110 per 1m0s (sliding window)
	// 7 per 1s (fixed window)
}
