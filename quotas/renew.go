package quotas

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/batch"
)

// RenewAll renews leases as Renew does, in one call of the lease program on
// a single Redis (of Config.MaxBatch leases at most; one pipelined round
// trip of a call per lease on a Redis Cluster) rather than one round trip
// each: for a process that renews the
// slots of all its running tasks together. ok[i] reports whether leases[i]
// was renewed (false: lost, as with Renew). err is for Redis failures and
// invalid leases; then ok is nil. Safe for concurrent use.
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
	replies := make([][]any, len(leases))
	if !l.sharded {
		jobs := make([]*batch.Job, len(leases))
		for i, ls := range leases {
			keys, args := ls.args(leaseRenew, tm)
			jobs[i] = &batch.Job{Ctx: ctx, Keys: keys, Args: args}
		}
		l.leases.Own(ctx, jobs)
		for i, j := range jobs {
			if j.Err != nil {
				return nil, j.Err
			}
			replies[i] = j.Reply
		}
	} else {
		cmds := make([][]any, len(leases))
		rs := make([]*redis.Cmd, len(leases))
		_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error { // errors: per command, below
			for i, ls := range leases {
				keys, args := ls.args(leaseRenew, tm)
				cmds[i] = append(append(append(leaseProgram.Head(len(keys)), toAny(keys)...), 1), args...)
				rs[i] = redis.NewCmd(ctx, cmds[i]...)
				_ = p.Process(ctx, rs[i])
			}
			return nil
		})
		for i, r := range rs {
			// Not loaded on that master yet: loaded, and run again.
			vs, err := leaseProgram.Retry(ctx, l.client, cmds[i], r).Slice()
			if err != nil {
				return nil, fmt.Errorf("quotas: %w", err)
			}
			if len(vs) == 1 {
				replies[i], _ = vs[0].([]any)
			}
		}
	}
	ok = make([]bool, len(leases))
	for i, v := range replies {
		if ok[i], err = leaseDone(v); err != nil {
			return nil, err
		}
	}
	for i, ls := range leases {
		if ls.kept != nil {
			l.renewedKept(ls, ok[i])
		}
	}
	return ok, nil
}
