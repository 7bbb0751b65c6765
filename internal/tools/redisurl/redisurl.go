// Package redisurl parses the Redis the binaries take (--redis, REDIS_URL;
// --redis-cluster, REDIS_CLUSTER_ADDRS; --redis-password) into go-redis
// options and clients, with errors that never repeat a password.
//
// Application code of the binaries, imported by cmd/enqueue and cmd/worker.
package redisurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Parse accepts redis://[[user]:password@]host[:port][/db], rediss://...
// (TLS), unix:///path.sock, a bare host:port or a bare host (port 6379).
// Its errors say what is wrong without quoting the URL, whose password
// would otherwise end up in logs.
func Parse(s string) (*redis.Options, error) {
	if strings.Contains(s, "://") {
		opt, err := redis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("not a valid Redis URL (%v); want redis://[[user]:password@]host[:port][/db], rediss://..., unix:///path or host:port", bare(err))
		}
		return opt, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		// A bare host: the default port.
		if strings.ContainsAny(s, "/@ ") || strings.Count(s, ":") == 1 {
			return nil, fmt.Errorf("%q is neither a Redis URL nor host:port", s)
		}
		host, port = strings.Trim(s, "[]"), "6379"
	}
	if host == "" {
		host = "localhost"
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return nil, fmt.Errorf("port must be a number from 1 to 65535, got %q", port)
	}
	return &redis.Options{Network: "tcp", Addr: net.JoinHostPort(host, port)}, nil
}

// ErrBoth is ParseTarget's error when both a single Redis and a cluster
// are given.
var ErrBoth = errors.New("a single Redis (--redis, REDIS_URL) and a cluster (--redis-cluster, REDIS_CLUSTER_ADDRS) are exclusive; give one")

// Target is the Redis the binaries use: one server (--redis) or a Redis
// Cluster (--redis-cluster). The zero value is not a target; build one
// with ParseTarget.
type Target struct {
	single  *redis.Options
	cluster *redis.ClusterOptions
}

// ParseTarget reads the binaries' Redis flags: url as Parse reads it (one
// server), or cluster, the seed nodes of a Redis Cluster as a
// comma-separated host:port list or a go-redis cluster URL
// (redis://[[user]:password@]host:port?addr=host:port&addr=..., rediss://
// for TLS; see redis.ParseClusterURL). Exactly one of them must be set.
// password, if set, replaces the password of either form (for a list of
// nodes, the only way to give one). Its errors never repeat a password.
func ParseTarget(url, cluster, password string) (Target, error) {
	switch {
	case url != "" && cluster != "":
		return Target{}, ErrBoth
	case cluster != "":
		co, err := parseCluster(cluster)
		if err != nil {
			return Target{}, err
		}
		if password != "" {
			co.Password = password
		}
		return Target{cluster: co}, nil
	case url != "":
		o, err := Parse(url)
		if err != nil {
			return Target{}, err
		}
		if password != "" {
			o.Password = password
		}
		return Target{single: o}, nil
	}
	return Target{}, errors.New("no Redis given")
}

// parseCluster reads a cluster's seed nodes.
func parseCluster(s string) (*redis.ClusterOptions, error) {
	if strings.Contains(s, "://") {
		co, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, fmt.Errorf("not a valid Redis Cluster URL (%v); want host:port,host:port,... or redis://[[user]:password@]host:port?addr=host:port&addr=host:port", bare(err))
		}
		return co, nil
	}
	co := &redis.ClusterOptions{}
	for _, node := range strings.Split(s, ",") {
		node = strings.TrimSpace(node)
		if node == "" || strings.Contains(node, "://") {
			return nil, fmt.Errorf("want host:port,host:port,... or a redis:// cluster URL, got an empty or URL entry among %d", strings.Count(s, ",")+1)
		}
		o, err := Parse(node)
		if err != nil {
			return nil, fmt.Errorf("node %q: %v", node, err)
		}
		co.Addrs = append(co.Addrs, o.Addr)
	}
	return co, nil
}

// Cluster reports whether t is a Redis Cluster.
func (t Target) Cluster() bool { return t.cluster != nil }

// TLS reports whether t is reached over TLS.
func (t Target) TLS() bool {
	if t.cluster != nil {
		return t.cluster.TLSConfig != nil
	}
	return t.single != nil && t.single.TLSConfig != nil
}

// String names t for logs and errors, without a password: the server's
// address and database, or the cluster's seed nodes.
func (t Target) String() string {
	if t.cluster != nil {
		return "cluster " + strings.Join(t.cluster.Addrs, ",")
	}
	if t.single == nil {
		return "no Redis"
	}
	return fmt.Sprintf("%s db %d", t.single.Addr, t.single.DB)
}

// Client returns a client for t whose connection pool holds at least pool
// connections (per node, on a cluster).
func (t Target) Client(pool int) redis.UniversalClient {
	if t.cluster != nil {
		co := *t.cluster
		co.PoolSize = max(co.PoolSize, pool)
		return redis.NewClusterClient(&co)
	}
	o := *t.single
	o.PoolSize = max(o.PoolSize, pool)
	return redis.NewClient(&o)
}

// bare strips what url.Parse wraps around an error: the whole URL,
// password included.
func bare(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
