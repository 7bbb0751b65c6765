// Package redisconf reads the Redis settings that silently change what the
// limits promise, on every master a client reaches (each master of a
// Cluster, the current master behind Sentinel):
//
//   - the eviction policy: every key the limits write has a TTL, so a
//     maxmemory-policy that can evict keys (volatile-* evicts only keys
//     with a TTL: the limits' first; allkeys-* any key, asynq's queues too)
//     makes memory pressure erase what a window or a schedule spent, and
//     the fleet calls the vendor as if nothing had been;
//   - persistence: with neither AOF nor RDB snapshots a restart forgets
//     every window and schedule, and asynq's queues.
//
// CONFIG GET is asked first, by the default user only: a user of an ACL
// of its own is not granted it (it shows every setting, passwords too) and
// asking would fill the server's ACL LOG. Where it is not asked or refused
// (managed services rename or forbid it), INFO answers the eviction policy
// and AOF, and RDB stays unknown. Foundation code: it imports go-redis
// only.
package redisconf

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// State is a setting that is on, off or could not be read.
type State int

const (
	// Unknown: the server refused both CONFIG GET and INFO's answer.
	Unknown State = iota
	// On and Off: the setting as read.
	On
	Off
)

// Node is what one master says.
type Node struct {
	// Addr is the master's address as the client knows it.
	Addr string
	// Policy is its maxmemory-policy ("" when unknown); MaxMemory its
	// maxmemory in bytes (0: no limit, when nothing is evicted whatever
	// the policy; -1: unknown).
	Policy    string
	MaxMemory int64
	// AOF and RDB are whether append-only files and RDB snapshots (save
	// points) are on.
	AOF, RDB State
	// Err is why nothing could be read (the node did not answer).
	Err error
}

// Evicts reports whether memory pressure can evict the limits' keys: a
// policy other than noeviction with maxmemory set (or unknown). A policy
// that cannot be read is not taken to evict (Unread says so).
func (n Node) Evicts() bool {
	return n.Policy != "" && n.Policy != "noeviction" && n.MaxMemory != 0
}

// Unread reports whether the eviction policy could not be read.
func (n Node) Unread() bool { return n.Policy == "" }

// Forgets reports whether a restart of the node loses everything: neither
// AOF nor RDB snapshots are on.
func (n Node) Forgets() bool { return n.AOF == Off && n.RDB == Off }

// Report is what every master reached says, in the order read.
type Report struct {
	Nodes []Node
}

// Read asks every master c reaches for its settings. It does not fail: a
// node that does not answer is reported with its Err.
func Read(ctx context.Context, c redis.UniversalClient) Report {
	var rep Report
	if cc, ok := c.(*redis.ClusterClient); ok {
		config := defaultUser(cc.Options().Username)
		nodes := make(chan Node, 64)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			nodes <- readNode(ctx, m, m.Options().Addr, config)
			return nil
		})
		close(nodes)
		for n := range nodes {
			rep.Nodes = append(rep.Nodes, n)
		}
		if err != nil && len(rep.Nodes) == 0 {
			rep.Nodes = append(rep.Nodes, Node{Addr: "cluster", MaxMemory: -1, Err: err})
		}
		return rep
	}
	addr, config := "", true
	if o, ok := c.(*redis.Client); ok {
		addr, config = o.Options().Addr, defaultUser(o.Options().Username)
	}
	if addr == "" || addr == "FailoverClient" {
		// Behind Sentinel: the master's address as the server saw the
		// connection (laddr of CLIENT INFO, which an ACL user may lack).
		addr = "(the Sentinel master)"
		if info, err := c.Do(ctx, "CLIENT", "INFO").Text(); config && err == nil {
			for _, f := range strings.Fields(info) {
				if v, ok := strings.CutPrefix(f, "laddr="); ok {
					addr = v
				}
			}
		}
	}
	rep.Nodes = append(rep.Nodes, readNode(ctx, c, addr, config))
	return rep
}

