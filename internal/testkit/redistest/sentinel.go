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
	// Primary is the monitored server as started; after Failover, one of
	// Replicas is the primary.
	Primary *Server
	// Replicas replicate Primary.
	Replicas []*Server
	// Addrs are the sentinels' host:port addresses.
	Addrs []string
}

// StartSentinel starts a redis-server, replicas of it and sentinels
// (redis-server --sentinel, a majority of them the quorum) monitoring it
// as SentinelMaster, on free loopback ports, and returns once the replicas
// are in sync and every sentinel reports the primary's address. It skips
// the test when redis-server is not installed (outside CI).
func StartSentinel(t testing.TB, sentinels, replicas int) *Sentinel {
	t.Helper()
	primary := StartServer(t)
	s := &Sentinel{Primary: primary}
	host, port, _ := strings.Cut(primary.Addr(), ":")
	for i := 0; i < replicas; i++ {
		r := StartServer(t, "--replicaof", host, port)
		deadline := time.Now().Add(readyTimeout)
		for {
			info, err := rawDo(r.Addr(), time.Second, "INFO", "replication")
			if err == nil && infoField(info, "master_link_status") == "up" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: replica %s not in sync with %s: %v", r.Addr(), primary.Addr(), err)
			}
			time.Sleep(pollInterval)
		}
		s.Replicas = append(s.Replicas, r)
	}
	for i := 0; i < sentinels; i++ {
		dir := t.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %s %s %s %d\nsentinel down-after-milliseconds %s 5000\nsentinel failover-timeout %s 10000\n",
			SentinelMaster, host, port, sentinels/2+1, SentinelMaster, SentinelMaster)
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
	s.waitPrimary(t, primary.Addr(), replicas)
	return s
}

// waitPrimary waits until every sentinel reports addr as the primary and
// knows of replicas replicas.
func (s *Sentinel) waitPrimary(t testing.TB, addr string, replicas int) {
	t.Helper()
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		deadline := time.Now().Add(3 * readyTimeout)
		for {
			got, err := c.GetMasterAddrByName(t.Context(), SentinelMaster).Result()
			reps, _ := c.Replicas(t.Context(), SentinelMaster).Result()
			if err == nil && len(got) == 2 && got[0]+":"+got[1] == addr && len(reps) >= replicas {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: sentinel %s does not report %s at %s with %d replicas: %v %v (%d replicas)", a, SentinelMaster, addr, replicas, got, err, len(reps))
			}
			time.Sleep(pollInterval)
		}
		c.Close()
	}
}

// Failover makes the sentinels promote the first replica (SENTINEL
// FAILOVER, as an operator would before maintenance) and returns once
// every sentinel reports it as the primary; the old primary becomes a
// replica.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	if len(s.Replicas) == 0 {
		t.Fatal("redistest: Failover needs a replica")
	}
	// A sentinel refuses (NOGOODSLAVE) until it has seen the replica's
	// state recently, which takes up to its 10 s INFO period.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := rawDo(s.Addrs[0], 5*time.Second, "SENTINEL", "FAILOVER", SentinelMaster)
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "NOGOODSLAVE") || time.Now().After(deadline) {
			t.Fatalf("redistest: SENTINEL FAILOVER: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.waitPrimary(t, s.Replicas[0].Addr(), 0)
}

// Client returns a client that finds the primary through the sentinels,
// closed when the test ends.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: s.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
