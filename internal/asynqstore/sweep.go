package asynqstore

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed sweep_read.lua
	sweepReadLua string
	//go:embed sweep_move.lua
	sweepMoveLua string

	sweepReadScript = redis.NewScript(taskmsgLua + "\n" + sweepReadLua)
	sweepMoveScript = redis.NewScript(taskmsgLua + "\n" + sweepMoveLua)
)

// A Look says which of a queue's oldest pending tasks a sweep reads
// (SweepRead), under the queue's sweep lock.
type Look struct {
	Queue string
	// Lock is the hash holding the queue's sweep lock and cursors; it
	// must share asynq's hash tag for the queue ("{" queue "}").
	Lock  string
	Now   int64 // server µs, or -1: the server's TIME
	Token string
	// Hold is how long the caller holds the lock from now; 0 gives it up.
	Hold time.Duration
	// Offset skips the oldest Offset tasks; Window is the most to read;
	// Least is the fewest pending tasks worth a sweep; Bytes the most
	// bytes of messages to return.
	Offset, Window, Least, Bytes int
}

// A Listed is a pending task a sweep read: its ID and message ("" for a
// task whose hash is gone, or that a sweep set aside once already).
type Listed struct{ ID, Msg string }

// SweepRead reads a queue's oldest pending tasks under its sweep lock
// (sweep_read.lua), oldest first. locked is false when another sweeper
// holds the lock; tasks is empty when the lock was given up or fewer than
// l.Least tasks are pending; full reports a full window (there may be
// more).
func SweepRead(ctx context.Context, c redis.Scripter, l Look) (locked, full bool, tasks []Listed, err error) {
	raw, err := sweepReadScript.Run(ctx, c, []string{Pending(l.Queue), l.Lock}, l.Now, l.Token, l.Hold.Microseconds(), TaskPrefix(l.Queue), l.Offset, l.Window, l.Least, l.Bytes).Slice()
	if err == redis.Nil {
		return false, false, nil, nil
	}
	if err != nil || len(raw) == 0 {
		return err == nil, false, nil, err
	}
	n, _ := raw[0].(int64)
	for i := 1; i+1 < len(raw); i += 2 {
		id, _ := raw[i].(string)
		msg, _ := raw[i+1].(string)
		tasks = append(tasks, Listed{ID: id, Msg: msg})
	}
	return true, n == 1, tasks, nil
}

// A Backlog is one backlog a sweep moves tasks of: its signature, the
// earliest slot of its first task and the spacing between its tasks (µs).
type Backlog struct {
	Sig            string
	First, Spacing int64
}

// A Sweep says which tasks a sweep moves (SweepMove).
type Sweep struct {
	Queue, Lock string // as for Look
	Now         int64  // server µs
	Token       string
	// Look is how many of the oldest pending IDs to look through.
	Look int
	// Skew is the caller's clock minus the server's, µs: asynq scores due
	// times in Unix seconds of the workers' clocks.
	Skew int64
	// Lead: a task is due this long before its estimated slot; Soon: a
	// task whose estimated slot is sooner than this from now stays (µs).
	Lead, Soon int64
	Backlogs   []Backlog
	Tasks      []Swept
}

// A Swept is a task a sweep moves if it is still pending: its backlog
// (1-based index into Sweep.Backlogs) and deadline (Unix s, 0: none).
type Swept struct {
	ID       string
	Backlog  int
	Deadline int64
}

// SweepMove moves the tasks of s still pending from asynq's pending list
// to its scheduled set, each due a lead before its backlog's next
// estimated slot (sweep_move.lua), and returns how many moved; ok is false
// when the caller no longer holds the lock.
func SweepMove(ctx context.Context, c redis.Scripter, s Sweep) (moved int, ok bool, err error) {
	args := make([]any, 0, 8+3*len(s.Backlogs)+3*len(s.Tasks))
	args = append(args, s.Now, s.Token, TaskPrefix(s.Queue), s.Look, s.Skew, s.Lead, s.Soon, len(s.Backlogs))
	for _, b := range s.Backlogs {
		args = append(args, b.Sig, b.First, b.Spacing)
	}
	for _, t := range s.Tasks {
		args = append(args, t.ID, t.Backlog, t.Deadline)
	}
	moved, err = sweepMoveScript.Run(ctx, c, []string{Pending(s.Queue), Scheduled(s.Queue), s.Lock}, args...).Int()
	if err == redis.Nil {
		return 0, false, nil
	}
	return moved, err == nil, err
}
