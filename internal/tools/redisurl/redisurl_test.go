package redisurl

import (
	"strings"
	"testing"

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
