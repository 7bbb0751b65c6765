package quotas

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// RenewAll renews leases as Renew does, in one pipelined round trip (one
// per server on a Redis Cluster) rather than one each: for a process that
// renews the slots of all its running tasks together. ok[i] reports
// whether leases[i] was renewed (false: lost, as with Renew). err is for
// Redis failures and invalid leases; then ok is nil. Safe for concurrent
// use.
func (l *Limiter) RenewAll(ctx context.Context, leases []Lease) (ok []bool, err error) {
	if len(leases) == 0 {
		return nil, nil
	}
	for _, ls := range leases {
		if ls.zkey == "" {
			return nil, errors.New("quotas: not a lease from a Decision")
		}
	}
	tm, err := l.timing()
	if err != nil {
		return nil, err
	}
	run := func() []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(leases))
		_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error { // errors: per command, below
			for i, ls := range leases {
				cmds[i] = leaseScript.EvalSha(ctx, p, ls.keys(), 0, tm.now, tm.floor, holderField(ls.Holder), ls.Token, ls.Duration.Microseconds())
			}
			return nil
		})
		return cmds
	}
	cmds := run()
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
		// Not loaded on some server yet (every master, on a Cluster).
		if err := leaseScript.Load(ctx, l.client).Err(); err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		cmds = run()
	}
	ok = make([]bool, len(leases))
	for i, c := range cmds {
		v, err := c.Int64()
		if err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		ok[i] = v == 1
	}
	for i, ls := range leases {
		if ls.kept != nil {
			l.renewedKept(ls, ok[i])
		}
	}
	return ok, nil
}
