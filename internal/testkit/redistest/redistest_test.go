package redistest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { Main(m) }

func TestPrefixUniqueAndCleanup(t *testing.T) {
	ctx := context.Background()
	c := Client(t)
	cc := Cluster(t)

	var p1, p2 string
	var clusterKeys []string
	t.Run("weird *?[name]{x} with a very long tail that exceeds forty characters", func(t *testing.T) {
		p1, p2 = Prefix(t), Prefix(t)
		if p1 == p2 {
			t.Fatalf("Prefix returned %q twice", p1)
		}
		for _, p := range []string{p1, p2} {
			if strings.ContainsAny(p, "{}*?[]") || !strings.HasPrefix(p, "t:") || !strings.HasSuffix(p, ":") {
				t.Fatalf("bad prefix %q", p)
			}
			if name := strings.Split(p, ":")[1]; len(name) > 40 {
				t.Fatalf("name part of %q longer than 40", p)
			}
		}
		for i := range 50 {
			if err := c.Set(ctx, p1+"k"+string(rune('a'+i%26))+string(rune('0'+i/26)), "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Set(ctx, p2+"k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		for _, tag := range []string{"{a}", "{b}", "{c}", "x", "y"} {
			k := p1 + tag + "k"
			clusterKeys = append(clusterKeys, k)
			if err := cc.Set(ctx, k, "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	// The subtest's cleanups have run by now.
	for _, p := range []string{p1, p2} {
		keys, _, err := c.Scan(ctx, 0, globEscape(p)+"*", 10000).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 0 {
			t.Errorf("standalone keys left with prefix %q: %v", p, keys)
		}
	}
	for _, k := range clusterKeys {
		n, err := cc.Exists(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("cluster key %q still exists", k)
		}
	}
}

func TestPrefixDoesNotTouchOtherKeys(t *testing.T) {
	ctx := context.Background()
	c := Client(t)
	outer := Prefix(t)
	if err := c.Set(ctx, outer+"keep", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	t.Run("inner", func(t *testing.T) {
		p := Prefix(t)
		if err := c.Set(ctx, p+"gone", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
	if n := c.Exists(ctx, outer+"keep").Val(); n != 1 {
		t.Fatalf("key of another prefix was deleted")
	}
}

func TestClusterAcrossSlots(t *testing.T) {
	ctx := context.Background()
	cc := Cluster(t)
	p := Prefix(t)
	masters := ClusterAddrs(t)
	if len(masters) != 3 {
		t.Fatalf("ClusterAddrs = %v", masters)
	}
	owners := map[string]string{}
	for _, tag := range []string{"{a}x", "{b}x", "{c}x"} {
		k := p + tag
		if err := cc.Set(ctx, k, tag, 0).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := cc.Get(ctx, k).Result(); err != nil || v != tag {
			t.Fatalf("GET %s = %q, %v", k, v, err)
		}
		node, err := cc.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		addr := node.Options().Addr
		if !slices.Contains(masters, addr) {
			t.Fatalf("key %s on %s, not one of %v", k, addr, masters)
		}
		// The key really is stored on that master.
		direct := redis.NewClient(&redis.Options{Addr: addr})
		v, err := direct.Get(ctx, k).Result()
		direct.Close()
		if err != nil || v != tag {
			t.Fatalf("direct GET %s on %s = %q, %v", k, addr, v, err)
		}
		owners[addr] = k
	}
	if len(owners) != 3 {
		t.Fatalf("keys landed on %d masters, want 3: %v", len(owners), owners)
	}
	info, err := cc.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_size:3") {
		t.Fatalf("CLUSTER INFO: %v\n%s", err, info)
	}
}

func TestStandalone(t *testing.T) {
	ctx := context.Background()
	c := Client(t)
	if c.Options().Addr != Addr(t) {
		t.Fatalf("Client addr %s != Addr %s", c.Options().Addr, Addr(t))
	}
	p := Prefix(t)
	if err := c.Set(ctx, p+"k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, p+"k").Val(); v != "v" {
		t.Fatalf("GET = %q", v)
	}
}

func TestStartServerStopStartKeepsAOFData(t *testing.T) {
	ctx := context.Background()
	s := StartServer(t, "--appendonly", "yes")
	addr := s.Addr()
	c := s.Client(t)
	if err := c.Set(ctx, "persisted", "yes", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	if _, err := rawDo(addr, time.Second, "PING"); err == nil {
		t.Fatal("PING succeeded on a stopped server")
	}
	s.Stop(t) // no-op
	s.Start(t)
	if s.Addr() != addr {
		t.Fatalf("address changed from %s to %s", addr, s.Addr())
	}
	if v, err := c.Get(ctx, "persisted").Result(); err != nil || v != "yes" {
		t.Fatalf("after restart GET = %q, %v", v, err)
	}
}

func TestStartServerWithoutPersistenceLosesData(t *testing.T) {
	ctx := context.Background()
	s := StartServer(t)
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	s.Start(t)
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS after restart = %d, %v; want 0", n, err)
	}
}

func TestVerifyEnv(t *testing.T) {
	good := *shared(t)
	good.Cluster = slices.Clone(good.Cluster)
	if err := verifyEnv(&good); err != nil {
		t.Fatalf("verifyEnv(real servers) = %v", err)
	}

	bad := good
	bad.Standalone.RunID = strings.Repeat("0", 40)
	err := verifyEnv(&bad)
	if err == nil || !strings.Contains(err.Error(), "run_id") {
		t.Fatalf("verifyEnv(wrong standalone run_id) = %v", err)
	}

	bad = good
	bad.Cluster = slices.Clone(good.Cluster)
	bad.Cluster[2].RunID = "nope"
	if err := verifyEnv(&bad); err == nil {
		t.Fatal("verifyEnv(wrong cluster run_id) = nil")
	}

	// A server that answers but was not recorded at all.
	s := StartServer(t)
	bad = good
	bad.Standalone.Addr = s.Addr()
	if err := verifyEnv(&bad); err == nil {
		t.Fatal("verifyEnv(foreign server) = nil")
	}
}

func TestParseEnv(t *testing.T) {
	shared(t)
	for _, s := range []string{"", "{", `{"standalone":{"addr":"x"}}`, `{"standalone":{"addr":"a","run_id":"r"},"cluster":[]}`} {
		if _, err := parseEnv(s); err == nil {
			t.Errorf("parseEnv(%q) = nil error", s)
		}
	}
	v := os.Getenv(EnvVar)
	e, err := parseEnv(v)
	if err != nil {
		t.Fatalf("parseEnv(%s) = %v", EnvVar, err)
	}
	if e.Standalone.Addr != Addr(t) || !slices.Equal(e.clusterAddrs(), ClusterAddrs(t)) {
		t.Fatalf("%s = %s does not match the servers in use", EnvVar, v)
	}
}

// TestSubprocessReusesServers re-executes the test binary; the child must
// pick up the parent's servers from EnvVar instead of starting its own.
func TestSubprocessReusesServers(t *testing.T) {
	shared(t)
	if os.Getenv("REDISTEST_CHILD") == "1" {
		b, _ := json.Marshal(map[string]any{"addr": Addr(t), "cluster": ClusterAddrs(t)})
		os.Stdout.Write(append([]byte("CHILD:"), append(b, '\n')...))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSubprocessReusesServers$", "-test.count=1")
	// The race detector sleeps 1s at exit by default; skip that in the child.
	gorace := "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", gorace)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want, _ := json.Marshal(map[string]any{"addr": Addr(t), "cluster": ClusterAddrs(t)})
	if !strings.Contains(string(out), "CHILD:"+string(want)) {
		t.Fatalf("child did not reuse servers; want %s, output:\n%s", want, out)
	}

	// A child given a wrong run_id must refuse to run.
	e := *shared(t)
	e.Standalone.RunID = "0000"
	b, _ := json.Marshal(e)
	cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSubprocessReusesServers$", "-test.count=1")
	cmd.Env = append(os.Environ(), "REDISTEST_CHILD=1", gorace, EnvVar+"="+string(b))
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "run_id") {
		t.Fatalf("child with wrong run_id: err=%v output:\n%s", err, out)
	}
}

func TestSanitizeAndGlobEscape(t *testing.T) {
	if got := sanitize("A/b c{d}*:é-x.y", 40); got != "A/b_c_d____-x.y" {
		t.Fatalf("sanitize = %q", got)
	}
	if got := sanitize(strings.Repeat("x", 100), 40); len(got) != 40 {
		t.Fatalf("sanitize did not truncate: %d chars", len(got))
	}
	if got := globEscape(`a*b?c[d]e\f`); got != `a\*b\?c\[d\]e\\f` {
		t.Fatalf("globEscape = %q", got)
	}
}

// A redis-server that cannot bind its port must be reported as errPortInUse
// (so callers retry on another port), even when a different redis-server is
// answering on that port.
func TestLaunchDetectsPortInUse(t *testing.T) {
	shared(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if p, err := launch(port, t.TempDir(), nil); !errors.Is(err, errPortInUse) {
		if p != nil {
			p.kill()
		}
		t.Fatalf("launch on a taken port: %v", err)
	}

	other := StartServer(t)
	if p, err := launch(other.port, t.TempDir(), nil); !errors.Is(err, errPortInUse) {
		if p != nil {
			p.kill()
		}
		t.Fatalf("launch on a port served by another redis: %v", err)
	}
}

// TestSentinel: three sentinels watch a primary and its replica; a
// failover client finds the primary through them and writes to it; after a
// failover it writes to the new primary, which has the first write.
func TestSentinel(t *testing.T) {
	s := StartSentinel(t, 3, 1)
	c := s.Client(t)
	if err := c.Set(t.Context(), "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if got := s.Primary.Client(t).Get(t.Context(), "k").Val(); got != "v" {
		t.Fatalf("the primary holds %q", got)
	}
	s.Failover(t)
	deadline := time.Now().Add(10 * time.Second)
	for c.Set(t.Context(), "k2", "v2", time.Minute).Err() != nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	r := s.Replicas[0].Client(t)
	if got := r.Get(t.Context(), "k").Val() + r.Get(t.Context(), "k2").Val(); got != "vv2" {
		t.Fatalf("the new primary holds %q", got)
	}
}

// TestStartTLSServer: the TLS port answers a client that trusts the test's
// CA and refuses one that trusts only the system's roots or another test
// CA; the plaintext port serves the same data.
func TestStartTLSServer(t *testing.T) {
	s := StartTLSServer(t)
	ctx := context.Background()
	if err := s.TLSClient(t).Set(ctx, "k", "over TLS", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Client(t).Get(ctx, "k").Result(); err != nil || v != "over TLS" {
		t.Fatalf("plaintext port: %q, %v", v, err)
	}
	other := &TLSServer{TLSAddr: s.TLSAddr, PKI: NewTestPKI(t)}
	for name, cfg := range map[string]func() (*tls.Config, error){
		"system roots": func() (*tls.Config, error) { return &tls.Config{}, nil },
		"another CA":   other.tlsConfig,
	} {
		c, err := cfg()
		if err != nil {
			t.Fatal(err)
		}
		rc := redis.NewClient(&redis.Options{Addr: s.TLSAddr, TLSConfig: c, MaxRetries: -1})
		err = rc.Ping(ctx).Err()
		rc.Close()
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("%s: %v, want x509.UnknownAuthorityError", name, err)
		}
	}
}
