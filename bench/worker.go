package bench

import (
	"context"
	"strconv"
	"time"

	"github.com/taskrl/taskrl/quotas"
)

// quotas-5rule-worker: FiveRules as the worker decides them for a task.
// The rates (the four rate and window rules) and the slots (the
// concurrency rule) are two sets, with the prefetch the worker gives such
// rules by itself (taskrl's withAutoPrefetch: 10 ms for the windows and
// the slots, a quarter of the burst's worth for the GCRA rules, here
// 10 ms); one ReserveAndAllow takes the rates and the slot (in one call,
// or the global rates from units in hand and the rest in one call), then
// the slot is released.
var (
	WorkerRates = mustSet(withPrefetch(fourRules(), 10*time.Millisecond)...)
	WorkerSlots = mustSet(quotas.Rule{Name: "wslots", Limit: quotas.Concurrency{Max: 1000000, Lease: 30 * time.Second}, Prefetch: 10 * time.Millisecond})
)

// withPrefetch returns rules renamed apart from the other cases' ("w"
// first) with Prefetch p.
func withPrefetch(rules []quotas.Rule, p time.Duration) []quotas.Rule {
	for i := range rules {
		rules[i].Name, rules[i].Prefetch = "w"+rules[i].Name, p
	}
	return rules
}

func init() {
	Contenders = append(Contenders, "quotas-5rule-worker")
	moreOps["quotas-5rule-worker"] = func(e *Env) op {
		return func(ctx context.Context, biz string) (bool, error) {
			holder := "w-" + strconv.FormatUint(e.holder.Add(1), 36)
			rd, sd, decided, err := e.Quotas.ReserveAndAllow(ctx, WorkerRates, quotas.Request{Keys: []string{"", "", "", biz}}, 0, WorkerSlots, quotas.Request{Keys: []string{biz}, Holder: holder})
			if err != nil || !rd.Allowed {
				return false, err
			}
			if !decided {
				if sd, err = e.Quotas.Allow(ctx, WorkerSlots, quotas.Request{Keys: []string{biz}, Holder: holder}); err != nil {
					return false, err
				}
			}
			for _, ls := range sd.Leases {
				if _, err := e.Quotas.Release(ctx, ls); err != nil {
					return false, err
				}
			}
			return sd.Allowed, nil
		}
	}
}
