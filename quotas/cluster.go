package quotas

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// groups splits calls by hash tag when the client shards keys, so that each
// script touches one slot; a single server takes all calls in one script.
func (l *Limiter) groups(calls []call) [][]call {
	if !l.sharded {
		return [][]call{calls}
	}
	var out [][]call
	idx := map[string]int{}
	for _, c := range calls {
		j, ok := idx[c.tag]
		if !ok {
			j = len(out)
			idx[c.tag] = j
			out = append(out, nil)
		}
		out[j] = append(out[j], c)
	}
	return out
}

// pipelined sends each group its own script call, all in one parallel round
// trip: go-redis sends each node its scripts.
func (l *Limiter) pipelined(ctx context.Context, gs [][]call, p params, tm timing) ([][]any, error) {
	cmds := make([]*redis.Cmd, len(gs))
	kss, argvs := make([][]string, len(gs)), make([][]any, len(gs))
	full := make([][]any, len(gs))
	_, _ = l.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, g := range gs {
			kss[i], argvs[i], _ = l.args(g, p, tm)
			full[i] = setProgram.Head(len(kss[i]))
			for _, k := range kss[i] {
				full[i] = append(full[i], k)
			}
			full[i] = append(full[i], argvs[i]...)
			cmds[i] = pipe.Do(ctx, full[i]...)
		}
		return nil
	})
	vs := make([][]any, len(gs))
	for i, cmd := range cmds {
		v, err := setProgram.Retry(ctx, l.client, full[i], cmd).Slice()
		if err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		if len(v) == 1 {
			vs[i], _ = v[0].([]any)
		}
		if vs[i] == nil {
			return nil, fmt.Errorf("quotas: unexpected script reply %v", v)
		}
	}
	return vs, nil
}

// undone refunds what the admitting groups of a denied decision d
// charged and returns d, denied, with their state after that.
func (l *Limiter) undone(ctx context.Context, s *Set, gs [][]call, rs []reply, p params, d Decision) (Decision, error) {
	charged, undone, err := l.undo(ctx, gs, rs, p)
	for gi, g := range charged {
		for j, c := range g {
			d.Rules[c.i] = status(s, c, undone[gi].rules[j])
		}
	}
	return d.denied(), err
}

// reserveAcross books a set whose keys span slots: the slots first agree,
// without charging anything, on the earliest moment every one of them
// admits (each answers the earliest moment from the latest one asked, until
// all answer the same, or all admit at once, which on their own clocks are
// moments microseconds apart); then every slot books that moment, and only
// that moment. A slot where another request took the moment in between
// books nothing and names its next one; the slots that booked are undone
// and the agreement starts again from there. An undo is exact unless a
// request of the same key booked after it (a GCRA rule then loses the
// interval), so the slot whose GCRA interval is longest, usually a
// per-customer rule's, books last, once the others did, and is never
// undone. An agreement that takes too many rounds is a refusal with the
// wait until the latest moment asked, as is one beyond the horizon.
func (l *Limiter) reserveAcross(ctx context.Context, s *Set, gs [][]call, p params) (Decision, error) {
	const rounds, attempts = 16, 8
	var d Decision
	for attempt := 0; attempt < attempts; attempt++ {
		dry := p
		dry.op = opEarliest
		agreed := false
		var rs []reply
		for round := 0; round < rounds && !agreed; round++ {
			var err error
			if rs, err = l.run(ctx, gs, dry); err != nil {
				return Decision{}, err
			}
			if d = l.assemble(s, gs, rs, dry); !d.Allowed {
				return d, nil
			}
			agreed = together(rs)
			for _, r := range rs {
				dry.notBefore = max(dry.notBefore, r.at)
			}
		}
		p.notBefore = dry.notBefore
		if !agreed {
			break
		}
		if s.named {
			p.nonce = requestNonce(s, slices.Concat(gs...))
		}
		booked, bs, refused, err := l.bookAt(ctx, gs, lastToBook(rs), p)
		if err != nil {
			return Decision{}, err
		}
		if len(bs) == len(gs) && together(bs) {
			return l.assemble(s, gs, bs, p), nil
		}
		for _, r := range bs {
			p.notBefore = max(p.notBefore, r.at)
		}
		// The rules of groups that did not run keep their agreed state.
		dd := l.assemble(s, booked, bs, p)
		for i, st := range dd.Rules {
			if st.Name == "" {
				dd.Rules[i] = d.Rules[i]
			}
		}
		if d, err = l.undone(ctx, s, booked, bs, p, dd); err != nil || refused {
			return d, err
		}
	}
	d = d.denied()
	d.RetryAfter, d.Rule = time.Duration(p.notBefore-d.Now.UnixMicro())*time.Microsecond, ""
	return d, nil
}

