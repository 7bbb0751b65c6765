package taskrl

import (
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestAutoPrefetch: a task's quota rules of at least autoMin, without a
// cost or prefetch: off, prefetch by themselves (autoLease), with or
// without a concurrency rule beside them, and concurrency rules of a max
// of at least autoSlots keep their slots; nothing else changes.
func TestAutoPrefetch(t *testing.T) {
	p, err := policy.Parse([]byte(`rules:
  - {name: big, match: {type: big}, quota: {limit: 1000, every: 10s}}
  - {name: off, match: {type: off}, prefetch: off, quota: {limit: 1000, every: 10s}}
  - {name: small, match: {type: small}, quota: {limit: 127, every: 10s}}
  - {name: daily, match: {type: slots}, quota: {limit: 100000, cron: "@daily"}}
  - {name: slots, match: {type: slots}, concurrency: {max: 5, lease: 30s}}
  - {name: costly, match: {type: costly}, cost: "{{.n}}", quota: {limit: 1000, every: 10s}}
  - {name: rate, match: {type: mixed}, gcra: {rate: 100, per: 1s}}
  - {name: window, match: {type: mixed}, quota: {limit: 1000, every: 10s}}
  - {name: own, match: {type: own}, prefetch: 30ms, quota: {limit: 1000, every: 10s}}
  - {name: cap, match: {type: cap}, concurrency: {max: 32, lease: 30s}}
  - {name: cap-off, match: {type: cap-off}, prefetch: off, concurrency: {max: 100, lease: 30s}}
  - {name: cap-small, match: {type: cap-off}, concurrency: {max: 31, lease: 30s}}
  - {name: peak, match: {type: peak}, gcra: {rate: 100000, per: 1s, burst: 1000}}
  - {name: api, match: {type: api}, gcra: {rate: 1000, per: 1s, burst: 100}}
  - {name: api-off, match: {type: api-off}, prefetch: off, gcra: {rate: 1000, per: 1s, burst: 100}}
  - {name: slow, match: {type: slow}, gcra: {rate: 100, per: 1s, burst: 100}}
  - {name: strict, match: {type: strict}, gcra: {rate: 100000, per: 1s, burst: 3}}
  - {name: shared, match: {type: shared}, fair: "{{.b}}", gcra: {rate: 100000, per: 1s, burst: 1000}}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{Policy: p, Client: redistest.Client(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for typ, want := range map[string][]time.Duration{
		"big": {autoLease}, "off": {0}, "small": {0}, "slots": {autoLease}, "costly": {0},
		"mixed": {0, autoLease}, "own": {30 * time.Millisecond},
		// GCRA rules: autoLease, or a quarter of the burst's worth
		// (2.5 ms of 100,000/s burst 1,000); none at 4 intervals or under
		// (100/s: 10 ms is one), a burst under 4, fair or off.
		"peak": {2500 * time.Microsecond}, "api": {autoLease}, "api-off": {0}, "slow": {0}, "strict": {0}, "shared": {0},
	} {
		sp, err := m.split(p.Bind(typ, "q"))
		if err != nil {
			t.Fatal(err)
		}
		rs := sp.rates.Rules()
		for i, w := range want {
			if rs[i].Prefetch != w {
				t.Errorf("%s: rule %s prefetches %v, want %v", typ, rs[i].Name, rs[i].Prefetch, w)
			}
		}
	}
	// Concurrency rules of a max of at least autoSlots keep their slots.
	for typ, want := range map[string][]time.Duration{"cap": {autoLease}, "cap-off": {0, 0}, "slots": {0}} {
		sp, err := m.split(p.Bind(typ, "q"))
		if err != nil {
			t.Fatal(err)
		}
		rs := sp.slots.Rules()
		if len(rs) != len(want) {
			t.Fatalf("%s: %d concurrency rules, want %d", typ, len(rs), len(want))
		}
		for i, w := range want {
			if rs[i].Prefetch != w {
				t.Errorf("%s: rule %s keeps slots for %v, want %v", typ, rs[i].Name, rs[i].Prefetch, w)
			}
		}
	}
}
