package redistest

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// slotRanges is how the 16384 slots are split over the three masters
// (the same split redis-cli --cluster create uses).
var slotRanges = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// startCluster starts three cluster-enabled redis-servers in subdirectories
// of root and joins them into one cluster of three masters, without
// redis-cli. On error every node started is stopped again.
func startCluster(root string) (nodes []*proc, err error) {
	nodes = make([]*proc, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir, err := mkdir(root, "node"+strconv.Itoa(i))
			if err != nil {
				errs[i] = err
				return
			}
			nodes[i], errs[i] = startOnFreePort(dir, []string{
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
				"--cluster-node-timeout", "2000",
			}, true)
		}()
	}
	wg.Wait()
	defer func() {
		if err != nil {
			for _, n := range nodes {
				if n != nil {
					n.kill()
				}
			}
		}
	}()
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	if err := joinCluster(nodes); err != nil {
		return nil, err
	}
	return nodes, nil
}

func joinCluster(nodes []*proc) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	clients := make([]*redis.Client, len(nodes))
	for i, n := range nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialTimeout: time.Second})
		defer clients[i].Close()
	}
	for i, c := range clients {
		// Distinct epochs up front, as redis-cli does, so no epoch-collision
		// resolution has to happen before the cluster settles.
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER SET-CONFIG-EPOCH on %s: %w", nodes[i].addr(), err)
		}
		r := slotRanges[i]
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER ADDSLOTSRANGE on %s: %w", nodes[i].addr(), err)
		}
	}
	for i := 1; i < len(nodes); i++ {
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(nodes[i].port)).Err(); err != nil {
			return fmt.Errorf("redistest: CLUSTER MEET %s: %w", nodes[i].addr(), err)
		}
	}
	want := map[string]bool{}
	for _, n := range nodes {
		want[n.addr()] = true
	}
	var last string
	for {
		ok := true
		for i, c := range clients {
			if problem := nodeProblem(ctx, c, want); problem != "" {
				ok = false
				last = nodes[i].addr() + ": " + problem
				break
			}
		}
		if ok {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: cluster did not become ready within %v: %s", readyTimeout, last)
		case <-time.After(pollInterval):
		}
	}
	return checkClusterClient(ctx, nodes)
}

// nodeProblem returns "" when the node reports cluster_state:ok and a slot
// map of exactly our three masters, and otherwise a description of what is
// still missing.
func nodeProblem(ctx context.Context, c *redis.Client, want map[string]bool) string {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err.Error()
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return "cluster_state is not ok"
	}
	slots, err := c.ClusterSlots(ctx).Result()
	if err != nil {
		return err.Error()
	}
	if len(slots) != 3 {
		return fmt.Sprintf("CLUSTER SLOTS shows %d ranges", len(slots))
	}
	seen := map[string]bool{}
	for _, s := range slots {
		if len(s.Nodes) == 0 || !want[s.Nodes[0].Addr] {
			return fmt.Sprintf("unexpected slot owner in %+v", s)
		}
		seen[s.Nodes[0].Addr] = true
	}
	if len(seen) != 3 {
		return "slot ranges not owned by three distinct masters"
	}
	return ""
}

// checkClusterClient makes sure a go-redis ClusterClient can write to and
// read from every master.
func checkClusterClient(ctx context.Context, nodes []*proc) error {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.addr()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	// {a}, {b} and {c} hash to slots 15495, 3300 and 7365: one per master.
	keys := []string{"redistest:startup:{a}", "redistest:startup:{b}", "redistest:startup:{c}"}
	for _, k := range keys {
		if err := cc.Set(ctx, k, k, time.Minute).Err(); err != nil {
			return fmt.Errorf("redistest: cluster SET %s: %w", k, err)
		}
	}
	for _, k := range keys {
		v, err := cc.Get(ctx, k).Result()
		if err != nil || v != k {
			return fmt.Errorf("redistest: cluster GET %s = %q, %v", k, v, err)
		}
		if err := cc.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("redistest: cluster DEL %s: %w", k, err)
		}
	}
	return nil
}
