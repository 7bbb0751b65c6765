package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// TestReloader: the file is reloaded when its content changes and on a
// forced check (SIGHUP), not otherwise; a file that does not validate or
// cannot be read keeps the running policy, logs each error with its line
// and field once per content, and counts a refusal.
func TestReloader(t *testing.T) {
	path := writePolicy(t, goodPolicy)
	first, err := policy.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	var applied []*policy.Policy
	var ok, refused int
	data, _ := os.ReadFile(path)
	r := &reloader{
		path:   path,
		apply:  func(p *policy.Policy, _ httpConf) error { applied = append(applied, p); return nil },
		logger: slog.New(slog.NewTextHandler(&logs, nil)),
		result: func(good bool) {
			if good {
				ok++
			} else {
				refused++
			}
		},
		base: first,
		seen: data,
	}
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if r.check(false) || len(applied) != 0 {
		t.Fatal("an unchanged file was reloaded")
	}

	changed := strings.Replace(goodPolicy, "rate: 100", "rate: 50", 1) + `  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s}
`
	write(changed)
	if !r.check(false) || len(applied) != 1 {
		t.Fatal("a changed file was not reloaded")
	}
	if got := applied[0].Rules(); len(got) != 2 || got[0].Limit.(quotas.GCRA).Rate != 50 {
		t.Fatalf("applied %+v", got)
	}
	if !strings.Contains(logs.String(), `msg="policy reloaded"`) || !strings.Contains(logs.String(), "added=[per-business]") || !strings.Contains(logs.String(), "changed=[peak]") {
		t.Errorf("reload not logged with what changed:\n%s", logs.String())
	}

	bad := strings.Replace(changed, "rate: 2,", "rate: -2,", 1) + "  - name: peak\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n"
	write(bad)
	logs = logBuffer{}
	if r.check(false) || len(applied) != 1 || refused != 1 {
		t.Fatalf("a bad file was applied (applied %d, refused %d)", len(applied), refused)
	}
	for _, want := range []string{"policy reload refused; keeping the running policy", "errors=2", "line 8", `rule \"per-business\": gcra.rate`, "line 9", "already the name of rule 1"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log does not mention %q:\n%s", want, logs.String())
		}
	}
	logs = logBuffer{}
	if r.check(false) || refused != 1 || logs.String() != "" {
		t.Errorf("the same bad content was refused again (%d) or logged again:\n%s", refused, logs.String())
	}
	if r.check(true) || refused != 2 {
		t.Errorf("SIGHUP on a bad file: refused %d, want 2", refused)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	logs = logBuffer{}
	if r.check(false) || refused != 3 || !strings.Contains(logs.String(), "no such file") {
		t.Errorf("a removed file: refused %d, log:\n%s", refused, logs.String())
	}
	write(changed) // back: new content after a gap, applied again
	if !r.check(false) || len(applied) != 2 || ok != 2 {
		t.Errorf("the file restored: applied %d, ok %d", len(applied), ok)
	}
	if !r.check(true) || len(applied) != 3 {
		t.Errorf("SIGHUP on an unchanged good file did not reload")
	}
}

// TestReloadEgress: a reloaded policy file's http.allow_hosts takes effect
// at once unless --allow-hosts was given; its settle headers too.
func TestReloadEgress(t *testing.T) {
	p, err := policy.Parse([]byte(goodPolicy))
	if err != nil {
		t.Fatal(err)
	}
	parse := func(doc string) httpConf {
		hc, err := parseHTTPConf("", []byte(doc+goodPolicy), p)
		if err != nil {
			t.Fatal(err)
		}
		return hc
	}
	logs := &logBuffer{}
	logger := newLogger(logs, "text", slog.LevelInfo)
	set := func(*policy.Policy) error { return nil }
	u, _ := url.Parse("https://api.example.com/")

	cfg := &config{}
	guard := new(egress.Guard)
	guard.Set(cfg.egressPolicy(parse("")))
	settle := new(atomic.Pointer[map[string]string])
	apply := cfg.applyHTTP(guard, settle, logger, set)
	if err := guard.CheckURL(u); err != nil {
		t.Fatalf("unrestricted: %v", err)
	}
	apply(p, parse("http: {allow_hosts: [other.example.com]}\n"))
	if guard.CheckURL(u) == nil || !strings.Contains(logs.String(), `msg="http:call may call only the allowed hosts" allow_hosts=[other.example.com] from="policy file"`) {
		t.Fatalf("a reloaded allow list not applied; log:\n%s", logs)
	}
	apply(p, parse(""))
	if err := guard.CheckURL(u); err != nil || !strings.Contains(logs.String(), "http:call is unrestricted") {
		t.Fatalf("the allow list removed: %v; log:\n%s", err, logs)
	}

	// --allow-hosts beats the file, across reloads.
	cfg.allowHosts, _ = egress.ParseList("api.example.com")
	guard.Set(cfg.egressPolicy(parse("http: {allow_hosts: [other.example.com]}\n")))
	apply = cfg.applyHTTP(guard, settle, logger, set)
	apply(p, parse("http: {allow_hosts: [third.example.com]}\n"))
	if err := guard.CheckURL(u); err != nil {
		t.Fatalf("--allow-hosts overridden by the file: %v", err)
	}
	if *settle.Load() != nil {
		t.Fatalf("settle headers %v, want none", *settle.Load())
	}
	costly, err := policy.Parse([]byte(goodPolicy + "    cost: \"{{.units}}\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	hc, err := parseHTTPConf("", []byte("http: {settle_headers: [{rule: peak, header: X-Actual-Cost}]}\n"+goodPolicy+"    cost: \"{{.units}}\"\n"), costly)
	if err != nil {
		t.Fatal(err)
	}
	apply(costly, hc)
	if got := *settle.Load(); got["peak"] != "X-Actual-Cost" || len(got) != 1 {
		t.Fatalf("settle headers %v after a reload", got)
	}
}

