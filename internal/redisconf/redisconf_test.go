package redisconf

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// read reads the settings of a redis-server started with args.
func read(t *testing.T, args ...string) (Report, *redistest.Server) {
	t.Helper()
	s := redistest.StartServer(t, args...)
	return Read(context.Background(), s.Client(t)), s
}

// TestSettings: real redis-servers started with the settings that break
// the limits are reported, each with what it does; a server set up as the
// limits need (noeviction, AOF) is not. The test harness's own servers run
// without persistence.
func TestSettings(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want []string // substrings, one per warning, in order; none: no warning
	}{
		{"as the limits need", []string{"--maxmemory", "200mb", "--maxmemory-policy", "noeviction", "--appendonly", "yes"}, nil},
		{"rdb only", []string{"--save", "3600 1"}, nil},
		{"volatile-lru", []string{"--maxmemory", "200mb", "--maxmemory-policy", "volatile-lru", "--appendonly", "yes"},
			[]string{"evicts keys under memory pressure (maxmemory-policy volatile-lru, maxmemory 200mb): the limits' keys, which all have a TTL, go first"}},
		{"allkeys-lfu", []string{"--maxmemory", "1000000", "--maxmemory-policy", "allkeys-lfu", "--save", "60 1"},
			[]string{"(maxmemory-policy allkeys-lfu, maxmemory 1000000): any key may go, the limits' and asynq's queues"}},
		{"policy without maxmemory", []string{"--maxmemory-policy", "volatile-ttl", "--appendonly", "yes"}, nil},
		{"no persistence", nil, []string{"keeps nothing across a restart (appendonly no, no save points)"}},
		{"both", []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-random"}, []string{"maxmemory-policy volatile-random", "keeps nothing across a restart"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rep, s := read(t, c.args...)
			w := rep.Warnings()
			t.Logf("%+v: %q", rep.Nodes, w)
			if len(rep.Nodes) != 1 || rep.Nodes[0].Addr != s.Addr() {
				t.Fatalf("nodes %+v, want one: %s", rep.Nodes, s.Addr())
			}
			if len(w) != len(c.want) {
				t.Fatalf("%d warnings, want %d: %q", len(w), len(c.want), w)
			}
			for i := range w {
				if !strings.Contains(w[i], c.want[i]) || !strings.Contains(w[i], s.Addr()) {
					t.Errorf("warning %q, want it to name %s and say %q", w[i], s.Addr(), c.want[i])
				}
			}
			if evicts := strings.Contains(strings.Join(c.want, " "), "maxmemory-policy"); evicts != (len(rep.Evicting()) == 1) {
				t.Errorf("Evicting %+v", rep.Evicting())
			}
		})
	}
}

// TestConfigRefused: a managed service that forbids CONFIG (renamed away)
// still tells its eviction policy and AOF through INFO; RDB is then
// unknown. An ACL user is never asked CONFIG (no ACL LOG entry: the
// worker's ACL grants INFO, not CONFIG); one refused INFO too reads
// nothing: the policy is reported as unread, which --require-noeviction
// refuses.
func TestConfigRefused(t *testing.T) {
	ctx := context.Background()
	renamed, _ := read(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lfu", "--rename-command", "CONFIG", "")
	if n := renamed.Nodes[0]; n.Policy != "volatile-lfu" || n.AOF != Off || n.RDB != Unknown {
		t.Errorf("CONFIG renamed away: %+v", n)
	}
	s := redistest.StartServer(t, "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lfu")
	admin := s.Client(t)
	user := func(name string, rules ...string) *redis.Client {
		args := append([]any{"ACL", "SETUSER", name, "on", ">pw", "~*", "+@all"}, anySlice(rules)...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), Username: name, Password: "pw"})
		t.Cleanup(func() { c.Close() })
		return c
	}
	rep := Read(ctx, user("noconfig", "-config"))
	n := rep.Nodes[0]
	if n.Policy != "volatile-lfu" || n.MaxMemory != 100<<20 || n.AOF != Off || n.RDB != Unknown || !n.Evicts() {
		t.Errorf("through INFO: %+v", n)
	}
	if w := rep.Warnings(); len(w) != 1 || !strings.Contains(w[0], "volatile-lfu") {
		t.Errorf("warnings %q: want the eviction one only (persistence unknown)", w)
	}
	rep = Read(ctx, user("blind", "-config", "-info"))
	if n := rep.Nodes[0]; !n.Unread() || n.Err == nil || len(rep.Evicting()) != 1 {
		t.Errorf("neither CONFIG nor INFO: %+v", n)
	}
	if log := admin.Do(ctx, "ACL", "LOG").Val(); log == nil || len(log.([]any)) != 1 {
		t.Errorf("ACL LOG: %v, want the one INFO refused to blind", log)
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestClusterMaster: of a Cluster's three masters, the one set to evict is
// named; the others are not (the test's cluster, its setting restored).
func TestClusterMaster(t *testing.T) {
	ctx := context.Background()
	cc := redistest.Cluster(t)
	var mu sync.Mutex // ForEachMaster calls in parallel
	var victim *redis.Client
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		if victim == nil || m.Options().Addr < victim.Options().Addr {
			victim = m
		}
		return nil
	})
	old, err := victim.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		victim.ConfigSet(ctx, "maxmemory-policy", old["maxmemory-policy"])
		victim.ConfigSet(ctx, "maxmemory", old["maxmemory"])
	})
	if err := victim.ConfigSet(ctx, "maxmemory", "1gb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := victim.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	rep := Read(ctx, cc)
	if len(rep.Nodes) != 3 {
		t.Fatalf("%d masters read: %+v", len(rep.Nodes), rep.Nodes)
	}
	ev := rep.Evicting()
	if len(ev) != 1 || ev[0].Addr != victim.Options().Addr || ev[0].Policy != "allkeys-lru" {
		t.Errorf("evicting %+v, want %s alone", ev, victim.Options().Addr)
	}
}

// TestSentinelFailover: behind Sentinel, the settings read are the current
// master's: after a failover to a replica set to evict, Read says so.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	s := redistest.StartSentinel(t, 3, 1)
	c := s.Client(t)
	if rep := Read(ctx, c); len(rep.Evicting()) != 0 {
		t.Fatalf("before the failover: %+v", rep.Nodes)
	}
	r := s.Replicas[0].Client(t)
	for _, kv := range [][2]string{{"maxmemory", "1gb"}, {"maxmemory-policy", "volatile-lru"}} {
		if err := r.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	s.Failover(t)
	rep := Read(ctx, c)
	if ev := rep.Evicting(); len(ev) != 1 || ev[0].Policy != "volatile-lru" {
		t.Errorf("after the failover: %+v", rep.Nodes)
	}
}