// defaultUser reports whether a connection logs in as user name as the
// default user, who may be asked CONFIG GET.
func defaultUser(name string) bool { return name == "" || name == "default" }

// readNode reads one master's settings: CONFIG GET when config is set
// and it answers, else INFO.
func readNode(ctx context.Context, c redis.Cmdable, addr string, config bool) Node {
	n := Node{Addr: addr, MaxMemory: -1}
	if !config {
		return readInfo(ctx, c, n)
	}
	if conf, err := c.ConfigGet(ctx, "*").Result(); err == nil && conf["maxmemory-policy"] != "" {
		n.Policy = conf["maxmemory-policy"]
		if v, err := strconv.ParseInt(conf["maxmemory"], 10, 64); err == nil {
			n.MaxMemory = v
		}
		n.AOF = onOff(conf["appendonly"] == "yes")
		n.RDB = onOff(strings.TrimSpace(conf["save"]) != "")
		return n
	}
	return readInfo(ctx, c, n)
}

// readInfo fills n from INFO: the eviction policy, maxmemory and AOF.
func readInfo(ctx context.Context, c redis.Cmdable, n Node) Node {
	info, err := c.Info(ctx, "memory", "persistence").Result()
	if err != nil {
		n.Err = err
		return n
	}
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	n.Policy = fields["maxmemory_policy"]
	if v, err := strconv.ParseInt(fields["maxmemory"], 10, 64); err == nil {
		n.MaxMemory = v
	}
	switch fields["aof_enabled"] {
	case "1":
		n.AOF = On
	case "0":
		n.AOF = Off
	}
	return n
}

// String is "on", "off" or "unknown".
func (s State) String() string { return [...]string{"unknown", "on", "off"}[s] }

func onOff(on bool) State {
	if on {
		return On
	}
	return Off
}

// Warnings are the report's problems, one sentence each, naming the node,
// the setting and what it does to the limits; none for a Redis set up as
// the limits need (noeviction, or no maxmemory; AOF or RDB on).
func (r Report) Warnings() []string {
	var out []string
	for _, n := range r.Nodes {
		switch {
		case n.Err != nil:
			out = append(out, fmt.Sprintf("Redis %s: its settings could not be read: %v", n.Addr, n.Err))
			continue
		case n.Evicts():
			what := "the limits' keys, which all have a TTL, go first"
			if strings.HasPrefix(n.Policy, "allkeys-") {
				what = "any key may go, the limits' and asynq's queues"
			}
			out = append(out, fmt.Sprintf("Redis %s evicts keys under memory pressure (maxmemory-policy %s, maxmemory %s): %s, and the fleet then calls as if nothing had been spent; set maxmemory-policy noeviction", n.Addr, n.Policy, memory(n.MaxMemory), what))
		case n.Unread():
			out = append(out, fmt.Sprintf("Redis %s: its eviction policy could not be read (CONFIG GET and INFO refused); the limits need maxmemory-policy noeviction", n.Addr))
		}
		if n.Forgets() {
			out = append(out, fmt.Sprintf("Redis %s keeps nothing across a restart (appendonly no, no save points): a restart forgets what every window and schedule spent, and asynq's queues; turn on appendonly or save", n.Addr))
		}
	}
	return out
}

// Evicting reports the nodes whose eviction policy can evict the limits'
// keys or could not be read: what --require-noeviction refuses.
func (r Report) Evicting() []Node {
	var out []Node
	for _, n := range r.Nodes {
		if n.Evicts() || n.Unread() {
			out = append(out, n)
		}
	}
	return out
}

// memory formats a maxmemory setting.
func memory(b int64) string {
	switch {
	case b < 0:
		return "unknown"
	case b >= 1<<20 && b%(1<<20) == 0:
		return strconv.FormatInt(b>>20, 10) + "mb"
	}
	return strconv.FormatInt(b, 10)
}
