// Package redisurl parses the Redis the binaries take (--redis, REDIS_URL;
// --redis-cluster, REDIS_CLUSTER_ADDRS; --redis-sentinel, REDIS_SENTINEL;
// --redis-password; --redis-tls, --redis-tls-ca) into go-redis options and
// clients, with errors that never repeat a password. Certificates are always
// verified: a URL's skip_verify is refused.
//
// Application code of the binaries, imported by cmd/enqueue and cmd/worker.
package redisurl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Parse accepts redis://[[user]:password@]host[:port][/db], rediss://...
// (TLS), unix:///path.sock, a bare host:port or a bare host (port 6379).
// A URL's skip_verify=true is refused: certificates are always verified.
// Its errors say what is wrong without quoting the URL, whose password
// would otherwise end up in logs.
func Parse(s string) (*redis.Options, error) {
	if strings.Contains(s, "://") {
		opt, err := redis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("not a valid Redis URL (%v); want redis://[[user]:password@]host[:port][/db], rediss://..., unix:///path or host:port", bare(err))
		}
		if err := verified(opt.TLSConfig); err != nil {
			return nil, err
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

// ErrBoth is ParseTarget's error when more than one of a single Redis, a
// cluster and a sentinel-managed primary are given.
var ErrBoth = errors.New("a single Redis (--redis, REDIS_URL), a cluster (--redis-cluster, REDIS_CLUSTER_ADDRS) and a Sentinel-managed primary (--redis-sentinel, REDIS_SENTINEL) are exclusive; give one")

// Target is the Redis the binaries use: one server (--redis), a Redis
// Cluster (--redis-cluster) or the primary Sentinel names
// (--redis-sentinel). The zero value is not a target; build one with
// ParseTarget.
type Target struct {
	single   *redis.Options
	cluster  *redis.ClusterOptions
	sentinel *redis.FailoverOptions
}

// ParseTarget reads the binaries' Redis flags: url as Parse reads it (one
// server); or cluster, the seed nodes of a Redis Cluster as a
// comma-separated host:port list or a go-redis cluster URL
// (redis://[[user]:password@]host:port?addr=host:port&addr=..., rediss://
// for TLS; see redis.ParseClusterURL); or sentinel, a primary found
// through Redis Sentinel as MASTER@host:port,host:port,... (the
// sentinels) or a go-redis failover URL
// (redis://[[user]:password@]host:port?master_name=MASTER&addr=host:port,
// whose user and password are the sentinels'; see redis.ParseFailoverURL).
// Exactly one of them must be set. password, if set, replaces the password
// of the server, the cluster's nodes or the primary (for a list of nodes,
// the only way to give one). Its errors never repeat a password.
func ParseTarget(url, cluster, sentinel, password string) (Target, error) {
	n := 0
	for _, s := range []string{url, cluster, sentinel} {
		if s != "" {
			n++
		}
	}
	switch {
	case n > 1:
		return Target{}, ErrBoth
	case sentinel != "":
		fo, err := parseSentinel(sentinel)
		if err != nil {
			return Target{}, err
		}
		if password != "" {
			fo.Password = password
		}
		return Target{sentinel: fo}, nil
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
		if err := verified(co.TLSConfig); err != nil {
			return nil, err
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

// parseSentinel reads a primary's name and its sentinels.
func parseSentinel(s string) (*redis.FailoverOptions, error) {
	const want = "want MASTER@host:port,host:port,... or redis://[[user]:password@]host:port?master_name=MASTER&addr=host:port"
	if strings.Contains(s, "://") {
		fo, err := redis.ParseFailoverURL(s)
		if err != nil {
			return nil, fmt.Errorf("not a valid Redis Sentinel URL (%v); %s", bare(err), want)
		}
		if fo.MasterName == "" {
			return nil, fmt.Errorf("the URL names no primary (master_name=...); %s", want)
		}
		if err := verified(fo.TLSConfig); err != nil {
			return nil, err
		}
		return fo, nil
	}
	master, nodes, ok := strings.Cut(s, "@")
	if !ok || strings.TrimSpace(master) == "" {
		return nil, fmt.Errorf("no primary name before @; %s", want)
	}
	fo := &redis.FailoverOptions{MasterName: strings.TrimSpace(master)}
	for _, node := range strings.Split(nodes, ",") {
		node = strings.TrimSpace(node)
		if node == "" || strings.Contains(node, "://") {
			return nil, fmt.Errorf("an empty or URL entry among the sentinels; %s", want)
		}
		o, err := Parse(node)
		if err != nil {
			return nil, fmt.Errorf("sentinel %q: %v", node, err)
		}
		fo.SentinelAddrs = append(fo.SentinelAddrs, o.Addr)
	}
	return fo, nil
}

// WithTLS returns t reached over TLS (--redis-tls): for the forms that
// cannot say so themselves, a host:port or a list of nodes (not a unix
// socket). Certificates are verified against the system's roots (or
// WithCA's), with the name each node is dialled by. A target that already
// uses TLS (rediss://) is unchanged.
func (t Target) WithTLS() Target {
	cfg := func() *tls.Config { return &tls.Config{MinVersion: tls.VersionTLS12} }
	switch {
	case t.cluster != nil && t.cluster.TLSConfig == nil:
		co := *t.cluster
		co.TLSConfig = cfg()
		t.cluster = &co
	case t.sentinel != nil && t.sentinel.TLSConfig == nil:
		fo := *t.sentinel
		fo.TLSConfig = cfg()
		t.sentinel = &fo
	case t.single != nil && t.single.TLSConfig == nil && t.single.Network != "unix":
		o := *t.single
		o.TLSConfig = cfg()
		t.single = &o
	}
	return t
}

// ErrCANeedsTLS is WithCA's error for a target not reached over TLS.
var ErrCANeedsTLS = errors.New("a CA file is for TLS, which is not on: use a rediss:// URL or --redis-tls (not a unix socket)")

// WithCA returns t verifying the certificates of its servers (every node of
// a cluster; the sentinels and the servers they name) against the CA
// certificates in the PEM file path instead of the system's roots
// (--redis-tls-ca, for a private CA). Host names are verified as before. t
// must be reached over TLS (a rediss:// URL, or WithTLS first): otherwise
// the error is ErrCANeedsTLS. A file that cannot be read or holds no PEM
// certificate is an error naming the file, never the target's password.
func (t Target) WithCA(path string) (Target, error) {
	if !t.TLS() {
		return t, ErrCANeedsTLS
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return t, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return t, fmt.Errorf("%s holds no PEM certificate (want one or more -----BEGIN CERTIFICATE----- blocks)", path)
	}
	withRoots := func(c *tls.Config) *tls.Config {
		c = c.Clone()
		c.RootCAs = pool
		return c
	}
	switch {
	case t.cluster != nil:
		co := *t.cluster
		co.TLSConfig = withRoots(co.TLSConfig)
		t.cluster = &co
	case t.sentinel != nil:
		fo := *t.sentinel
		fo.TLSConfig = withRoots(fo.TLSConfig)
		t.sentinel = &fo
	default:
		o := *t.single
		o.TLSConfig = withRoots(o.TLSConfig)
		t.single = &o
	}
	return t, nil
}

// verified refuses a TLS configuration that does not verify certificates:
// what a URL's skip_verify=true asks for.
func verified(c *tls.Config) error {
	if c != nil && c.InsecureSkipVerify {
		return errors.New("skip_verify is refused: the server's certificate is always verified; for a private CA give its certificate with --redis-tls-ca FILE")
	}
	return nil
}

// Cluster reports whether t is a Redis Cluster.
func (t Target) Cluster() bool { return t.cluster != nil }

// TLS reports whether t is reached over TLS.
func (t Target) TLS() bool {
	if t.cluster != nil {
		return t.cluster.TLSConfig != nil
	}
	if t.sentinel != nil {
		return t.sentinel.TLSConfig != nil
	}
	return t.single != nil && t.single.TLSConfig != nil
}

// String names t for logs and errors, without a password: the server's
// address and database, the cluster's seed nodes, or the primary's name,
// its sentinels and database.
func (t Target) String() string {
	if t.cluster != nil {
		return "cluster " + strings.Join(t.cluster.Addrs, ",")
	}
	if t.sentinel != nil {
		return fmt.Sprintf("sentinel %s@%s db %d", t.sentinel.MasterName, strings.Join(t.sentinel.SentinelAddrs, ","), t.sentinel.DB)
	}
	if t.single == nil {
		return "no Redis"
	}
	return fmt.Sprintf("%s db %d", t.single.Addr, t.single.DB)
}

// Client returns a client for t whose connection pool holds at least pool
// connections (per node, on a cluster). Its connections do not send CLIENT
// SETINFO (go-redis's DisableIdentity): Redis 7.0 has no such command, and
// from 7.2 on an ACL would have to grant it, yet an ACL rule naming it is
// refused by 7.0; without it one ACL fits every Redis 7 (see docs/operations.md's
// least-privilege ACL).
func (t Target) Client(pool int) redis.UniversalClient {
	if t.cluster != nil {
		co := *t.cluster
		co.PoolSize = max(co.PoolSize, pool)
		co.DisableIdentity = true
		return redis.NewClusterClient(&co)
	}
	if t.sentinel != nil {
		fo := *t.sentinel
		fo.PoolSize = max(fo.PoolSize, pool)
		fo.DisableIdentity = true
		return redis.NewFailoverClient(&fo)
	}
	o := *t.single
	o.PoolSize = max(o.PoolSize, pool)
	o.DisableIdentity = true
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
