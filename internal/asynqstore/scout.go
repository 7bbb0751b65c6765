package asynqstore

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed scout_read.lua
	scoutReadLua string
	//go:embed scout_move.lua
	scoutMoveLua string

	scoutReadScript = redis.NewScript(scoutReadLua)
	scoutMoveScript = redis.NewScript(scoutMoveLua)
)

// A Scout says which of a queue's newest pending tasks ScoutRead reads:
// those since the task Mark names in Hash saw last, at most Window of
// them and Bytes of messages.
type Scout struct {
	Queue string
	// Hash holds the mark; it must share asynq's hash tag for the queue
	// ("{" queue "}"). It lives Keep at least from the read.
	Hash, Mark    string
	Window, Bytes int
	Keep          time.Duration
}

// ScoutRead reads the pending tasks of s.Queue enqueued or put back since
// the last read with the same mark, newest first (scout_read.lua), and
// marks the newest.
func ScoutRead(ctx context.Context, c redis.Scripter, s Scout) ([]Listed, error) {
	raw, err := scoutReadScript.Run(ctx, c, []string{Pending(s.Queue), s.Hash}, s.Mark, TaskPrefix(s.Queue), s.Window, s.Bytes, s.Keep.Milliseconds()).Slice()
	if err != nil {
		return nil, err
	}
	tasks := make([]Listed, 0, len(raw)/2)
	for i := 0; i+1 < len(raw); i += 2 {
		id, _ := raw[i].(string)
		msg, _ := raw[i+1].(string)
		tasks = append(tasks, Listed{ID: id, Msg: msg})
	}
	return tasks, nil
}

// ScoutMove moves the tasks ids of queue still pending to the head of
// asynq's pending list, ids[0] to be taken first (scout_move.lua), and
// returns how many moved.
func ScoutMove(ctx context.Context, c redis.Scripter, queue string, ids []string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return scoutMoveScript.Run(ctx, c, []string{Pending(queue)}, args...).Int()
}
