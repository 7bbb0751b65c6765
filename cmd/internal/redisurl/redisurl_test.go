package redisurl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParse(t *testing.T) {
	for in, addr := range map[string]string{
		"redis://:pw@db.example:6380/2": "db.example:6380",
		"rediss://db.example":           "db.example:6379",
		"10.0.0.1:7000":                 "10.0.0.1:7000",
		"localhost":                     "localhost:6379",
		":6379":                         "localhost:6379",
		"[::1]:6379":                    "[::1]:6379",
	} {
		o, err := Parse(in)
		if err != nil || o.Addr != addr {
			t.Errorf("Parse(%q) = %v, %v; want %s", in, o, err, addr)
		}
	}
	for in, want := range map[string]string{
		"http://localhost:6379":        "not a valid Redis URL",
		"redis://:hunter2@host:port/0": "not a valid Redis URL",
		"redis://host/db9x":            "not a valid Redis URL",
		"host:0":                       "port must be a number from 1 to 65535",
		"user@host":                    "is neither a Redis URL nor host:port",
		"redis://u:s3cret@host:port":   "not a valid Redis URL",
	} {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q): %v; want %q", in, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret")) {
			t.Errorf("Parse(%q): the error shows the password: %v", in, err)
		}
	}
}

func TestParseTarget(t *testing.T) {
	for _, c := range []struct {
		url, cluster, sentinel, password string
		want                             string
		isCluster, tls                   bool
	}{
		{"redis://:pw@db:6380/2", "", "", "", "db:6380 db 2", false, false},
		{"rediss://db", "", "", "", "db:6379 db 0", false, true},
		{"", "n1:7000, n2:7001,n3", "", "", "cluster n1:7000,n2:7001,n3:6379", true, false},
		{"", "rediss://u:pw@n1:7000?addr=n2:7000&addr=n3:7000", "", "", "cluster n1:7000,n2:7000,n3:7000", true, true},
		{"", "", "main@s1:26379, s2:26380", "", "sentinel main@s1:26379,s2:26380 db 0", false, false},
		{"", "", "rediss://u:pw@s1:26379/3?master_name=main&addr=s2:26379", "", "sentinel main@s1:26379,s2:26379 db 3", false, true},
	} {
		tg, err := ParseTarget(c.url, c.cluster, c.sentinel, c.password)
		if err != nil || tg.String() != c.want || tg.Cluster() != c.isCluster || tg.TLS() != c.tls {
			t.Errorf("%+v: %v (cluster %v, tls %v), %v", c, tg, tg.Cluster(), tg.TLS(), err)
		}
	}
	// The password flag replaces the URL's, for every form (for a
	// sentinel URL, the URL's is the sentinels').
	if tg, _ := ParseTarget("redis://:old@db:6379", "", "", "new"); tg.single.Password != "new" {
		t.Errorf("single: password %q", tg.single.Password)
	}
	if tg, _ := ParseTarget("", "a:1,b:1", "", "new"); tg.cluster.Password != "new" {
		t.Errorf("cluster: password %q", tg.cluster.Password)
	}
	if tg, _ := ParseTarget("", "", "redis://:sp@s:1?master_name=m", "new"); tg.sentinel.Password != "new" || tg.sentinel.SentinelPassword != "sp" {
		t.Errorf("sentinel: password %q, sentinels' %q", tg.sentinel.Password, tg.sentinel.SentinelPassword)
	}
	for _, c := range [][4]string{
		{"a:1", "b:1", "", ""},
		{"a:1", "", "m@b:1", ""},
		{"", "", "", ""},
		{"", "a:1,,b:1", "", ""},
		{"", "a:1,redis://b:1", "", ""},
		{"", "redis://:s3cret@a:x?addr=b:1", "", ""},
		{"redis://:s3cret@a:x", "", "", ""},
		{"", "", "s1:26379", ""},
		{"", "", "m@s1:x", ""},
		{"", "", "m@", ""},
		{"", "", "redis://:s3cret@s1:26379", ""},
		{"", "", "redis://:s3cret@s1:x?master_name=m", ""},
	} {
		_, err := ParseTarget(c[0], c[1], c[2], c[3])
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseTarget(%q, %q, %q): %v", c[0], c[1], c[2], err)
		}
	}
	// --redis-tls for every form; a rediss:// URL keeps its own.
	for _, f := range [][3]string{{"a:1", "", ""}, {"", "a:1,b:1", ""}, {"", "", "m@a:1"}, {"rediss://a:1", "", ""}} {
		tg, err := ParseTarget(f[0], f[1], f[2], "")
		if err != nil {
			t.Fatal(err)
		}
		if tls := tg.WithTLS(); !tls.TLS() || (f[0] == "a:1" && tg.TLS()) {
			t.Errorf("%q: TLS %v after WithTLS, %v before", f, tls.TLS(), tg.TLS())
		}
	}
	// A cluster client for a cluster, a failover client for a sentinel, a
	// single client otherwise.
	tg, _ := ParseTarget("", "a:1,b:1", "", "")
	if _, ok := tg.Client(5).(*redis.ClusterClient); !ok {
		t.Error("no cluster client for a cluster")
	}
	tg, _ = ParseTarget("", "", "m@a:1", "")
	if c, ok := tg.Client(5).(*redis.Client); !ok || c.Options().PoolSize != 5 {
		t.Error("no failover client with the pool size asked")
	}
	tg, _ = ParseTarget("a:1", "", "", "")
	if c, ok := tg.Client(5).(*redis.Client); !ok || c.Options().PoolSize != 5 {
		t.Error("no single client with the pool size asked")
	}
}

