// Package asynqstore is the one place that knows asynq's own data in Redis:
// the key names of a queue's lists, sets and task hashes, the fields of a
// task message, and the scripts that park a running task in place and move
// it back (Park, Unpark), for the middleware, its sweep and worker status.
// It follows asynq v0.26 (internal/base, internal/rdb and
// internal/proto/asynq.proto there); the tests check it against what the
// pinned asynq writes, reads and counts, so an asynq upgrade that changes
// any of it fails them.
package asynqstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"
)

// Pending is the key of queue's list of pending task IDs (asynq pushes on
// the left and pops on the right: the oldest is last).
func Pending(queue string) string { return "asynq:{" + queue + "}:pending" }

// Scheduled is the key of queue's sorted set of scheduled task IDs, scored
// by when they are due in Unix seconds.
func Scheduled(queue string) string { return "asynq:{" + queue + "}:scheduled" }

// TaskPrefix starts the key of every task hash of queue (fields msg,
// state, pending_since, ...): TaskPrefix(queue) + ID.
func TaskPrefix(queue string) string { return "asynq:{" + queue + "}:t:" }

// Msg is what the sweep reads of a task message.
type Msg struct {
	Type     string
	Payload  []byte
	ID       string
	Headers  map[string]string
	Deadline int64  // Unix seconds; 0: none
	ErrorMsg string // asynq's TaskInfo.LastErr
}

// Field numbers of asynq's TaskMessage.
const (
	fieldType     = 1
	fieldPayload  = 2
	fieldID       = 3
	fieldErrorMsg = 7
	fieldDeadline = 9
	fieldHeaders  = 15
)

var errBad = errors.New("asynqstore: not a task message")

// Decode reads a TaskMessage as asynq encodes it (protobuf). Fields it does
// not need are skipped; malformed input is an error, never a panic.
func Decode(b []byte) (Msg, error) {
	var m Msg
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return Msg{}, errBad
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && (num == fieldType || num == fieldPayload || num == fieldID || num == fieldErrorMsg || num == fieldHeaders):
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return Msg{}, errBad
			}
			b = b[n:]
			switch num {
			case fieldType:
				m.Type = string(v)
			case fieldPayload:
				m.Payload = v
			case fieldID:
				m.ID = string(v)
			case fieldErrorMsg:
				m.ErrorMsg = string(v)
			case fieldHeaders:
				k, val, err := entry(v)
				if err != nil {
					return Msg{}, err
				}
				if m.Headers == nil {
					m.Headers = map[string]string{}
				}
				m.Headers[k] = val
			}
		case typ == protowire.VarintType && num == fieldDeadline:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return Msg{}, errBad
			}
			b = b[n:]
			m.Deadline = int64(v)
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return Msg{}, errBad
			}
			b = b[n:]
		}
	}
	return m, nil
}

// entry reads one map<string, string> entry.
func entry(b []byte) (k, v string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", errBad
		}
		b = b[n:]
		if typ != protowire.BytesType || (num != 1 && num != 2) {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", "", errBad
			}
			b = b[n:]
			continue
		}
		s, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", "", errBad
		}
		b = b[n:]
		if num == 1 {
			k = string(s)
		} else {
			v = string(s)
		}
	}
	return k, v, nil
}

// A Stored is a task of a queue's scheduled set.
type Stored struct {
	Msg
	Due time.Time // when asynq's forwarder moves it (whole seconds)
}

// ReadScheduled returns up to count tasks of queue's scheduled set, the
// soonest due first, from the offset-th: two round trips. A task whose hash
// is gone, or whose message does not decode, is left out; more reports
// whether the set may hold tasks past these.
func ReadScheduled(ctx context.Context, c redis.UniversalClient, queue string, offset, count int) (tasks []Stored, more bool, err error) {
	zs, err := c.ZRangeWithScores(ctx, Scheduled(queue), int64(offset), int64(offset+count-1)).Result()
	if err != nil || len(zs) == 0 {
		return nil, false, err
	}
	cmds := make([]*redis.StringCmd, len(zs))
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, z := range zs {
			cmds[i] = p.HGet(ctx, TaskPrefix(queue)+z.Member.(string), "msg")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, err
	}
	for i, z := range zs {
		b, err := cmds[i].Bytes()
		if err != nil {
			continue
		}
		m, err := Decode(b)
		if err != nil {
			continue
		}
		tasks = append(tasks, Stored{Msg: m, Due: time.Unix(int64(z.Score), 0)})
	}
	return tasks, len(zs) == count, nil
}
