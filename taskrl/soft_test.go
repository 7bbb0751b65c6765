package taskrl

import (
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestSoft: soft: 10% in a policy file raises a GCRA rate, a fixed and a
// sliding window, and an override of a keyed rule, in the rules the
// middleware decides with; on an explicit clock, a 10/s rule with soft 10%
// under a backlog admits exactly 11 a second, never 12, and one without
// admits 10.
func TestSoft(t *testing.T) {
	p, err := policy.Parse([]byte(`
rules:
  - name: rate
    match: {type: "job"}
    soft: 10%
    gcra: {rate: 10, per: 1s}
  - name: window
    match: {type: "job"}
    soft: 0.1
    quota: {limit: 100, every: 1m}
  - name: recent
    match: {type: "job"}
    soft: 10%
    sliding: {limit: 7, every: 1s}
  - name: business
    match: {type: "job"}
    key: "{{.b}}"
    soft: 50%
    gcra: {rate: 2, per: 1s}
overrides:
  - {rule: business, key: big, gcra: {rate: 4, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Rules()[0].Soft; got != 0.1 {
		t.Fatalf("soft: 10%% read as %v", got)
	}
	b := p.Bind("job", "q")
	want := []quotas.Limit{
		quotas.GCRA(gcra.Limit{Rate: 11, Period: time.Second, Burst: 1}),
		quotas.FixedWindow{Limit: 110, Every: time.Minute},
		quotas.SlidingWindow{Limit: 7, Every: time.Second}, // 7.7, whole units
		quotas.GCRA(gcra.Limit{Rate: 3, Period: time.Second, Burst: 1}),
	}
	for i, r := range b.Rules() {
		if g, w := r.Limit.String(), want[i].String(); g != w {
			t.Errorf("rule %s enforces %s, want %s", r.Name, g, w)
		}
	}
	over := b.ForKeys([]string{"", "", "", "big"}).Rules()[3].Limit
	if g, w := over.String(), quotas.GCRA(gcra.Limit{Rate: 6, Period: time.Second, Burst: 1}).String(); g != w {
		t.Errorf("the override of key big enforces %s, want %s", g, w)
	}

	for _, tc := range []struct {
		soft float64
		want int
	}{{0.1, 11}, {0, 10}} {
		p := mustPolicy(t, policy.Rule{Name: "rate", Match: policy.Match{Type: "job"}, Soft: tc.soft, Limit: quotas.GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 1})})
		set := bindSet(t, p.Bind("job", "q"))
		m := quotas.NewModel()
		start := time.Unix(1700000000, 0)
		per := map[int]int{}
		// A backlog: every millisecond a task asks; 5 s.
		for at := start; at.Before(start.Add(5 * time.Second)); at = at.Add(time.Millisecond) {
			d, err := m.AllowAt(at, set, quotas.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				per[int(at.Sub(start)/time.Second)]++
			}
		}
		for s := 0; s < 5; s++ {
			if per[s] != tc.want {
				t.Errorf("soft %v: second %d admitted %d, want %d", tc.soft, s, per[s], tc.want)
			}
		}
	}
}
