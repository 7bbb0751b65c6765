package policy

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/limits"
)

// overrideDoc is a policy with a global and a per-business rule (lines
// 2-4 and 5-8) and the given overrides list from line 9.
func overrideDoc(overrides string) string {
	return `rules:
  - name: peak
    match: {type: job}
    gcra: {rate: 100, per: 1s, burst: 10}
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s}
overrides:
` + overrides
}

func TestParseOverrides(t *testing.T) {
	p, err := Parse([]byte(overrideDoc(`  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s, burst: 2}}
  - rule: per-business
    key: 42
    gcra: {rate: 0.5, per: 1s}
`)))
	if err != nil {
		t.Fatal(err)
	}
	want := []Override{
		{Rule: "per-business", Key: "b7", Limit: limits.GCRA{Rate: 5, Period: time.Second, Burst: 2}},
		{Rule: "per-business", Key: "42", Limit: limits.GCRA{Rate: 0.5, Period: time.Second, Burst: 1}},
	}
	if got := p.Overrides(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("overrides %+v, want %+v", got, want)
	}
	b := p.Bind("job", "q")
	for payload, wantLimit := range map[string]limits.Limit{
		`{"business_id": "b7"}`: want[0].Limit,
		`{"business_id": 42}`:   want[1].Limit,
		`{"business_id": "b8"}`: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1},
	} {
		rq, err := b.Request([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		v := b.ForKeys(rq.Keys)
		rules := v.Rules()
		if rules[1].Limit != wantLimit || rules[0].Limit != (limits.GCRA{Rate: 100, Period: time.Second, Burst: 10}) || rules[1].Name != "per-business" {
			t.Errorf("%s: rules %+v, want per-business at %v", payload, rules, wantLimit)
		}
		if again := b.ForKeys(rq.Keys); again != v {
			t.Errorf("%s: the variant is not cached", payload)
		}
	}

	for _, tc := range []struct{ name, overrides, want string }{
		{"unknown rule", "  - {rule: nope, key: b7, gcra: {rate: 5, per: 1s}}\n", `line 10: overrides[1].rule: no rule is named "nope"`},
		{"global rule", "  - {rule: peak, key: b7, gcra: {rate: 5, per: 1s}}\n", `line 10: overrides[1].rule: rule "peak" has no key`},
		{"no key", "  - {rule: per-business, gcra: {rate: 5, per: 1s}}\n", `overrides[1].key: missing`},
		{"bad limit", "  - {rule: per-business, key: b7, gcra: {rate: -5, per: 1s}}\n", `line 10: overrides[1].gcra.rate: must be a positive number`},
		{"other kind", "  - {rule: per-business, key: b7, quota: {limit: 5, every: 1s}}\n", `overrides[1].quota: is 5 per 1s (fixed window); rule "per-business" is 1/1s burst 1 (GCRA)`},
		{"twice", "  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}}\n  - {rule: per-business, key: b7, gcra: {rate: 6, per: 1s}}\n", `line 11: overrides[2].key: rule "per-business" key "b7" is already overridden by overrides[1]`},
		{"no limit", "  - {rule: per-business, key: b7}\n", `line 10: overrides[1]: no limit`},
		{"two limits", "  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}, sliding: {limit: 1, every: 1s}}\n", `overrides[1]: has both gcra and sliding`},
		{"unknown field", "  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}, plan: gold}\n", `overrides[1].plan: unknown field`},
		{"not a list", "  rule: per-business\n", `overrides: must be a list`},
	} {
		_, err := Parse([]byte(overrideDoc(tc.overrides)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestWithOverrides(t *testing.T) {
	p, err := Parse([]byte(overrideDoc("  - {rule: per-business, key: b7, gcra: {rate: 5, per: 1s}}\n")))
	if err != nil {
		t.Fatal(err)
	}
	gold := limits.GCRA{Rate: 8, Period: time.Second, Burst: 1}
	q, err := p.WithOverrides(Override{Rule: "per-business", Key: "b7", Limit: &gold}, Override{Rule: "per-business", Key: "b9", Limit: gold})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Overrides(); len(got) != 2 || got[0].Key != "b7" || got[0].Limit != gold || got[1].Key != "b9" {
		t.Fatalf("overrides %+v", got)
	}
	if len(p.Overrides()) != 1 || p.Overrides()[0].Limit == gold {
		t.Fatal("WithOverrides changed its receiver")
	}
	_, err = p.WithOverrides(Override{Rule: "peak", Key: "x", Limit: gold}, Override{Rule: "per-business", Key: "b1", Limit: limits.GCRA{}})
	if err == nil || !strings.Contains(err.Error(), "overrides[1].rule") || !strings.Contains(err.Error(), "overrides[2].gcra") {
		t.Fatalf("got %v", err)
	}
}

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]limits.Limit{
		"gcra: {rate: 5, per: 1s, burst: 2}":   limits.GCRA{Rate: 5, Period: time.Second, Burst: 2},
		"quota: {limit: 100, every: 1h}":       limits.FixedWindow{Limit: 100, Every: time.Hour},
		"concurrency: {max: 3, lease: 1m}":     limits.Concurrency{Max: 3, Lease: time.Minute},
		"sliding:\n  limit: 7\n  every: 10s\n": limits.SlidingWindow{Limit: 7, Every: 10 * time.Second},
		"adaptive: {max: 40, min: 2, per: 1s}": limits.Adaptive{Max: 40, Min: 2, Per: time.Second},
	} {
		got, err := ParseLimit([]byte(in))
		if err != nil || got != want {
			t.Errorf("%q: got %v, %v; want %v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"":                          "the document is empty",
		"gcra: {rate: -1, per: 1s}": "line 1: gcra.rate: must be a positive number",
		"gcra: {rate: 1, per: 1s}\nquota: {limit: 1, every: 1s}": "want exactly one limit block, got 2",
		"rate: 5":                          "rate: unknown field",
		"concurrency: {max: 3, lease: 1s}": "concurrency.lease: must be at least 30s",
		"gcra: [1]":                        "gcra: must be a mapping",
	} {
		if _, err := ParseLimit([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want %q", in, err, want)
		}
	}
}

// TestOverridePrefetch: a key's override of a prefetching rule is decided
// without prefetch (its burst may be too small for it); the other keys
// keep it.
func TestOverridePrefetch(t *testing.T) {
	p, err := Parse([]byte(`rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    prefetch: 10ms
    gcra: {rate: 1000, per: 1s, burst: 100}
overrides:
  - {rule: per-business, key: small, gcra: {rate: 5, per: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("job", "q")
	for biz, want := range map[string]time.Duration{"small": 0, "other": 10 * time.Millisecond} {
		rq, err := b.Request([]byte(`{"business_id": "` + biz + `"}`))
		if err != nil {
			t.Fatal(err)
		}
		if got := b.ForKeys(rq.Keys).Rules()[0].Prefetch; got != want {
			t.Errorf("business %s: prefetch %v, want %v", biz, got, want)
		}
	}
}

// TestUnlimitedOverride: unlimited: true exempts one key from a rule (the
// binding's variant for that key marks the rule Exempt; the other keys
// and rules are untouched), from the file and from WithOverrides; the
// forms that make no sense are refused with line and field.
func TestUnlimitedOverride(t *testing.T) {
	p, err := Parse([]byte(overrideDoc("  - {rule: per-business, key: b7, unlimited: true}\n")))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Overrides(); len(got) != 1 || got[0] != (Override{Rule: "per-business", Key: "b7", Unlimited: true}) {
		t.Fatalf("overrides %+v", got)
	}
	b := p.Bind("job", "q")
	for payload, exempt := range map[string]bool{`{"business_id": "b7"}`: true, `{"business_id": "b8"}`: false} {
		rq, err := b.Request([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		v := b.ForKeys(rq.Keys)
		if v.Exempt(0) || v.Exempt(1) != exempt {
			t.Errorf("%s: Exempt(peak) %v, Exempt(per-business) %v, want false, %v", payload, v.Exempt(0), v.Exempt(1), exempt)
		}
		if len(v.Rules()) != 2 || v.Rules()[1].Limit != (limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}) {
			t.Errorf("%s: rules %+v: an exempt rule keeps its place and limit", payload, v.Rules())
		}
	}
	// Live: a limit for b7 replaces the exemption, and back.
	q, err := p.WithOverrides(Override{Rule: "per-business", Key: "b7", Limit: limits.GCRA{Rate: 5, Period: time.Second, Burst: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if v := q.Bind("job", "q").ForKeys([]string{"", "b7"}); v.Exempt(1) || v.Rules()[1].Limit.(limits.GCRA).Rate != 5 {
		t.Errorf("a limit did not replace the exemption: %+v", v.Rules())
	}
	if q, err = q.WithOverrides(Override{Rule: "per-business", Key: "b7", Unlimited: true}); err != nil || !q.Bind("job", "q").ForKeys([]string{"", "b7"}).Exempt(1) {
		t.Fatalf("exempt again: %v", err)
	}

	for _, tc := range []struct{ name, overrides, want string }{
		{"and a limit", "  - {rule: per-business, key: b7, unlimited: true, gcra: {rate: 5, per: 1s}}\n", `line 10: overrides[1].unlimited: an override either exempts the key (unlimited: true) or gives it a limit, not both`},
		{"false", "  - {rule: per-business, key: b7, unlimited: false}\n", `line 10: overrides[1].unlimited: false means nothing`},
		{"not a bool", "  - {rule: per-business, key: b7, unlimited: yes please}\n", `overrides[1].unlimited: must be true or false`},
		{"global rule", "  - {rule: peak, key: b7, unlimited: true}\n", `line 10: overrides[1].rule: rule "peak" has no key`},
	} {
		_, err := Parse([]byte(overrideDoc(tc.overrides)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := p.WithOverrides(Override{Rule: "per-business", Key: "b7", Unlimited: true, Limit: limits.GCRA{Rate: 5, Period: time.Second}}); err == nil || !strings.Contains(err.Error(), "overrides[1].unlimited: an override either exempts the key") {
		t.Errorf("unlimited and a limit: got %v", err)
	}

	// The fair rule a borrowing rule borrows from cannot exempt a key.
	borrow, err := Parse([]byte(`rules:
  - name: shared
    match: {type: job}
    key: "{{.region}}"
    fair: "{{.business_id}}"
    gcra: {rate: 10, per: 1s}
  - name: own
    match: {type: job}
    key: "{{.business_id}}"
    borrow: 2x
    gcra: {rate: 2, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := borrow.WithOverrides(Override{Rule: "shared", Key: "eu", Unlimited: true}); err == nil || !strings.Contains(err.Error(), `overrides[1].unlimited: rule "shared" is the shared limit rule "own" borrows from`) {
		t.Errorf("exempting the shared rule: got %v", err)
	}
	if _, err := borrow.WithOverrides(Override{Rule: "own", Key: "b7", Unlimited: true}); err != nil {
		t.Errorf("exempting the borrowing rule: %v", err)
	}
}

// tierDoc is a policy whose per-business rule has plans free (the rule's
// own 1/s), pro and enterprise, the plan read from the payload's "plan"
// (lines 2-10), with the given overrides from line 12.
func tierDoc(overrides string) string {
	return `rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}"
    tier: "{{.plan}}"
    tiers:
      pro: {gcra: {rate: 5, per: 1s, burst: 2}}
      enterprise: {gcra: {rate: 20, per: 1s}}
    soft: 10%
    gcra: {rate: 1, per: 1s}
overrides:
` + overrides
}

// TestTiers: a key is decided at its payload's plan (raised by soft like
// the rule), at the rule's limit with no plan or an unknown one; an
// override's plan (file or WithOverrides) wins over the payload's; the
// bad forms are refused with line and field.
func TestTiers(t *testing.T) {
	p, err := Parse([]byte(tierDoc("  - {rule: per-business, key: b9, tier: enterprise}\n")))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("job", "q")
	pro := limits.GCRA{Rate: 5.5, Period: time.Second, Burst: 2}
	ent := limits.GCRA{Rate: 22, Period: time.Second, Burst: 1}
	own := limits.GCRA{Rate: 1.1, Period: time.Second, Burst: 1}
	for payload, want := range map[string]struct {
		limit limits.Limit
		plan  string // Plan: the payload's, where applied
	}{
		`{"business_id": "b1", "plan": "pro"}`:        {pro, "pro"},
		`{"business_id": "b2", "plan": "enterprise"}`: {ent, "enterprise"},
		`{"business_id": "b3", "plan": "gold"}`:       {own, ""},
		`{"business_id": "b4"}`:                       {own, ""},
		`{"business_id": "b9", "plan": "pro"}`:        {ent, ""}, // the override wins
	} {
		rq, err := b.Request([]byte(payload))
		if err != nil {
			t.Fatal(err)
		}
		v := b.ForPayload(rq.Keys, []byte(payload))
		if got := v.Rules()[0].Limit; got != want.limit || v.Plan(0) != want.plan {
			t.Errorf("%s: %v, plan %q; want %v, plan %q", payload, got, v.Plan(0), want.limit, want.plan)
		}
		if again := b.ForPayload(rq.Keys, []byte(payload)); again != v {
			t.Errorf("%s: the variant is not cached", payload)
		}
	}
	if got := p.Overrides(); len(got) != 1 || got[0].Tier != "enterprise" || got[0].Limit != (limits.GCRA{Rate: 20, Period: time.Second, Burst: 1}) {
		t.Errorf("overrides %+v", got)
	}
	q, err := p.WithOverrides(Override{Rule: "per-business", Key: "b1", Tier: "enterprise"})
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Bind("job", "q").ForPayload([]string{"b1"}, []byte(`{"business_id": "b1", "plan": "pro"}`)).Rules()[0].Limit; got != ent {
		t.Errorf("live plan: %v, want %v", got, ent)
	}
	if _, err := p.WithOverrides(Override{Rule: "per-business", Key: "b1", Tier: "gold"}); err == nil || !strings.Contains(err.Error(), `overrides[1].tier: rule "per-business" has no plan "gold": its plans are enterprise, pro`) {
		t.Errorf("unknown plan: %v", err)
	}

	for _, tc := range []struct{ name, doc, want string }{
		{"override plan and limit", tierDoc("  - {rule: per-business, key: b1, tier: pro, gcra: {rate: 2, per: 1s}}\n"), `line 12: overrides[1].tier: an override puts the key on a plan (tier), exempts it (unlimited) or gives it a limit: one of them`},
		{"override unknown plan", tierDoc("  - {rule: per-business, key: b1, tier: gold}\n"), `line 12: overrides[1].tier: rule "per-business" has no plan "gold"`},
		{"other kind", strings.Replace(tierDoc(""), "enterprise: {gcra: {rate: 20, per: 1s}}", "enterprise: {quota: {limit: 20, every: 1s}}", 1), `line 8: rule "per-business": tiers.enterprise.quota: is 20 per 1s (fixed window); the rule is 1/1s burst 1 (GCRA), and a plan keeps the kind of limit`},
		{"bad limit", strings.Replace(tierDoc(""), "rate: 5,", "rate: -5,", 1), `line 7: rule "per-business": tiers.pro.gcra.rate: must be a positive number`},
		{"no limit", strings.Replace(tierDoc(""), "pro: {gcra: {rate: 5, per: 1s, burst: 2}}", "pro: {}", 1), `line 7: rule "per-business": tiers.pro: no limit`},
		{"bad name", strings.Replace(tierDoc(""), "pro:", "pro plan:", 1), `rule "per-business": tiers.pro plan: plan name:`},
		{"not a mapping", strings.Replace(tierDoc(""), "tiers:\n      pro: {gcra: {rate: 5, per: 1s, burst: 2}}\n      enterprise: {gcra: {rate: 20, per: 1s}}", "tiers: [pro]", 1), `tiers: must be a mapping of names`},
		{"tier without tiers", strings.Replace(tierDoc(""), "    tiers:\n      pro: {gcra: {rate: 5, per: 1s, burst: 2}}\n      enterprise: {gcra: {rate: 20, per: 1s}}\n", "", 1), `line 5: rule "per-business": tier: set, but the rule has no tiers`},
		{"global rule", strings.Replace(tierDoc(""), "    key: \"{{.business_id}}\"\n", "", 1), `rule "per-business": tiers: only a rule with a key from the payload has plans`},
		{"borrow true", strings.Replace(tierDoc(""), "    soft: 10%\n", "    borrow: true\n", 1), `rule "per-business": borrow: true borrows up to the shared rule's rate from the rule's own, which its plans do not share`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestOverridesRoundTrip: a policy's overrides, as Overrides reports them
// (a plan's with the plan's limit), are accepted again by WithOverrides.
func TestOverridesRoundTrip(t *testing.T) {
	p, err := Parse([]byte(tierDoc("  - {rule: per-business, key: b9, tier: enterprise}\n  - {rule: per-business, key: b8, unlimited: true}\n  - {rule: per-business, key: b7, gcra: {rate: 3, per: 1s}}\n")))
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.WithOverrides(p.Overrides()...)
	if err != nil || !slices.Equal(q.Overrides(), p.Overrides()) {
		t.Fatalf("%v: %+v, want %+v", err, q.Overrides(), p.Overrides())
	}
	wrong := Override{Rule: "per-business", Key: "b9", Tier: "enterprise", Limit: limits.GCRA{Rate: 3, Period: time.Second}}
	if _, err := p.WithOverrides(wrong); err == nil || !strings.Contains(err.Error(), "overrides[1].tier: an override puts the key on a plan") {
		t.Errorf("a plan with another limit: %v", err)
	}
}

// TestUnlimitedCost: a key exempt from a rule with a cost pays none of it:
// its payload may lack the cost's field, and a cost above the rule's burst
// is not refused, while other keys' are.
func TestUnlimitedCost(t *testing.T) {
	p, err := Parse([]byte(`rules:
  - name: points
    match: {type: job}
    key: "{{.business_id}}"
    cost: "{{.units}}"
    gcra: {rate: 10, per: 1s, burst: 5}
overrides:
  - {rule: points, key: b9, unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("job", "q")
	rq, err := b.Request([]byte(`{"business_id": "b9"}`))
	if err != nil {
		t.Fatalf("exempt key without units: %v", err)
	}
	if err := b.ForKeys(rq.Keys).CheckCosts([]int{50}); err != nil {
		t.Errorf("exempt key's cost checked: %v", err)
	}
	if _, err := b.Request([]byte(`{"business_id": "b1"}`)); err == nil {
		t.Error("b1 without units: no error")
	}
	if err := b.ForKeys([]string{"b1"}).CheckCosts([]int{50}); err == nil {
		t.Error("b1's cost of 50 over a burst of 5: no error")
	}
}
