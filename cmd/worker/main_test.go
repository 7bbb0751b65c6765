package main

import (
	"bytes"
	"context"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	code := redistest.Run(m)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// logBuffer is a concurrency-safe writer for a worker's stderr.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until a line of the log matches re and returns its
// submatches; done, when closed first, fails the test.
func (l *logBuffer) waitFor(t *testing.T, re *regexp.Regexp, done <-chan struct{}) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := re.FindStringSubmatch(l.String()); m != nil {
			return m
		}
		select {
		case <-done:
			if m := re.FindStringSubmatch(l.String()); m != nil {
				return m
			}
			t.Fatalf("worker ended before logging %q; log:\n%s", re, l)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line matching %q within 60s; log:\n%s", re, l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writePolicy(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const goodPolicy = `rules:
  - name: peak
    match: {type: "http:call"}
    gcra: {rate: 100, per: 1s, burst: 10}
`

func noEnv(string) string { return "" }

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--redis", "redis://:pw@db.example:6380/2", "--policy", "p.yaml", "--concurrency", "7",
		"--queues", "critical=6, default=3,low", "--metrics-addr", ":9090", "--log-format=json", "-log-level", "debug", "--shadow"}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.redis.String(); got != "db.example:6380 db 2" {
		t.Errorf("redis %s", got)
	}
	if cfg.concurrency != 7 || cfg.policyPath != "p.yaml" || cfg.metricsAddr != ":9090" || cfg.logFormat != "json" || cfg.logLevel.String() != "DEBUG" || !cfg.shadow {
		t.Errorf("config %+v", cfg)
	}
	if got := cfg.queueList(); got != "critical=6,default=3,low=1" {
		t.Errorf("queues %s", got)
	}
	if cfg.pool < 2*7 {
		t.Errorf("pool size %d too small for concurrency 7", cfg.pool)
	}

	// Defaults, and REDIS_URL.
	cfg, err = parseFlags([]string{"--policy", "p.yaml"}, func(k string) string {
		if k == "REDIS_URL" {
			return "rediss://cache.example"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.redis.String() != "cache.example:6379 db 0" || !cfg.redis.TLS() {
		t.Errorf("REDIS_URL not used: %s", cfg.redis)
	}
	if cfg.concurrency != 10 || cfg.queueList() != "default=1" || cfg.shutdownTimeout != 30*time.Second ||
		cfg.maxHold != 500*time.Millisecond || cfg.prefix != "taskrl:" || cfg.logFormat != "text" || cfg.metricsAddr != "" || cfg.shadow || cfg.maxPayload != 1<<20 {
		t.Errorf("defaults %+v", cfg)
	}
	// --redis beats REDIS_URL.
	cfg, err = parseFlags([]string{"--policy", "p", "--redis", "10.0.0.1:7000"}, func(string) string { return "redis://other:1" })
	if err != nil || cfg.redis.String() != "10.0.0.1:7000 db 0" {
		t.Errorf("--redis host:port: %+v, %v", cfg, err)
	}
	// A cluster: from the flag (beating REDIS_URL) or REDIS_CLUSTER_ADDRS
	// (beaten by --redis).
	env := func(k string) string {
		return map[string]string{"REDIS_URL": "redis://other:1", "REDIS_CLUSTER_ADDRS": "10.0.0.1:7000,10.0.0.2:7000"}[k]
	}
	cfg, err = parseFlags([]string{"--policy", "p", "--redis-cluster", "n1:7000, n2:7001"}, env)
	if err != nil || !cfg.redis.Cluster() || cfg.redis.String() != "cluster n1:7000,n2:7001" {
		t.Errorf("--redis-cluster: %v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"--policy", "p", "--redis", "one:6379"}, env)
	if err != nil || cfg.redis.Cluster() {
		t.Errorf("--redis with REDIS_CLUSTER_ADDRS set: %v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"--policy", "p"}, func(k string) string { return env(k) + map[string]string{"REDIS_URL": ""}[k] })
	if err == nil {
		t.Errorf("REDIS_URL and REDIS_CLUSTER_ADDRS both set, no flag: accepted %v", cfg)
	}
	cfg, err = parseFlags([]string{"--policy", "p", "--redis-cluster", "rediss://:s3cret@n1:7000?addr=n2:7000", "--redis-password", "other"}, noEnv)
	if err != nil || cfg.redis.String() != "cluster n1:7000,n2:7000" || !cfg.redis.TLS() {
		t.Errorf("cluster URL: %v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"--policy", "p", "--redis-sentinel", "m@s1:26379,s2:26379", "--redis-tls"}, noEnv)
	if err != nil || cfg.redis.String() != "sentinel m@s1:26379,s2:26379 db 0" || !cfg.redis.TLS() {
		t.Errorf("--redis-sentinel --redis-tls: %v, %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"--policy", "p"}, func(k string) string { return map[string]string{"REDIS_SENTINEL": "m@s1:26379"}[k] })
	if err != nil || cfg.redis.String() != "sentinel m@s1:26379 db 0" || cfg.redis.TLS() {
		t.Errorf("REDIS_SENTINEL: %v, %v", cfg, err)
	}
	// --redis-tls-ca, for every form that uses TLS.
	ca := redistest.NewTestPKI(t).CAFile
	for _, args := range [][]string{
		{"--redis", "rediss://:pw@db.example:6380"},
		{"--redis", "db.example:6380", "--redis-tls"},
		{"--redis-cluster", "n1:7000,n2:7000", "--redis-tls"},
		{"--redis-sentinel", "m@s1:26379", "--redis-tls"},
	} {
		cfg, err := parseFlags(append([]string{"--policy", "p", "--redis-tls-ca", ca}, args...), noEnv)
		if err != nil || !cfg.redis.TLS() {
			t.Errorf("%q --redis-tls-ca: %v, %v", args, cfg, err)
		}
	}
	// A Redis of their own for the limits, in each form; none: the queues'.
	if cfg, err = parseFlags([]string{"--policy", "p", "--redis", "q:6379"}, noEnv); err != nil || cfg.ownLimits {
		t.Errorf("no --limits-redis: %v, %v; want the limits on the queues' Redis", cfg, err)
	}
	for args, want := range map[[4]string]string{
		{"--limits-redis", "redis://:pw@l:6380/2"}:                          "l:6380 db 2",
		{"--limits-redis-cluster", "n1:7000,n2:7000"}:                       "cluster n1:7000,n2:7000",
		{"--limits-redis-sentinel", "m@s1:26379", "--limits-redis-tls", ""}: "sentinel m@s1:26379 db 0",
	} {
		a := []string{"--policy", "p", "--redis", "q:6379", args[0], args[1]}
		if args[2] != "" {
			a = append(a, args[2])
		}
		cfg, err := parseFlags(a, func(k string) string { return map[string]string{"REDIS_CLUSTER_ADDRS": "x:1,y:1"}[k] })
		if err != nil || !cfg.ownLimits || cfg.limits.String() != want || cfg.redis.String() != "q:6379 db 0" || cfg.limits.TLS() != (args[2] != "") {
			t.Errorf("%q: %v, %v; want limits on %s", a, cfg, err, want)
		}
	}
	for in, want := range map[string]string{"localhost": "localhost:6379", "::1": "[::1]:6379", "[::1]:7001": "[::1]:7001", ":6390": "localhost:6390"} {
		cfg, err := parseFlags([]string{"--policy", "p", "--redis", in}, noEnv)
		if err != nil || cfg.redis.String() != want+" db 0" {
			t.Errorf("--redis %s: %v, %v; want %s", in, cfg, err, want)
		}
	}
}

func TestBadFlags(t *testing.T) {
	policy := writePolicy(t, goodPolicy)
	base := []string{"--redis", "localhost:6379", "--policy", policy}
	ca, missing := redistest.NewTestPKI(t).CAFile, filepath.Join(t.TempDir(), "missing.pem")
	cases := []struct {
		args []string
		env  string // REDIS_URL
		want string
	}{
		{[]string{"--policy", policy}, "", "--redis (or REDIS_URL), --redis-cluster (or REDIS_CLUSTER_ADDRS) or --redis-sentinel (or REDIS_SENTINEL) is required"},
		{[]string{"--policy", policy, "--redis", "a:1", "--redis-cluster", "b:1,c:1"}, "", "are exclusive; give one"},
		{[]string{"--policy", policy, "--redis-sentinel", "m@a:1", "--redis-cluster", "b:1,c:1"}, "", "are exclusive; give one"},
		{[]string{"--policy", policy, "--redis-sentinel", "a:1"}, "", "--redis-sentinel: no primary name before @"},
		{[]string{"--policy", policy, "--redis-cluster", "b:1,,c:1"}, "", "--redis-cluster: want host:port,host:port,..."},
		{[]string{"--policy", policy, "--redis-cluster", "b:1,c:0"}, "", `--redis-cluster: node "c:0": port must be a number`},
		{[]string{"--policy", policy, "--redis-cluster", "redis://:hunter2@b:x?addr=c:1"}, "", "--redis-cluster: not a valid Redis Cluster URL"},
		{[]string{"--redis", "localhost"}, "", "--policy is required"},
		{append(base, "--concurrency", "0"), "", "--concurrency must be at least 1, got 0"},
		{append(base, "--concurrency", "-3"), "", "--concurrency must be at least 1"},
		{append(base, "--concurrency", "many"), "", `invalid value "many" for flag --concurrency`},
		{append(base, "--queues", "a=1,b=0"), "", `--queues: weight of queue "b" must be a positive integer, got "0"`},
		{append(base, "--queues", "a=1.5"), "", `--queues: weight of queue "a" must be a positive integer`},
		{append(base, "--queues", "a=x"), "", `--queues: weight of queue "a" must be a positive integer`},
		{append(base, "--queues", "=2"), "", "--queues: empty queue name"},
		{append(base, "--queues", "a=1,,b=1"), "", "--queues: empty entry"},
		{append(base, "--queues", ""), "", "--queues: empty entry"},
		{append(base, "--queues", "a=1,a=2"), "", `--queues: queue "a" is listed twice`},
		{append(base, "--metrics-addr", "9090"), "", "--metrics-addr must be host:port or :port"},
		{append(base, "--metrics-addr", ":http"), "", "--metrics-addr: port must be a number"},
		{append(base, "--shutdown-timeout", "0s"), "", "--shutdown-timeout must be a positive duration"},
		{append(base, "--shutdown-timeout", "30"), "", `invalid value "30" for flag --shutdown-timeout`},
		{append(base, "--max-hold", "-1s"), "", "--max-hold must be a positive duration"},
		{append(base, "--log-format", "xml"), "", `--log-format must be text or json, got "xml"`},
		{append(base, "--log-level", "loud"), "", `--log-level must be debug, info, warn or error, got "loud"`},
		{append(base, "--local-share", "0"), "", "--local-share must be at least 1"},
		{append(base, "--allow-hosts", "https://api.example.com"), "", `--allow-hosts: "https://api.example.com" is a URL; give the host alone`},
		{append(base, "--allow-hosts", "api.example.com,a.*.b"), "", `--allow-hosts: "a.*.b": "*" is allowed only as a whole first label`},
		{append(base, "--max-payload", "0"), "", `--max-payload: want a size between 1 and 512MiB, such as 1048576, 64KiB or 1MiB; got "0"`},
		{append(base, "--max-payload", "1GB"), "", `--max-payload: want a size between 1 and 512MiB`},
		{append(base, "--max-payload", "513MiB"), "", `--max-payload: want a size between 1 and 512MiB`},
		{append(base, "--prefix", ""), "", "--prefix must not be empty"},
		{append(base, "--prefix", "a{b"), "", "--prefix: prefix \"a{b\" contains '{'"},
		{append(base, "--bogus"), "", "unknown flag: --bogus"},
		{append(base, "extra"), "", `unexpected argument "extra"`},
		{append(base, "--redis"), "", "flag needs an argument: --redis"},
		{[]string{"--policy", policy}, "http://localhost:6379", "--redis: not a valid Redis URL"},
		{[]string{"--policy", policy, "--redis", "redis://:hunter2@host:port/0"}, "", "--redis: not a valid Redis URL"},
		{[]string{"--policy", policy, "--redis", "redis://host/db9x"}, "", "--redis: not a valid Redis URL"},
		{[]string{"--policy", policy, "--redis", "host:0"}, "", "--redis: port must be a number from 1 to 65535"},
		{[]string{"--policy", policy, "--redis", "user@host"}, "", "is neither a Redis URL nor host:port"},
		{[]string{"--policy", policy, "--redis", "rediss://:hunter2@host?skip_verify=true"}, "", "--redis: skip_verify is refused: the server's certificate is always verified"},
		{append(base, "--redis-tls-ca", ca), "", "--redis-tls-ca: a CA file is for TLS, which is not on: use a rediss:// URL or --redis-tls"},
		{[]string{"--policy", policy, "--redis", "redis://:hunter2@host", "--redis-tls-ca", ca}, "", "--redis-tls-ca: a CA file is for TLS, which is not on"},
		{[]string{"--policy", policy, "--redis", "rediss://:hunter2@host", "--redis-tls-ca", missing}, "", "--redis-tls-ca: open " + missing + ": no such file"},
		{[]string{"--policy", policy, "--redis", "host", "--redis-tls", "--redis-tls-ca", policy}, "", "--redis-tls-ca: " + policy + " holds no PEM certificate"},
		{[]string{"--policy", policy, "--redis-cluster", "a:1,b:1", "--redis-tls-ca", ca}, "", "--redis-tls-ca: a CA file is for TLS, which is not on"},
		{append(base, "--limits-redis", "a:1", "--limits-redis-cluster", "b:1,c:1"), "", "--limits-redis, --limits-redis-cluster and --limits-redis-sentinel are exclusive: give one"},
		{append(base, "--limits-redis", "redis://:hunter2@host:port/0"), "", "--limits-redis: not a valid Redis URL"},
		{append(base, "--limits-redis-sentinel", "a:1"), "", "--limits-redis-sentinel: no primary name before @"},
		{append(base, "--limits-redis-password", "hunter2"), "", "--limits-redis-password needs --limits-redis, --limits-redis-cluster or --limits-redis-sentinel"},
		{append(base, "--limits-redis", "l:1", "--limits-redis-tls-ca", ca), "", "--limits-redis-tls-ca: a CA file is for TLS, which is not on"},
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := cli(context.Background(), tc.args, func(k string) string {
			if k == "REDIS_URL" {
				return tc.env
			}
			return ""
		}, &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d; stderr %s", tc.args, code, exitUsage, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: stderr %q does not say %q", tc.args, stderr.String(), tc.want)
		}
		if strings.Contains(stderr.String(), "hunter2") {
			t.Errorf("%q: stderr %q shows the password", tc.args, stderr.String())
		}
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "-help"} {
		var stdout, stderr bytes.Buffer
		if code := cli(context.Background(), []string{arg}, noEnv, &stdout, &stderr); code != exitOK {
			t.Errorf("%s: exit %d, want 0", arg, code)
		}
		if stdout.String() != usageText {
			t.Errorf("%s printed %q, want the usage text", arg, stdout.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := cli(context.Background(), []string{"--version"}, noEnv, &stdout, &stderr); code != exitOK || !strings.HasPrefix(stdout.String(), "worker taskrl ") {
		t.Errorf("--version: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
	// Every flag is described, in its --name form.
	fs, _ := newFlagSet(noEnv)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(usageText, "  --"+f.Name+" ") {
			t.Errorf("usage text does not describe --%s", f.Name)
		}
	})
	for _, s := range []string{"REDIS_URL", "Exit status", "http:call", "Idempotency-Key"} {
		if !strings.Contains(usageText, s) {
			t.Errorf("usage text does not mention %s", s)
		}
	}
}

// countingListener stands in for Redis and counts the connections it
// accepts.
func countingListener(t *testing.T) (addr string, conns *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), conns
}

// TestBadPolicy checks that a wrong policy file stops the start before
// anything connects, with the loader's messages (line, rule, field).
func TestBadPolicy(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"negative rate", `rules:
  - name: vendor-peak
    match: {type: "http:call"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: -1, per: 1s}
`, []string{"line 8", `rule "per-business"`, "gcra.rate", "positive"}},
		{"two wrong rules", `rules:
  - name: a
    match: {type: "http:call"}
    quota: {limit: 10, every: 10}
  - name: b
    match: {type: "http:call"}
    concurrency: {max: 0, lease: 30s}
`, []string{`rule "a"`, "quota.every", `rule "b"`, "concurrency.max"}},
		{"unknown field", `rules:
  - name: a
    match: {type: "http:call"}
    gcra: {rate: 1, per: 1s, brust: 2}
`, []string{`rule "a"`, "brust"}},
		{"empty", ``, []string{"policy"}},
		{"two limits", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n    quota: {limit: 10, every: 10s}\n", []string{"line 5", "rule \"a\"", "has both gcra and quota"}},
		{"zero period", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 0s}\n", []string{"rule \"a\"", "gcra.per", "must be positive"}},
		{"zero burst", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s, burst: 0}\n", []string{"gcra.burst", "at least 1"}},
		{"bad cron", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    quota: {limit: 10, cron: \"61 * * * *\"}\n", []string{"quota.cron", "bad cron spec"}},
		{"unknown time zone", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    quota: {limit: 10, cron: \"0 0 * * *\", tz: \"Mars/Olympus\"}\n", []string{"quota.tz", "unknown time zone"}},
		{"every and cron", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    quota: {limit: 10, every: 10s, cron: \"@daily\"}\n", []string{"quota", "both every and cron"}},
		{"bad template", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    key: \"{{.business_id\"\n    gcra: {rate: 1, per: 1s}\n", []string{"key", "bad template"}},
		{"duplicate names", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n", []string{"line 5", "name", "already the name of rule 1"}},
		{"short lease", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    concurrency: {max: 2, lease: 5s}\n", []string{"concurrency.lease", "at least 30s"}},
		{"no limit", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n", []string{"rule \"a\"", "no limit"}},
		{"bad glob", "rules:\n  - name: a\n    match: {type: \"http:[\"}\n    gcra: {rate: 1, per: 1s}\n", []string{"match.type", "bad pattern"}},
		{"no match", "rules:\n  - name: a\n    gcra: {rate: 1, per: 1s}\n", []string{"match", "needs a task type"}},
		{"bad name", "rules:\n  - name: \"a b\"\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n", []string{"rule 1", "name"}},
		{"default_key without key", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    default_key: x\n    gcra: {rate: 1, per: 1s}\n", []string{"default_key"}},
		{"unknown top-level field", "rulez: []\n", []string{"rulez", "unknown field"}},
		{"bad failure mode", "redis_unavailable: maybe\nrules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n", []string{"redis_unavailable", "open, closed or local"}},
		{"not YAML", "rules: [\n", []string{"line 1", "YAML"}},
		{"fair window", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    fair: \"{{.business_id}}\"\n    quota: {limit: 10, every: 10s}\n", []string{"line 4", `rule "a"`, "fair", "only a gcra rate"}},
		{"bad fair template", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    fair: \"{{.business_id\"\n    gcra: {rate: 1, per: 1s}\n", []string{"line 4", "fair", "bad template"}},
		{"bad critical matcher", "critical:\n  - {queue: critical}\n  - {type: \"pay:[\"}\nrules:\n  - name: a\n    match: {type: \"http:call\"}\n    gcra: {rate: 1, per: 1s}\n", []string{"line 3", "critical[2].type", "bad pattern"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, conns := countingListener(t)
			metricsAddr, _ := countingListener(t) // a port in use: binding it would fail loudly
			path := writePolicy(t, tc.yaml)
			var stdout, stderr bytes.Buffer
			code := cli(context.Background(), []string{"--redis", "redis://" + addr, "--policy", path, "--concurrency", "2", "--metrics-addr", metricsAddr}, noEnv, &stdout, &stderr)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			msg := stderr.String()
			for _, w := range append(tc.want, path, "refusing to start") {
				if !strings.Contains(msg, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, msg)
				}
			}
			if strings.Contains(msg, "worker started") || strings.Contains(msg, "metrics") {
				t.Errorf("worker started something:\n%s", msg)
			}
			if n := conns.Load(); n != 0 {
				t.Errorf("%d connections to Redis before the policy was checked", n)
			}
		})
	}
}

func TestRedisUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var stdout, stderr bytes.Buffer
	code := cli(context.Background(), []string{"--redis", "redis://:hunter2@" + addr, "--policy", writePolicy(t, goodPolicy)}, noEnv, &stdout, &stderr)
	if code != exitRuntime {
		t.Errorf("exit %d, want %d", code, exitRuntime)
	}
	if !strings.Contains(stderr.String(), "cannot reach Redis at "+addr) {
		t.Errorf("stderr does not explain: %s", stderr.String())
	}
	if strings.Contains(stderr.String(), "hunter2") {
		t.Errorf("stderr shows the password: %s", stderr.String())
	}
}

func TestMetricsAddrInUse(t *testing.T) {
	busy, _ := countingListener(t)
	var stdout, stderr bytes.Buffer
	prefix := redistest.Prefix(t)
	code := cli(context.Background(), []string{"--redis", redistest.Addr(t), "--policy", writePolicy(t, goodPolicy),
		"--queues", strings.TrimSuffix(prefix, ":"), "--prefix", prefix, "--metrics-addr", busy}, noEnv, &stdout, &stderr)
	if code != exitRuntime {
		t.Errorf("exit %d, want %d", code, exitRuntime)
	}
	if !strings.Contains(stderr.String(), "--metrics-addr") || !strings.Contains(stderr.String(), "address already in use") {
		t.Errorf("stderr does not explain: %s", stderr.String())
	}
}

// TestMetricsServerTimeouts: the metrics server cuts off slow clients.
func TestMetricsServerTimeouts(t *testing.T) {
	s := metricsServer(http.NotFoundHandler())
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 || s.MaxHeaderBytes > 1<<20 {
		t.Errorf("metrics server %+v: every timeout and a header limit must be set", s)
	}
}
