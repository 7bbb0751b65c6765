package taskrl

import (
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

// TestAutoPrefetch: a task's quota rules of at least autoMin, without a
// cost or prefetch: off, prefetch by themselves (autoLease), with or
// without a concurrency rule beside them; nothing else changes.
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
}
