// Package redisurl parses the Redis address the binaries take (--redis,
// REDIS_URL) into go-redis options, with errors that never repeat a
// password.
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
			// url.Parse errors quote the whole URL, password included.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return nil, fmt.Errorf("not a valid Redis URL (%v); want redis://[[user]:password@]host[:port][/db], rediss://..., unix:///path or host:port", err)
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
