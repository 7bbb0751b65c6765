package status

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/asynqstore"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// MaxWaitingScan bounds the scheduled tasks Waiting reads per queue.
const MaxWaitingScan = 100000

// WaitingTask is a task that waits for its limits in asynq's scheduled
// set, under the ID its producer got from Enqueue.
type WaitingTask struct {
	ID    string `json:"id"`
	Queue string `json:"queue"`
	Type  string `json:"type"`
	// Until is its booked slot, or, unbooked, when it decides again (the
	// Redis server's clock).
	Until  time.Time `json:"until"`
	Booked bool      `json:"booked,omitempty"`
	// Keys are its rules' keys by rule name ("" for a rule without one).
	Keys map[string]string `json:"keys,omitempty"`
	// Reason is its LastErr in asynq: the rule it waits for and the moment.
	Reason string `json:"reason"`
}

// Waiting lists the tasks of queues that wait for the limits of policy
// (those the middleware parked: they carry its taskrl-round header),
// soonest first per queue, at most most of them: all of them, or those of
// rule, or those whose key for rule is key (rule required then). It reads
// at most MaxWaitingScan scheduled tasks per queue, 1,000 a round trip.
func Waiting(ctx context.Context, c redis.UniversalClient, policy *policy.Policy, queues []string, rule, key string, most int) ([]WaitingTask, error) {
	if key != "" && rule == "" {
		return nil, fmt.Errorf("a key names the tasks of one rule: give the rule too")
	}
	var out []WaitingTask
	for _, q := range queues {
		for off := 0; off < MaxWaitingScan && len(out) < most; off += 1000 {
			tasks, more, err := asynqstore.ReadScheduled(ctx, c, q, off, 1000)
			if err != nil {
				return nil, fmt.Errorf("queue %q: %w", q, err)
			}
			for _, t := range tasks {
				if w, ok := waiting(policy, q, t.Msg, rule, key); ok && len(out) < most {
					out = append(out, w)
				}
			}
			if !more {
				break
			}
		}
	}
	return out, nil
}

// waiting describes m, a task of queue, if it waits for rule (any rule if
// "") with key (any if "").
func waiting(policy *policy.Policy, queue string, m asynqstore.Msg, rule, key string) (WaitingTask, bool) {
	if _, ok := m.Headers[taskrl.HeaderRound]; !ok {
		return WaitingTask{}, false
	}
	w := WaitingTask{ID: m.ID, Queue: queue, Type: m.Type, Reason: m.ErrorMsg}
	at, booked := m.Headers[taskrl.HeaderBooked]
	if !booked {
		at = m.Headers[taskrl.HeaderDue]
	}
	if us, err := strconv.ParseInt(at, 10, 64); err == nil {
		w.Until, w.Booked = time.UnixMicro(us), booked
	}
	b := policy.Bind(m.Type, queue)
	keys, err := b.Keys(m.Payload)
	if err == nil {
		b = b.ForPayload(keys, m.Payload)
	}
	found := rule == ""
	if b != nil {
		w.Keys = map[string]string{}
		for i, r := range b.Rules() {
			if b.Exempt(i) {
				continue // an unlimited override: the task does not wait for it
			}
			if i < len(keys) {
				w.Keys[r.Name] = keys[i]
			}
			if r.Name == rule && (key == "" || i < len(keys) && keys[i] == key) {
				found = true
			}
		}
	}
	return w, found
}

// WaitingText is a table of ws for a terminal.
func WaitingText(ws []WaitingTask, now time.Time) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tQUEUE\tIN\tKEYS\tWHY")
	for _, w := range ws {
		var keys []string
		for r, k := range w.Keys {
			if k != "" {
				keys = append(keys, r+"="+k)
			}
		}
		slices.Sort(keys)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", w.ID, w.Queue, w.Until.Sub(now).Round(time.Millisecond), strings.Join(keys, ","), w.Reason)
	}
	tw.Flush()
	fmt.Fprintf(&b, "%d waiting\n", len(ws))
	return b.String()
}