// lastToBook returns the group whose GCRA interval is the longest in the
// replies rs, or -1 if no group has a GCRA rule.
func lastToBook(rs []reply) int {
	last, longest := -1, int64(0)
	for gi, r := range rs {
		for _, st := range r.rules {
			if st[5] > longest {
				last, longest = gi, st[5]
			}
		}
	}
	return last
}

// bookAt books p.notBefore on the groups gs (a reserve at, opReserveAt):
// all but group last in one parallel round trip, then, if all of those
// booked, group last. It returns the groups it ran, in gs's order, their
// replies, and whether one refused outright (rather than missing the
// moment, which replies the next one).
func (l *Limiter) bookAt(ctx context.Context, gs [][]call, last int, p params) (ran [][]call, rs []reply, refused bool, err error) {
	p.op = opReserveAt
	var first, then [][]call
	for gi, g := range gs {
		if gi == last {
			then = append(then, g)
		} else {
			first = append(first, g)
		}
	}
	for _, step := range [][][]call{first, then} {
		if len(step) == 0 {
			continue
		}
		got, err := l.run(ctx, step, p)
		if err != nil {
			return nil, nil, false, err
		}
		ran, rs = append(ran, step...), append(rs, got...)
		missed := false
		for _, r := range got {
			// A miss replies the moment found; a refusal its now.
			missed = missed || r.status != stAdmitted
			refused = refused || r.status != stAdmitted && r.at <= r.now
		}
		if missed {
			return ran, rs, refused, nil
		}
	}
	if last >= 0 && last < len(gs)-1 {
		// Back to gs's order: the last group ran last.
		ran, rs = gs, append(append(append([]reply{}, rs[:last]...), rs[len(rs)-1]), rs[last:len(rs)-1]...)
	}
	return ran, rs, false, nil
}

// together reports whether the groups' replies name one moment: the same,
// or each group's own present (all admit at once).
func together(rs []reply) bool {
	same, now := true, true
	for _, r := range rs {
		same = same && r.at == rs[0].at
		now = now && r.at <= r.now
	}
	return same || now
}

// undo refunds, in one parallel round trip, the groups whose reply
// admitted, and returns them with their replies.
func (l *Limiter) undo(ctx context.Context, gs [][]call, rs []reply, p params) ([][]call, []reply, error) {
	rules := 0
	for _, g := range gs {
		rules += len(g)
	}
	p.op, p.ats, p.undo = opRefund, make([]int64, rules), make([][2]int64, rules)
	var charged [][]call
	for i, g := range gs {
		if rs[i].status != stAdmitted {
			continue
		}
		charged = append(charged, g)
		for j, c := range g {
			p.ats[c.i], p.undo[c.i] = rs[i].at, [2]int64{rs[i].rules[j][3], rs[i].rules[j][4]}
		}
	}
	if len(charged) == 0 {
		return nil, nil, nil
	}
	undone, err := l.run(ctx, charged, p)
	if err != nil {
		return nil, nil, err
	}
	return charged, undone, nil
}
