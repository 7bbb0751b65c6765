package bench

import (
	"context"
	"strconv"

	"github.com/taskrl/taskrl/quotas"
)

// quotas-5rule-release: FiveRules as a worker's task pays for them, one
// Allow with a holder of its own (a task's id) and then the Release of its
// slot: two Limiter calls per op, each shared with those of other callers
// made meanwhile.
func init() {
	Contenders = append(Contenders, "quotas-5rule-release")
	moreOps["quotas-5rule-release"] = func(e *Env) op {
		return func(ctx context.Context, biz string) (bool, error) {
			d, err := e.Quotas.Allow(ctx, FiveRules, quotas.Request{Keys: []string{"", "", "", biz, biz}, Holder: "rel-" + strconv.FormatUint(e.holder.Add(1), 36)})
			if err != nil || !d.Allowed {
				return false, err
			}
			for _, ls := range d.Leases {
				if _, err := e.Quotas.Release(ctx, ls); err != nil {
					return false, err
				}
			}
			return true, nil
		}
	}
}