// writeCert writes a self-signed certificate as PEM to a file and returns
// its path.
func writeCert(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestWithCA: --redis-tls-ca replaces the system's roots for every form,
// keeps verification on, and needs TLS; a bad file is an error that names
// it and never the password.
func TestWithCA(t *testing.T) {
	ca := writeCert(t)
	roots := func(tg Target) *tls.Config {
		switch {
		case tg.cluster != nil:
			return tg.cluster.TLSConfig
		case tg.sentinel != nil:
			return tg.sentinel.TLSConfig
		}
		return tg.single.TLSConfig
	}
	for _, f := range []struct {
		url, cluster, sentinel string
		tls                    bool // --redis-tls
	}{
		{"rediss://:s3cret@db:6380/1", "", "", false},
		{"db:6380", "", "", true},
		{"", "n1:7000,n2:7000", "", true},
		{"", "rediss://:s3cret@n1:7000?addr=n2:7000", "", false},
		{"", "", "main@s1:26379,s2:26379", true},
		{"", "", "rediss://s1:26379?master_name=main", false},
	} {
		tg, err := ParseTarget(f.url, f.cluster, f.sentinel, "")
		if err != nil {
			t.Fatal(err)
		}
		if f.tls {
			tg = tg.WithTLS()
		}
		before := roots(tg)
		withCA, err := tg.WithCA(ca)
		if err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		c := roots(withCA)
		if c == nil || c.RootCAs == nil || c.InsecureSkipVerify || c.ServerName != before.ServerName {
			t.Errorf("%+v: TLS config %+v", f, c)
		}
		if before.RootCAs != nil {
			t.Errorf("%+v: WithCA changed the target it was called on", f)
		}
		if !withCA.TLS() || withCA.String() != tg.String() {
			t.Errorf("%+v: %v, TLS %v", f, withCA, withCA.TLS())
		}
	}

	// No TLS: a plain URL, a host:port or a unix socket (even with
	// --redis-tls).
	for _, u := range []string{"redis://:s3cret@db:6379", "db:6379", "unix:///tmp/redis.sock"} {
		tg, err := ParseTarget(u, "", "", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tg.WithTLS().WithCA(ca); u == "unix:///tmp/redis.sock" && !errors.Is(err, ErrCANeedsTLS) {
			t.Errorf("%s with --redis-tls: %v, want ErrCANeedsTLS", u, err)
		}
		if _, err := tg.WithCA(ca); !errors.Is(err, ErrCANeedsTLS) {
			t.Errorf("%s: %v, want ErrCANeedsTLS", u, err)
		}
	}

	// A file that is missing, or holds no certificate.
	tg, _ := ParseTarget("rediss://:s3cret@db:6380", "", "", "")
	empty := filepath.Join(t.TempDir(), "empty.pem")
	os.WriteFile(empty, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600)
	for file, want := range map[string]string{
		filepath.Join(t.TempDir(), "missing.pem"): "no such file",
		empty: "holds no PEM certificate",
	} {
		_, err := tg.WithCA(file)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), file) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("WithCA(%s): %v; want %q and the file's name", file, err, want)
		}
	}
}

// TestVerified: a URL that turns certificate verification off is refused
// (a cluster URL has no such option); skip_verify=false is harmless.
func TestVerified(t *testing.T) {
	for _, f := range [][3]string{
		{"rediss://:s3cret@db:6380?skip_verify=true", "", ""},
		{"", "rediss://:s3cret@n1:7000?addr=n2:7000&skip_verify=true", ""},
		{"", "", "rediss://:s3cret@s1:26379?master_name=main&skip_verify=true"},
	} {
		_, err := ParseTarget(f[0], f[1], f[2], "")
		if err == nil || strings.Contains(err.Error(), "s3cret") || f[1] == "" && !strings.Contains(err.Error(), "skip_verify is refused") {
			t.Errorf("%q: %v", f, err)
		}
	}
	for _, f := range [][3]string{
		{"rediss://db:6380?skip_verify=false", "", ""},
		{"", "", "rediss://s1:26379?master_name=main&skip_verify=false"},
	} {
		if _, err := ParseTarget(f[0], f[1], f[2], ""); err != nil {
			t.Errorf("%q: %v", f, err)
		}
	}
}

// TestNoClientSetinfo: the clients do not send CLIENT SETINFO, which an
// ACL for Redis 7.0 cannot name.
func TestNoClientSetinfo(t *testing.T) {
	for _, f := range [][3]string{{"a:1", "", ""}, {"", "a:1,b:1", ""}, {"", "", "m@a:1"}} {
		tg, _ := ParseTarget(f[0], f[1], f[2], "")
		switch c := tg.Client(1).(type) {
		case *redis.Client:
			if !c.Options().DisableIdentity {
				t.Errorf("%q: identity on", f)
			}
		case *redis.ClusterClient:
			if !c.Options().DisableIdentity {
				t.Errorf("%q: identity on", f)
			}
		default:
			t.Errorf("%q: %T", f, c)
		}
	}
}
