package asynqstore

import (
	"context"
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

// Active is the key of queue's list of the IDs of tasks a worker runs.
func Active(queue string) string { return "asynq:{" + queue + "}:active" }

// Lease is the key of queue's sorted set of active task IDs, scored by
// when their lease ends (Unix seconds).
func Lease(queue string) string { return "asynq:{" + queue + "}:lease" }

// HeaderPrefix starts the name of every header the middleware keeps on a
// waiting task; Park replaces all of them.
const HeaderPrefix = "taskrl-"

var (
	//go:embed taskmsg.lua
	taskmsgLua string
	//go:embed park.lua
	parkLua string
	//go:embed unpark.lua
	unparkLua string

	parkScript   = redis.NewScript(taskmsgLua + "\n" + parkLua)
	unparkScript = redis.NewScript(taskmsgLua + "\n" + unparkLua)
)

// A Parking says how a running task waits (Park).
type Parking struct {
	Queue, ID string
	// Reason becomes the task's error message while it waits: asynq's
	// TaskInfo.LastErr. The message it had before is given back when
	// Unpark moves it to pending.
	Reason string
	// Headers replace every header of the task that starts with
	// HeaderPrefix; others are kept.
	Headers map[string]string
	// Forward is when asynq's forwarder moves the task to pending if no
	// pacer has (asynq scores it in Unix seconds of the workers' clocks).
	Forward time.Time
	// PaceKey is the queue's pacing set, which must share asynq's hash
	// tag for the queue ("{" queue "}"); PaceAt (server µs) is when a pacer
	// moves the task, or negative: not paced. PaceExpire (Unix ms) is
	// the least expiry of the set.
	PaceKey    string
	PaceAt     int64
	PaceExpire int64
}

// Park makes the task that a worker is running (asynq's active list) a
// scheduled task again, in place, in one script: the same ID, hash,
// unique lock and retry count, due at p.Forward, paced at p.PaceAt. The
// handler then returns nil, and asynq's own write after it (Done or
// MarkAsComplete) finds the task no longer active and changes nothing.
// parked is false, and nothing changed, when the task is not active any
// more (its lease ended: asynq's recoverer retries it). Safe for
// concurrent use.
func Park(ctx context.Context, c redis.Scripter, p Parking) (parked bool, err error) {
	keys := []string{Active(p.Queue), Lease(p.Queue), Scheduled(p.Queue), TaskPrefix(p.Queue) + p.ID, p.PaceKey}
	n, err := parkScript.Run(ctx, c, keys, p.ID, fields(p.Reason, p.Headers), p.Forward.Unix(), p.PaceAt, p.PaceExpire).Int()
	switch {
	case err != nil:
		return false, err
	case n < 0:
		return false, fmt.Errorf("asynqstore: task %s in queue %s: %w", p.ID, p.Queue, errBad)
	}
	return n == 1, nil
}

// fields encodes error_msg and the header entries as they are appended
// to a TaskMessage (a later field wins in protobuf), headers by name.
// Strings that are not UTF-8 are made so: asynq could not decode the
// message otherwise.
func fields(reason string, headers map[string]string) []byte {
	b := protowire.AppendTag(nil, fieldErrorMsg, protowire.BytesType)
	b = protowire.AppendString(b, strings.ToValidUTF8(reason, "\uFFFD"))
	names := make([]string, 0, len(headers))
	for k := range headers {
		if strings.HasPrefix(k, HeaderPrefix) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	var e []byte
	for _, k := range names {
		e = protowire.AppendTag(e[:0], 1, protowire.BytesType)
		e = protowire.AppendString(e, strings.ToValidUTF8(k, "\uFFFD"))
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, strings.ToValidUTF8(headers[k], "\uFFFD"))
		b = protowire.AppendTag(b, fieldHeaders, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// A Claim says which parked tasks of a queue a pacer moves (Unpark).
type Claim struct {
	Queue   string
	PaceKey string
	// Moved holds the ID of the task the last claim put deepest in
	// pending (keys.Moved); Early the tasks a claim put at the tail of
	// pending, by slot (keys.Early). Both in PaceKey's slot.
	Moved, Early string
	Now          int64 // server µs, or -1: the server's TIME
	Most         int   // the most due IDs to look at
	Lead         int64 // move tasks due within this many µs
	// BusyLead: a task due within this many µs goes to the head of
	// pending, a later one to its tail, and to the head once due within
	// Promote, by any claim, if no worker has taken it by then.
	BusyLead, Promote int64
	// Fence: a task parked less than this many µs ago moves only if
	// named in Mine, the caller's own parked tasks whose run asynq is
	// done with.
	Fence int64
	Mine  []string
}

// Unparked is what a claim did (Unpark).
type Unparked struct {
	// Looked is how many due IDs the claim looked at (Claim.Most: there
	// may be more), Moved how many tasks it moved from the scheduled set,
	// and Noted how many of them it put at the tail of pending behind
	// other tasks: a claim once they are due within Claim.Promote moves
	// them to the head.
	Looked, Moved, Noted int
}

// Unpark moves the parked tasks of a queue that are due within c.Lead from
// asynq's scheduled set to its pending list (unpark.lua says where in
// it), with the error message they had before they first waited, and moves
// the tasks an earlier claim put at the tail to the head once they are due
// within c.Promote. Safe for concurrent use: each task moves once.
func Unpark(ctx context.Context, r redis.Scripter, c Claim) (Unparked, error) {
	argv := make([]any, 0, 7+len(c.Mine))
	argv = append(argv, c.Now, c.Most, c.Lead, c.BusyLead, c.Promote, c.Fence, TaskPrefix(c.Queue))
	for _, id := range c.Mine {
		argv = append(argv, id)
	}
	v, err := unparkScript.Run(ctx, r, []string{c.PaceKey, Scheduled(c.Queue), Pending(c.Queue), c.Moved, c.Early}, argv...).Int64Slice()
	if err != nil {
		return Unparked{}, err
	}
	if len(v) != 3 {
		return Unparked{}, fmt.Errorf("asynqstore: unpark replied %v", v)
	}
	return Unparked{Looked: int(v[0]), Moved: int(v[1]), Noted: int(v[2])}, nil
}
