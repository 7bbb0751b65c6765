package taskrl

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// The waiting index: every task the middleware reschedules (booked for a
// later slot, held by a pause, or due to decide again) is recorded, under
// each rule it is decided by and its key for the rule, in a sorted set on
// the queues' Redis (keys.Waiting: task ID -> when it is due), so that
// producers can read a key's backlog in one call (Waiting, CheckBacklog,
// enqueue --max-waiting) instead of scanning asynq's scheduled tasks. A
// task counts until it is due; a set lives a minute after its last task
// is due. A task deleted through asynq's Inspector while it waits still
// counts until then.

//go:embed waiting.lua
var waitingLua string

var waitingScript = script.New(waitingLua, "gcra")

// indexTimeout bounds the index's write after a task is rescheduled: a
// slow write only delays the worker's next task, a failed one only
// undercounts.
const indexTimeout = time.Second

// Waiting returns how many tasks wait under rule for key (the rule's key
// as its template renders it from a payload; "" for a rule without one):
// tasks that workers sharing client (their Config.Client, the queues'
// Redis) and prefix (Config.Prefix; "" is the default) rescheduled and
// whose moment, on the Redis server's clock, has not come. One round trip.
// Safe for concurrent use.
func Waiting(ctx context.Context, client redis.UniversalClient, prefix, rule, key string) (int, error) {
	n, err := waitingCounts(ctx, client, prefix, key, rule)
	if err != nil {
		return 0, err
	}
	return n[0], nil
}

// waitingCounts returns Waiting for key under each of rules, in one call:
// the sets of one key share a slot.
func waitingCounts(ctx context.Context, client redis.UniversalClient, prefix, key string, rules ...string) ([]int, error) {
	if prefix == "" {
		prefix = gcra.DefaultPrefix
	}
	ks := make([]string, len(rules))
	for i, r := range rules {
		ks[i] = keys.Waiting(prefix, r, key)
	}
	v, err := waitingScript.Run(ctx, client, ks, "count").Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("taskrl: reading the waiting tasks: %w", err)
	}
	out := make([]int, len(v))
	for i, n := range v {
		out[i] = int(n)
	}
	return out, nil
}

// BacklogError is CheckBacklog's answer for a task that would join a
// backlog above the bound.
type BacklogError struct {
	Rule, Key string // the rule and the task's key under it
	Waiting   int    // the tasks already waiting under Rule for Key
	Max       int    // the bound CheckBacklog was given
}

// Error says which backlog is full.
func (e *BacklogError) Error() string {
	what := fmt.Sprintf("rule %q", e.Rule)
	if e.Key != "" {
		what += fmt.Sprintf(" for key %q", e.Key)
	}
	return fmt.Sprintf("taskrl: %d tasks already wait under %s, more than %d", e.Waiting, what, e.Max)
}

// CheckBacklog is backpressure for producers: before enqueuing a task of
// taskType in queue with payload, it returns a *BacklogError if, under
// any rule of p that would decide the task (not a shadow rule, nor one an
// unlimited override exempts its key from), more than max tasks already
// wait for the task's key (Waiting; client and prefix as the workers'
// Config.Client and Config.Prefix). A payload the rules cannot key (the
// workers would archive the task) and a task no rule governs pass. One
// round trip per distinct key of the task. Safe for concurrent use.
func CheckBacklog(ctx context.Context, client redis.UniversalClient, prefix string, p *policy.Policy, taskType, queue string, payload []byte, max int) error {
	b := p.Bind(taskType, queue)
	if b == nil {
		return nil
	}
	ks, err := b.Keys(payload)
	if err != nil {
		return nil
	}
	b = b.ForPayload(ks, payload)
	byKey := map[string][]string{}
	var order []string
	for i, r := range b.Rules() {
		if b.Exempt(i) || b.Rule(i).Shadow {
			continue
		}
		if _, ok := byKey[ks[i]]; !ok {
			order = append(order, ks[i])
		}
		byKey[ks[i]] = append(byKey[ks[i]], r.Name)
	}
	for _, k := range order {
		n, err := waitingCounts(ctx, client, prefix, k, byKey[k]...)
		if err != nil {
			return err
		}
		for i, c := range n {
			if c > max {
				return &BacklogError{Rule: byKey[k][i], Key: k, Waiting: c, Max: max}
			}
		}
	}
	return nil
}

// indexWaiting records the task j, rescheduled to be due at due, under
// each rule it is decided by (keys.Waiting), one call per distinct key.
func (m *Middleware) indexWaiting(j *job, due time.Time) {
	if j.sp == nil || j.keys == nil {
		return
	}
	byKey := map[string][]string{}
	var order []string
	for _, set := range []struct {
		s   *quotas.Set
		idx []int
	}{{j.sp.rates, j.sp.rateIdx}, {j.sp.slots, j.sp.slotIdx}} {
		if set.s == nil {
			continue
		}
		for k, r := range set.s.Rules() {
			key := j.keys[set.idx[k]]
			if _, ok := byKey[key]; !ok {
				order = append(order, key)
			}
			byKey[key] = append(byKey[key], keys.Waiting(m.prefix, r.Name, key))
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), indexTimeout)
	defer cancel()
	for _, k := range order {
		if err := waitingScript.Run(ctx, m.cfg.Client, byKey[k], "add", j.id, due.UnixMicro()).Err(); err != nil {
			m.cfg.Logger.Debug("taskrl: recording a waiting task failed", "task", j.id, "err", err)
			return
		}
	}
}