// TestCheck: --check validates the policy file without connecting to
// anything and exits 0 or 2.
func TestCheck(t *testing.T) {
	var stdout, stderr bytes.Buffer
	good := writePolicy(t, goodPolicy)
	if code := cli(context.Background(), []string{"--check", "--policy", good}, noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d for a good file: %s", code, stderr.String())
	}
	if want := "policy " + good + ": ok, 1 rules (peak), redis_unavailable: closed\n"; stdout.String() != want {
		t.Errorf("printed %q, want %q", stdout.String(), want)
	}
	stdout.Reset()
	bad := writePolicy(t, "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s, burst: 0}\n")
	if code := cli(context.Background(), []string{"--check", "--policy", bad}, noEnv, &stdout, &stderr); code != exitUsage {
		t.Errorf("exit %d for a bad file, want %d", code, exitUsage)
	}
	if !strings.Contains(stderr.String(), "line 4") || !strings.Contains(stderr.String(), "gcra.burst") || stdout.Len() != 0 {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	stderr.Reset()
	stdout.Reset()
	hosts := writePolicy(t, "http:\n  allow_hosts: [api.example.com, \"*.vendor.io:443\"]\n"+goodPolicy)
	if code := cli(context.Background(), []string{"--check", "--policy", hosts}, noEnv, &stdout, &stderr); code != exitOK || !strings.HasSuffix(stdout.String(), "redis_unavailable: closed, http.allow_hosts: api.example.com, *.vendor.io:443\n") {
		t.Errorf("--check with allow_hosts: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	badHost := writePolicy(t, "http:\n  allow_hosts:\n    - http://api.example.com\n"+goodPolicy)
	if code := cli(context.Background(), []string{"--check", "--policy", badHost}, noEnv, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "line 3: http.allow_hosts[1]: \"http://api.example.com\" is a URL") {
		t.Errorf("--check with a bad host: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	probe := writePolicy(t, "shed: {signal: probe, above: 0.5, classes: [bulk]}\n"+goodPolicy)
	if code := cli(context.Background(), []string{"--check", "--policy", probe}, noEnv, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "shed.signal: probe is a Config.ShedProbe") {
		t.Errorf("--check with a probe signal: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := cli(context.Background(), []string{"--check"}, noEnv, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "--check needs --policy") {
		t.Errorf("--check without --policy: exit %d, %q", code, stderr.String())
	}
}

// TestReloaderLive: live overrides are applied over the file's policy when
// their version changes, and one the policy cannot take is skipped with a
// warning; a reload of the file keeps them.
func TestReloaderLive(t *testing.T) {
	ctx := context.Background()
	keyed := goodPolicy + "  - name: per-business\n    match: {type: \"http:call\"}\n    key: \"{{.business_id}}\"\n    gcra: {rate: 1, per: 1s}\n"
	path := writePolicy(t, keyed)
	base, err := policy.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	store := overrides.New(redistest.Client(t), redistest.Prefix(t))
	var logs logBuffer
	var applied *policy.Policy
	r := &reloader{path: path, apply: func(p *policy.Policy, _ httpConf) error { applied = p; return nil },
		logger: slog.New(slog.NewTextHandler(&logs, nil)), store: store, base: base, version: -1}
	for _, o := range [][3]string{{"per-business", "b7", "gcra: {rate: 5, per: 1s}"}, {"peak", "b7", "gcra: {rate: 5, per: 1s}"}} {
		if err := store.Set(ctx, o[0], o[1], o[2], nil); err != nil {
			t.Fatal(err)
		}
	}
	if !r.pollLive(ctx) || applied == nil {
		t.Fatal("live overrides not applied")
	}
	check := func() {
		t.Helper()
		if got := applied.Overrides(); len(got) != 1 || got[0].Key != "b7" || got[0].Limit.(quotas.GCRA).Rate != 5 {
			t.Errorf("applied overrides %+v", got)
		}
	}
	check()
	if !strings.Contains(logs.String(), `msg="live override skipped" rule=peak key=b7`) {
		t.Errorf("the unusable override was not reported:\n%s", logs.String())
	}
	if r.pollLive(ctx) {
		t.Error("applied again without a change")
	}
	if err := os.WriteFile(path, []byte(strings.Replace(keyed, "rate: 100", "rate: 90", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if !r.check(false) {
		t.Fatal("the changed file was not reloaded")
	}
	check()
}

// TestExamplePolicy: the sample policy the repository ships validates,
// with its overrides and its shadow rule.
func TestExamplePolicy(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := cli(context.Background(), []string{"--check", "--policy", "../../examples/policy.yaml"}, noEnv, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	p, err := policy.LoadFile("../../examples/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	shadow := 0
	for _, r := range p.Rules() {
		if r.Shadow {
			shadow++
		}
	}
	if len(p.Overrides()) != 2 || shadow != 1 || len(p.Critical()) != 1 || len(p.Throttle()) != 2 {
		t.Errorf("overrides %v, %d shadow rules, critical %v, throttle %v", p.Overrides(), shadow, p.Critical(), p.Throttle())
	}
}
