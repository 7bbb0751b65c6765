package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name StartSentinel's sentinels monitor.
const SentinelMaster = "taskrl-master"

// Sentinel is a Redis primary watched by sentinels, all started for one
// test by StartSentinel and stopped when it ends.
type Sentinel struct {
	// Primary is the monitored server.
	Primary *Server
	// Addrs are the sentinels' host:port addresses.
	Addrs []string
}

// StartSentinel starts a redis-server and n sentinels (redis-server
// --sentinel) monitoring it as SentinelMaster, on free loopback ports, and
// returns once every sentinel reports the primary's address. It skips the
// test when redis-server is not installed (outside CI).
func StartSentinel(t testing.TB, n int) *Sentinel {
	t.Helper()
	primary := StartServer(t)
	s := &Sentinel{Primary: primary}
	for i := 0; i < n; i++ {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		host, port, _ := strings.Cut(primary.Addr(), ":")
		text := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n", SentinelMaster, host, port, SentinelMaster)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := startOnFreePort(dir, []string{conf, "--sentinel"}, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.shutdown)
		s.Addrs = append(s.Addrs, p.addr())
	}
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		deadline := time.Now().Add(readyTimeout)
		for {
			got, err := c.GetMasterAddrByName(t.Context(), SentinelMaster).Result()
			if err == nil && len(got) == 2 && got[0]+":"+got[1] == primary.Addr() {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: sentinel %s does not report %s at %s: %v %v", a, SentinelMaster, primary.Addr(), got, err)
			}
			time.Sleep(pollInterval)
		}
		c.Close()
	}
	return s
}

// Client returns a client that finds the primary through the sentinels,
// closed when the test ends.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
