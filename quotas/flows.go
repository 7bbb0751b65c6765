package quotas

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
)

// FlowState is one flow of a fair rule (Rule.Fair) for one key, as Flows
// reads it.
type FlowState struct {
	// Flow is the flow's name (its Request.Fair value; an id the keys
	// hold hashed shows as that hash, starting with '~').
	Flow string
	// Held is, for a concurrency rule, the slots the flow holds.
	Held int
	// Waiting reports that the flow waits: a concurrency rule refused it a
	// slot within the last second; a GCRA rule has its requests booked
	// ahead of now.
	Waiting bool
	// Weight is the weight the flow waits with (Request.Weights), 0 when
	// it does not wait.
	Weight int
	// Level is, at a rule with priorities (Rule.Aging), the priority of
	// these requests of the flow (a flow waiting at two levels is two
	// FlowStates); 0 at other rules.
	Level int
	// Ahead is, for a GCRA rule, how far past now the flow's virtual
	// finish lies: the span of the rule's time its requests booked ahead
	// take at its share (booked.lua).
	Ahead time.Duration
}

// Flows reads, for each rule of s in order, the flows of a fair rule for
// req's keys: those holding slots or waiting for them (concurrency), or
// with requests booked ahead (GCRA), busiest first; nil for a rule that is
// not fair. It reads several keys one after the other, not at one moment:
// for reports (worker status), not decisions. Safe for concurrent use.
func (l *Limiter) Flows(ctx context.Context, s *Set, req Request) ([][]FlowState, error) {
	calls, err := l.bind(s, req, false)
	if err != nil {
		return nil, err
	}
	now, err := l.serverMicros(ctx)
	if err != nil {
		return nil, err
	}
	out := make([][]FlowState, len(calls))
	for i, c := range calls {
		var fs map[string]*FlowState
		switch {
		case c.c.cfair:
			fs, err = l.slotFlows(ctx, c.keys, now, c.c.aging > 0)
		case c.c.fair:
			fs, err = l.gcraFlows(ctx, c.keys[2], now, c.c.aging > 0)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		out[i] = []FlowState{}
		for enc, f := range fs {
			if i := strings.IndexByte(enc, '!'); i >= 0 {
				enc = enc[:i] // its level, in f.Level
			}
			f.Flow = enc
			if id, ok := keys.Decode(enc); ok {
				f.Flow = id
			} else if enc == noFlow {
				f.Flow = ""
			}
			out[i] = append(out[i], *f)
		}
		slices.SortFunc(out[i], func(a, b FlowState) int {
			if a.Held != b.Held {
				return b.Held - a.Held
			}
			if a.Weight != b.Weight {
				return b.Weight - a.Weight
			}
			if c := strings.Compare(a.Flow, b.Flow); c != 0 {
				return c
			}
			return a.Level - b.Level
		})
	}
	return out, nil
}

// noFlow is the flow "" (Request.Fair nil) as the keys hold it.
var noFlow = keys.Encode("")

// serverMicros is the Limiter's clock, µs: Config.Now, or the server's
// TIME.
func (l *Limiter) serverMicros(ctx context.Context) (int64, error) {
	if l.now != nil {
		return l.now().UnixMicro(), nil
	}
	t, err := l.client.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("quotas: %w", err)
	}
	return t.UnixMicro(), nil
}

// slotFlows reads a fair concurrency rule's flows from its keys (holders,
// tokens, waiting, waits; rules.lua, cc_wait): the slots each holds
// (tokens field "~f:" flow) and those waiting until after now (waits field
// "e" flow) with their weight ("w" flow). At a rule with priorities
// (levels), each level of a flow is a flow of its own.
func (l *Limiter) slotFlows(ctx context.Context, ks []string, now int64, levels bool) (map[string]*FlowState, error) {
	fs := map[string]*FlowState{}
	get := func(enc string) *FlowState {
		if fs[enc] == nil {
			fs[enc] = &FlowState{}
			if levels {
				fs[enc].Level = int(levelOf(enc))
			}
		}
		return fs[enc]
	}
	it := l.client.HScan(ctx, ks[1], 0, "~f:*", 1000).Iterator()
	for it.Next(ctx) {
		field := it.Val()
		if !it.Next(ctx) {
			break
		}
		if n, err := strconv.Atoi(it.Val()); err == nil && n > 0 {
			get(strings.TrimPrefix(field, "~f:")).Held = n
		}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	waits, err := l.client.HGetAll(ctx, ks[3]).Result()
	if err != nil {
		return nil, err
	}
	for field, v := range waits {
		if !strings.HasPrefix(field, "e") {
			continue
		}
		if end, err := strconv.ParseInt(v, 10, 64); err == nil && end > now {
			f := get(field[1:])
			f.Waiting = true
			f.Weight, _ = strconv.Atoi(waits["w"+field[1:]])
		}
	}
	return fs, nil
}

// gcraFlows reads a fair GCRA rule's flows from its flows sorted set
// (booked.lua): a flow of weight w is its member and w-1 copies
// ("flow#2"...), scored by its virtual finish; those ending after now
// wait. At a rule with priorities (levels), each level of a flow is a
// member of its own, its level after '!' (none: the default level).
func (l *Limiter) gcraFlows(ctx context.Context, key string, now int64, levels bool) (map[string]*FlowState, error) {
	members, err := l.client.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now, 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, err
	}
	fs := map[string]*FlowState{}
	for _, z := range members {
		m, _ := z.Member.(string)
		enc := m
		if i := strings.LastIndexByte(m, '#'); i >= 0 {
			if _, err := strconv.Atoi(m[i+1:]); err == nil {
				enc = m[:i]
			}
		}
		f := fs[enc]
		if f == nil {
			f = &FlowState{Waiting: true, Ahead: time.Duration(int64(z.Score)-now) * time.Microsecond}
			if levels {
				f.Level = int(levelOf(enc))
			}
			fs[enc] = f
		}
		f.Weight++
	}
	return fs, nil
}
