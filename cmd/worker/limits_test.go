package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestLimitsCommand: worker limits set, list and rm against a Redis,
// checked against a policy file when given one; a bad limit or argument is
// refused before anything connects.
func TestLimitsCommand(t *testing.T) {
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	base := []string{"--redis", "redis://" + redistest.Addr(t), "--prefix", prefix}
	run := func(args ...string) (int, string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := cli(context.Background(), append([]string{"limits"}, args...), noEnv, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	policy := writePolicy(t, goodPolicy+`  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 1, per: 1s}
`)
	if code, out, errs := run(append([]string{"set", "per-business", "b7", "gcra: {rate: 5, per: 1s, burst: 2}", "--policy", policy}, base...)...); code != exitOK || out != "set: rule per-business key b7: gcra: {rate: 5, per: 1s, burst: 2}\n" {
		t.Fatalf("set: exit %d, %q %q", code, out, errs)
	}
	// Flags first, a key with a space.
	if code, _, errs := run(append(base, "set", "per-business", "acme corp", "gcra: {rate: 2, per: 1s}")...); code != exitOK {
		t.Fatalf("set: exit %d, %q", code, errs)
	}
	code, out, _ := run(append([]string{"list"}, base...)...)
	want := "RULE          KEY        LIMIT\nper-business  acme corp  gcra: {rate: 2, per: 1s}\nper-business  b7         gcra: {rate: 5, per: 1s, burst: 2}\n"
	if code != exitOK || out != want {
		t.Fatalf("list: exit %d\n%s\nwant\n%s", code, out, want)
	}
	store := overrides.New(c, prefix)
	v1, _ := store.Version(context.Background())
	if code, out, _ := run(append([]string{"rm", "per-business", "b7"}, base...)...); code != exitOK || out != "removed: rule per-business key b7\n" {
		t.Fatalf("rm: exit %d, %q", code, out)
	}
	if v2, _ := store.Version(context.Background()); v2 <= v1 {
		t.Errorf("version %d after a removal, %d before", v2, v1)
	}
	if code, out, _ := run(append([]string{"rm", "per-business", "b7"}, base...)...); code != exitOK || out != "no override for rule per-business key b7\n" {
		t.Fatalf("rm again: exit %d, %q", code, out)
	}
	list, _ := store.List(context.Background())
	if len(list) != 1 || list[0].Key != "acme corp" || list[0].Err != nil {
		t.Fatalf("stored %+v", list)
	}
	// tier and unlimited are stored as their specs and read back as such.
	tiered := writePolicy(t, goodPolicy+`  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    tiers: {pro: {gcra: {rate: 3, per: 1s}}}
    gcra: {rate: 1, per: 1s}
`)
	if code, out, errs := run(append([]string{"tier", "per-business", "b8", "pro", "--policy", tiered}, base...)...); code != exitOK || out != "set: rule per-business key b8: tier: pro\n" {
		t.Fatalf("tier: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := run(append([]string{"set", "per-business", "b9", "unlimited", "--policy", tiered}, base...)...); code != exitOK {
		t.Fatalf("unlimited: exit %d, %q", code, errs)
	}
	if list, _ = store.List(context.Background()); len(list) != 3 || list[1].Tier != "pro" || list[1].Err != nil || !list[2].Unlimited || list[2].Err != nil {
		t.Fatalf("stored %+v", list)
	}
	if code, _, errs := run(append([]string{"tier", "per-business", "b8", "gold", "--policy", tiered}, base...)...); code != exitUsage || !strings.Contains(errs, `rule "per-business" has no plan "gold": its plans are pro`) {
		t.Errorf("an unknown plan: exit %d, %q", code, errs)
	}

	addr, conns := countingListener(t)
	unreached := []string{"--redis", "redis://" + addr}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "per-business", "b7", "gcra: {rate: -5, per: 1s}"}, "gcra.rate: must be a positive number"},
		{[]string{"set", "per-business", "b7", "rate: 5"}, "rate: unknown field"},
		{[]string{"set", "per-business", "b7"}, "set takes 3 arguments, got 2"},
		{[]string{"move", "a", "b"}, `unknown command "move"`},
		{[]string{}, "want list, set, tier, rm, pause or resume"},
		{[]string{"tier", "per-business", "b7"}, "tier takes 3 arguments, got 2"},
		{[]string{"set", "peak", "b7", "gcra: {rate: 5, per: 1s}", "--policy", policy}, `overrides[1].rule: rule "peak" has no key`},
		{[]string{"set", "per-business", "b7", "quota: {limit: 5, every: 1s}", "--policy", policy}, "an override keeps the kind of limit"},
		{[]string{"list", "--bogus"}, "flag provided but not defined: --bogus"},
		{[]string{"list", "--redis-tls-ca", policy}, "--redis-tls-ca: a CA file is for TLS, which is not on"},
		{[]string{"list", "--redis-tls", "--redis-tls-ca", policy}, "--redis-tls-ca: " + policy + " holds no PEM certificate"},
	} {
		code, out, errs := run(append(tc.args, unreached...)...)
		if code != exitUsage || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %q", tc.args, code, out, errs, tc.want)
		}
	}
	if n := conns.Load(); n != 0 {
		t.Errorf("%d connections for refused commands", n)
	}
	if code, out, _ := run("--help"); code != exitOK || out != limitsUsage {
		t.Errorf("--help: exit %d, %q", code, out)
	}
}
