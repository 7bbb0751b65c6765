package bench

import (
	"context"
	"time"

	"github.com/taskrl/taskrl/quotas"
)

// The cases of fair rules (quotas.Rule.Fair), each with the business as
// its flow:
//
//   - quotas-1rule-fair: OneRule with its rule fair, on its global key
//     (both modes): the cost of a fair rule against quotas-1rule;
//   - quotas-5rule-fair: FiveRules with the peak fair, as quotas-5rule.
//
// The fair rules are named apart from the others, so that their bookings
// never reach the other cases.
var (
	OneFairRule   = mustSet(quotas.Rule{Name: "fairpeak", Limit: quotas.GCRA(TaskrlLimit), Fair: true})
	FiveFairRules = mustSet(append([]quotas.Rule{{Name: "fairpeak", Limit: quotas.GCRA(TaskrlLimit), Fair: true}}, append(fourRules()[1:],
		quotas.Rule{Name: "slots", Limit: quotas.Concurrency{Max: 1000000, Lease: 30 * time.Second}})...)...)
)

func init() {
	Contenders = append(Contenders, "quotas-1rule-fair", "quotas-5rule-fair")
	moreOps["quotas-1rule-fair"] = func(e *Env) op {
		return func(ctx context.Context, key string) (bool, error) {
			d, err := e.Quotas.Allow(ctx, OneFairRule, quotas.Request{Fair: []string{key}})
			return d.Allowed, err
		}
	}
	moreOps["quotas-5rule-fair"] = func(e *Env) op {
		return func(ctx context.Context, biz string) (bool, error) {
			d, err := e.Quotas.Allow(ctx, FiveFairRules, quotas.Request{Keys: []string{"", "", "", biz, biz}, Fair: []string{biz, "", "", "", ""}, Holder: e.nextHolder()})
			return d.Allowed, err
		}
	}
}
