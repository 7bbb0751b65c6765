package quotas

import (
	"sort"
	"time"
)

// model is the reference the Lua rule-set script is tested against: the same
// decisions, computed in Go over in-memory state, on explicit times. Calendar
// windows come straight from the schedule, not from ticks.
type model struct {
	tats    map[string]int64
	wins    map[string]map[int64]int64
	logs    map[string][]logEntry
	holders map[string]map[string]int64 // key -> holder -> lease expiry
	tokens  map[string]map[string]int64
	seq     map[string]int64
}

type logEntry struct {
	at int64
	id string
}

func newModel() *model {
	return &model{tats: map[string]int64{}, wins: map[string]map[int64]int64{}, logs: map[string][]logEntry{},
		holders: map[string]map[string]int64{}, tokens: map[string]map[string]int64{}, seq: map[string]int64{}}
}

func (m *model) window(c call, t int64) (int64, int64) {
	if c.c.kind == kindFixed {
		s := t - t%c.c.every
		return s, s + c.c.every
	}
	s, e := c.c.sched.Window(time.UnixMicro(t))
	return s.UnixMicro(), e.UnixMicro()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func (m *model) earliest(c call, t, n int64, holder string, critical bool) int64 {
	k := c.keys[0]
	switch c.c.kind {
	case kindGCRA:
		if n > c.c.burst {
			return -1
		}
		tat := max(m.tats[k], t)
		return max(t, tat+n*c.c.em-c.c.burst*c.c.em)
	case kindFixed, kindCalendar:
		if n > c.c.limit {
			return -1
		}
		for i := 0; i < 64; i++ {
			s, e := m.window(c, t)
			if m.wins[k][s]+n <= c.c.limit {
				return t
			}
			t = e
		}
		return t
	case kindSliding:
		if n > c.c.limit {
			return -1
		}
		log := m.logs[k]
		var newer int64
		for _, e := range log {
			if e.at > t-c.c.every {
				newer++
			}
		}
		if newer+n <= c.c.limit {
			return t
		}
		idx := int64(len(log)) - (c.c.limit - n) - 1
		return max(t, log[idx].at+c.c.every)
	}
	capacity := c.c.max
	if !critical {
		capacity -= c.c.reserved
	}
	hs := m.holders[k]
	if _, ok := hs[holder]; ok || int64(len(hs)) < capacity {
		return t
	}
	first := int64(1) << 62
	for _, e := range hs {
		first = min(first, e)
	}
	return first
}

func (m *model) status(c call, now int64) (used, rem, reset int64) {
	k := c.keys[0]
	switch c.c.kind {
	case kindGCRA:
		tat := max(m.tats[k], now)
		left := max(0, floorDiv(c.c.burst*c.c.em-(tat-now), c.c.em))
		return c.c.burst - left, left, tat - now
	case kindFixed, kindCalendar:
		s, e := m.window(c, now)
		used = m.wins[k][s]
		return used, max(0, c.c.limit-used), e - now
	case kindSliding:
		log := m.logs[k]
		used = int64(len(log))
		if len(log) > 0 {
			reset = max(0, log[0].at+c.c.every-now)
		}
		return used, max(0, c.c.limit-used), reset
	}
	hs := m.holders[k]
	if len(hs) > 0 {
		first := int64(1) << 62
		for _, e := range hs {
			first = min(first, e)
		}
		reset = first - now
	}
	return int64(len(hs)), max(0, c.c.max-int64(len(hs))), reset
}

func (m *model) housekeep(calls []call, now int64) {
	for _, c := range calls {
		k := c.keys[0]
		switch c.c.kind {
		case kindConcurrency:
			for h, e := range m.holders[k] {
				if e <= now {
					delete(m.holders[k], h)
					delete(m.tokens[k], h)
				}
			}
		case kindSliding:
			log := m.logs[k][:0]
			for _, e := range m.logs[k] {
				if e.at > now-c.c.every {
					log = append(log, e)
				}
			}
			m.logs[k] = log
		}
	}
}

// decide mirrors quotas.lua for one group of calls: op allow, reserve or
// status. It returns the reply the script would give.
func (m *model) decide(calls []call, op int, now, n, horizon, notBefore int64, holder string, critical bool, nonce string) reply {
	m.housekeep(calls, now)
	out := func(st, wait, rule, t int64, undo map[int][2]int64) reply {
		r := reply{status: st, wait: wait, rule: rule, now: now, at: t}
		for j, c := range calls {
			u, rem, reset := m.status(c, now)
			r.rules = append(r.rules, [5]int64{u, rem, reset, undo[j][0], undo[j][1]})
		}
		return r
	}
	if op == opStatus {
		return out(1, 0, 0, now, nil)
	}
	t, wait, worst, agreed := now, int64(0), int64(0), false
	if op == opReserve {
		t = max(now, notBefore)
	}
	for iter := 0; iter < 16; iter++ {
		nt := t
		for i, c := range calls {
			if op == opReserve && c.c.kind == kindConcurrency {
				continue
			}
			e := m.earliest(c, t, n, holder, critical)
			if e < 0 {
				return out(0, -1, int64(i+1), now, nil)
			}
			if op == opAllow {
				if e-now > wait {
					wait, worst = e-now, int64(i+1)
				}
			} else if e > nt {
				nt, worst = e, int64(i+1)
			}
		}
		if op == opAllow || nt == t {
			agreed = true
			break
		}
		t = nt
	}
	if op == opAllow && worst > 0 {
		return out(0, wait, worst, now, nil)
	}
	if op == opReserve && (!agreed || t-now > horizon) {
		return out(0, t-now, worst, now, nil)
	}
	if op == opReserve {
		// Never across the reset of a full window longer than the horizon.
		from := max(now, notBefore)
		for i, c := range calls {
			if c.c.kind != kindFixed && c.c.kind != kindCalendar {
				continue
			}
			start, stop := m.window(c, from)
			if t >= stop && stop-start > horizon && m.earliest(c, from, n, holder, critical) >= stop {
				return out(0, t-now, int64(i+1), now, nil)
			}
		}
	}
	undo := map[int][2]int64{}
	for j, c := range calls {
		k := c.keys[0]
		switch c.c.kind {
		case kindGCRA:
			prev := m.tats[k]
			m.tats[k] = max(prev, t) + n*c.c.em
			undo[j] = [2]int64{m.tats[k], prev}
		case kindFixed, kindCalendar:
			s, _ := m.window(c, t)
			if m.wins[k] == nil {
				m.wins[k] = map[int64]int64{}
			}
			m.wins[k][s] += n
			if m.wins[k][s] == n { // a new window: forget ended ones
				cur, _ := m.window(c, now)
				for ws := range m.wins[k] {
					if ws < cur {
						delete(m.wins[k], ws)
					}
				}
			}
		case kindSliding:
			for i := int64(1); i <= n; i++ {
				m.logs[k] = append(m.logs[k], logEntry{at: t, id: nonce})
			}
			sort.SliceStable(m.logs[k], func(a, b int) bool { return m.logs[k][a].at < m.logs[k][b].at })
		case kindConcurrency:
			if op != opAllow {
				continue
			}
			if m.holders[k] == nil {
				m.holders[k], m.tokens[k] = map[string]int64{}, map[string]int64{}
			}
			m.holders[k][holder] = now + c.c.lease
			m.seq[k] = max(m.seq[k]+1, now)
			m.tokens[k][holder] = m.seq[k]
			undo[j] = [2]int64{m.seq[k], 0}
		}
	}
	return out(1, t-now, 0, t, undo)
}

// refund mirrors quotas.lua's refund of a charge made at ats[rule].
func (m *model) refund(calls []call, now, n int64, ats []int64, undo [][2]int64, holder, nonce string) {
	m.housekeep(calls, now)
	for _, c := range calls {
		k, t, u := c.keys[0], ats[c.i], undo[c.i]
		switch c.c.kind {
		case kindGCRA:
			tat := u[1]
			if m.tats[k] != u[0] {
				if tat = max(m.tats[k], now); tat <= now+c.c.em*c.c.burst {
					tat -= max(0, n*c.c.em-(now-t))
				}
			}
			if tat <= now {
				delete(m.tats, k)
			} else {
				m.tats[k] = tat
			}
		case kindFixed, kindCalendar:
			s, _ := m.window(c, t)
			if m.wins[k][s] <= n {
				delete(m.wins[k], s)
			} else {
				m.wins[k][s] -= n
			}
		case kindSliding:
			log := m.logs[k][:0]
			removed := int64(0)
			for _, e := range m.logs[k] {
				if e.id == nonce && removed < n {
					removed++
					continue
				}
				log = append(log, e)
			}
			m.logs[k] = log
		case kindConcurrency:
			m.release(k, holder, u[0])
		}
	}
}

// block mirrors quotas.lua's block op.
func (m *model) block(calls []call, now, until int64) {
	m.housekeep(calls, now)
	for _, c := range calls {
		if c.c.kind == kindGCRA {
			k := c.keys[0]
			cur := m.tats[k]
			if cur == 0 {
				cur = now
			}
			if tat := max(cur, until+c.c.em*(c.c.burst-1)); tat > now {
				m.tats[k] = tat
			}
		}
	}
}

func (m *model) release(k, holder string, token int64) bool {
	if token == 0 || m.tokens[k][holder] != token {
		return false
	}
	delete(m.holders[k], holder)
	delete(m.tokens[k], holder)
	return true
}

func (m *model) renew(k, holder string, token, lease, now int64) bool {
	if m.tokens[k][holder] != token {
		return false
	}
	if e, ok := m.holders[k][holder]; !ok || e <= now {
		return false
	}
	m.holders[k][holder] = now + lease
	return true
}
