// Package asynqmsg reads what the middleware's sweep needs of asynq's own
// data in Redis: the key names of a queue's pending list, scheduled set
// and task hashes, and the fields of a task message. It follows asynq
// v0.26 (internal/base and internal/proto/asynq.proto there); the tests
// check it against messages and keys the pinned asynq writes, so an asynq
// upgrade that changes either fails them.
package asynqmsg

import (
	"errors"

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
	Deadline int64 // Unix seconds; 0: none
}

// Field numbers of asynq's TaskMessage.
const (
	fieldType     = 1
	fieldPayload  = 2
	fieldID       = 3
	fieldDeadline = 9
	fieldHeaders  = 15
)

var errBad = errors.New("asynqmsg: not a task message")

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
		case typ == protowire.BytesType && (num == fieldType || num == fieldPayload || num == fieldID || num == fieldHeaders):
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
