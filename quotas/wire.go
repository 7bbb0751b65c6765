package quotas

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/limits"
)

// explicitTTLFloor: see gcra; keys written on an explicit clock live at least
// this long by the server's clock.
const explicitTTLFloor = time.Hour

// tickMargin widens the range of calendar ticks sent with a request around
// the expected server time, so that moderate clock skew costs nothing.
const tickMargin = 10 * time.Minute

// maxTicks bounds the calendar ticks sent with one request.
const maxTicks = 64

// call is one rule bound to its entity.
type call struct {
	i    int
	key  string // entity
	keys []string
	tag  string
	flow string // a fair rule's flow, encoded
	// weight is a fair rule's flow's weight (Request.Weights), at least 1.
	weight int64
	// before is, at a fair concurrency rule with priorities, how long the
	// request has waited already (Request.Waited), µs.
	before int64
	// em is a GCRA rule's emission interval: the rule's, or for an
	// Adaptive rule the learned one, set by a Model when it loads it.
	em int64
	// digest names the request's global rules when the set has a fair
	// rule (see digest); the same in every call of a request.
	digest string
	// n is the units the rule is charged (Request.Costs, else Cost, at
	// least 1; for an operation on a charge, what it charged).
	n int64
	c *compiled
}

func (l *Limiter) bind(s *Set, r Request, needHolder bool) ([]call, error) {
	if s == nil {
		return nil, errors.New("quotas: nil Set")
	}
	if r.Keys != nil && len(r.Keys) != len(s.rules) {
		return nil, fmt.Errorf("quotas: Request.Keys has %d keys for %d rules", len(r.Keys), len(s.rules))
	}
	if r.Cost < 0 {
		return nil, fmt.Errorf("quotas: Request.Cost must not be negative, got %d", r.Cost)
	}
	if r.Fair != nil && len(r.Fair) != len(s.rules) {
		return nil, fmt.Errorf("quotas: Request.Fair has %d flows for %d rules", len(r.Fair), len(s.rules))
	}
	if r.Weights != nil && len(r.Weights) != len(s.rules) {
		return nil, fmt.Errorf("quotas: Request.Weights has %d weights for %d rules", len(r.Weights), len(s.rules))
	}
	for _, w := range r.Weights {
		if w < 0 || w > limits.MaxWeight {
			return nil, fmt.Errorf("quotas: Request.Weights must be between 0 and %d, got %d", limits.MaxWeight, w)
		}
	}
	if r.Waited < 0 {
		return nil, fmt.Errorf("quotas: Request.Waited must not be negative, got %v", r.Waited)
	}
	if r.Priorities != nil && len(r.Priorities) != len(s.rules) {
		return nil, fmt.Errorf("quotas: Request.Priorities has %d priorities for %d rules", len(r.Priorities), len(s.rules))
	}
	for _, p := range r.Priorities {
		if p < 0 || p > limits.MaxPriority {
			return nil, fmt.Errorf("quotas: Request.Priorities must be between 0 and %d, got %d", limits.MaxPriority, p)
		}
	}
	if r.Costs != nil && len(r.Costs) != len(s.rules) {
		return nil, fmt.Errorf("quotas: Request.Costs has %d costs for %d rules", len(r.Costs), len(s.rules))
	}
	for _, n := range r.Costs {
		if n < 0 {
			return nil, fmt.Errorf("quotas: Request.Costs must not be negative, got %d", n)
		}
	}
	// Every key is PREFIX "q:{" TAG "}:" NAME ":" KIND...: the kind (and a
	// GCRA's interval and burst, a window's length) keeps rules of the same
	// name but other definitions apart. They are cut from one string, one
	// allocation for them all.
	calls := make([]call, len(s.rules))
	size := 0
	for i := range s.rules {
		c := call{i: i, tag: keys.Global, c: &s.comp[i], em: s.comp[i].em, n: int64(max(r.Cost, 1))}
		if r.Costs != nil && r.Costs[i] > 0 {
			c.n = int64(r.Costs[i])
		}
		if r.Keys != nil {
			c.key = r.Keys[i]
		}
		switch {
		case c.key == "":
		case i > 0 && r.Keys[i-1] == c.key:
			c.tag = calls[i-1].tag
		default:
			c.tag = keys.Encode(c.key)
		}
		if c.c.fair || c.c.cfair {
			// Request.Fair nil: every fair rule's flow is "".
			f := ""
			if r.Fair != nil {
				f = r.Fair[i]
			}
			c.flow = keys.Encode(f)
			// A level other than the default is a flow of its own,
			// named by the level after '!' (which encoded flows lack);
			// the script reads the level from there (booked.lua).
			if p := priority(r, i); c.c.aging > 0 && p != limits.DefaultPriority {
				c.flow += "!" + strconv.Itoa(p)
			}
		}
		if c.c.cfair && c.c.aging > 0 {
			c.before = r.Waited.Microseconds()
		}
		c.weight = 1
		if r.Weights != nil && r.Weights[i] > 0 {
			c.weight = int64(r.Weights[i])
		}
		if c.c.kind == kindConcurrency && r.Holder == "" && needHolder {
			return nil, fmt.Errorf("quotas: rule %q is a concurrency rule: Request.Holder is required", s.rules[i].Name)
		}
		for _, t := range c.c.tails {
			size += len(l.prefix) + len(c.tag) + 2 + len(t)
		}
		calls[i] = c
	}
	var b strings.Builder
	b.Grow(size)
	for i := range calls {
		for _, t := range calls[i].c.tails {
			b.WriteString(l.prefix)
			b.WriteByte('{')
			b.WriteString(calls[i].tag)
			b.WriteByte('}')
			b.WriteString(t)
		}
	}
	all, at := b.String(), 0
	ks := make([]string, 0, len(calls)+1)
	for i := range calls {
		start := len(ks)
		for _, t := range calls[i].c.tails {
			n := len(l.prefix) + len(calls[i].tag) + 2 + len(t)
			ks = append(ks, all[at:at+n])
			at += n
		}
		calls[i].keys = ks[start:len(ks):len(ks)]
	}
	if s.fair {
		d := digest(s, calls)
		for i := range calls {
			calls[i].digest = d
		}
	}
	return calls, nil
}

// prevNow is the "now" argument of an opAllowAfter request: the previous
// request's (the script does not read TIME for it).
var prevNow any = int64(-2)

// timing is what every script call of one request shares.
type timing struct {
	now   int64 // explicit now, or -1
	floor int64
	hint  time.Time // expected server time, to place calendar ticks
}

func (l *Limiter) timing() (timing, error) {
	if l.now != nil {
		t := l.now()
		us, err := micros(t)
		if err != nil {
			return timing{}, err
		}
		return timing{now: us, floor: explicitTTLFloor.Milliseconds(), hint: t}, nil
	}
	// Only a hint for which calendar ticks to send: the script checks them
	// against the server's TIME and asks again if they miss.
	return timing{now: -1, hint: l.skew.Server(time.Now())}, nil
}

// micros returns an explicit time in Unix microseconds, the scripts' unit,
// or an error outside the range their arithmetic is exact in.
func micros(t time.Time) (int64, error) {
	us := t.UnixMicro()
	if us < 0 || us >= 1<<51 {
		return 0, fmt.Errorf("quotas: time %s is outside 1970..2041", t.Format(time.RFC3339Nano))
	}
	return us, nil
}

// params is one request's script parameters.
type params struct {
	op      int
	req     Request
	n       int
	horizon time.Duration
	nonce   string
	// notBefore: reserve no earlier (µs, 0: now).
	notBefore int64
	// Refund: per rule index, the time its group charged at and its undo
	// values.
	ats  []int64
	undo [][2]int64
	// Held, refund, settle: when the charge was decided; block: when the
	// call throttled was (µs, 0: unknown).
	decided int64
	// Settle: per rule index, the actual cost.
	acts []int
}

// args builds one group's script keys and arguments, as a script call of
// one request. The rules' parameters are argv[specAt:end].
func (l *Limiter) args(g []call, p params, tm timing) (ks []string, argv []any, end int) {
	at := p.notBefore
	if p.op == opRefund || p.op == opHeld || p.op == opSettle {
		at = p.ats[g[0].i]
	}
	var now any = minusOne
	if tm.now >= 0 {
		now = tm.now
	}
	nk, na := 0, argRules
	for _, c := range g {
		nk += len(c.keys)
		na += len(c.c.args) + 3
	}
	ks = make([]string, 0, nk)
	argv = make([]any, 0, na+1)
	// One request: the script's request count, then the request.
	horizon := p.horizon.Microseconds()
	if p.op == opHeld || p.op == opRefund || p.op == opSettle || p.op == opBlock {
		horizon = p.decided
	}
	argv = argv[:argRules+1]
	argv[0] = 1
	argv[argOp], argv[argNow], argv[argFloor], argv[argCost], argv[argHorizon] = p.op, now, tm.floor, groupCost(g, p.n), horizon
	argv[argHolder], argv[argCritical], argv[argNonce], argv[argAt], argv[argRules] = holderField(p.req.Holder), b2i(p.req.Critical), p.nonce, at, len(g)
	for _, c := range g {
		ks = append(ks, c.keys...)
		if c.c.kind == kindCalendar {
			// A refund needs the window it charged, as does a settle to
			// less; a settle to more the window of now; the rest the
			// windows from now to the horizon.
			around := tm.hint
			if p.op == opRefund || p.op == opSettle && int64(p.acts[c.i]) < c.n {
				around = time.UnixMicro(at)
			}
			argv = append(argv, c.c.ticks.args(c.c, around.Add(-tickMargin), around.Add(p.horizon+tickMargin))...)
		} else {
			argv = append(argv, c.c.args...)
		}
	}
	end = len(argv)
	if p.op == opRefund || p.op == opHeld || p.op == opSettle {
		for _, c := range g {
			argv = append(argv, p.undo[c.i][0], p.undo[c.i][1])
		}
	}
	fair := false
	for _, c := range g {
		if c.c.fair || c.c.cfair {
			argv = append(argv, c.flow, c.weight)
			if c.c.cfair && c.c.aging > 0 {
				argv = append(argv, c.before)
			}
			fair = fair || c.c.fair
		}
	}
	if fair {
		own := make([]byte, len(g))
		for i, c := range g {
			own[i] = '0'
			if c.key != "" && !c.c.fair {
				own[i] = '1'
			}
		}
		argv = append(argv, g[0].digest, string(own))
	}
	if p.op == opSettle {
		var b strings.Builder
		for i, c := range g {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(p.acts[c.i]))
		}
		argv = append(argv, b.String())
	}
	return ks, argv, end
}

// groupCost is the cost argument of a script call on the calls g: the
// calls' cost when they agree (n if g is empty), else each call's joined
// by commas.
func groupCost(g []call, n int) any {
	same := true
	for _, c := range g {
		same = same && c.n == g[0].n
	}
	if len(g) == 0 {
		return n
	}
	if same {
		return g[0].n
	}
	var b strings.Builder
	for i, c := range g {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(c.n, 10))
	}
	return b.String()
}

// digest names the rules a request of a set with a fair rule shares with
// every other request whose booking of that rule it may take over: the
// fair rule and the rules on their global key, with their limits and the
// request's cost on each (when not 1). A
// request takes over only the bookings of requests with the same digest,
// and inherits their charges on exactly those rules.
func digest(s *Set, calls []call) string {
	h := sha256.New()
	for _, c := range calls {
		if c.key == "" || c.c.fair {
			fmt.Fprintf(h, "%q %q %v %q;", s.rules[c.i].Name, s.rules[c.i].Limit, c.c.fair, c.key)
			if c.n != 1 {
				// Take-over and inheritance only between requests that
				// charge the shared rules alike.
				fmt.Fprintf(h, "n%d;", c.n)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// specAt is where the rules' parameters start in args' argv: the number
// of rules, then their kinds and parameters.
const specAt = argRules

// minusOne is the boxed "no explicit time" argument.
var minusOne any = int64(-1)

// tickCache keeps the last calendar ticks sent for a rule, as script
// arguments, while they still cover the windows a request needs.
type tickCache struct {
	mu     sync.Mutex
	lo, hi time.Time // the first and last tick
	argv   []any
}

func (tc *tickCache) args(c *compiled, from, to time.Time) []any {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.argv != nil && !from.Before(tc.lo) && to.Before(tc.hi) {
		return tc.argv
	}
	// Cover two days more than asked, within maxTicks.
	ticks := c.sched.Ticks(from, to.Add(48*time.Hour), maxTicks)
	argv := make([]any, 0, 3+len(ticks))
	argv = append(argv, kindCalendar, c.limit, len(ticks))
	for _, t := range ticks {
		argv = append(argv, t.UnixMicro())
	}
	tc.lo, tc.hi, tc.argv = ticks[0], ticks[len(ticks)-1], argv
	return argv
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reply is one script call's parsed answer.
type reply struct {
	status, wait, rule, now, at int64
	rules                       [][replyRule]int64 // used, remaining, reset, u1, u2, em
}

// parseReply reads one request's reply: v holds int64s.
func parseReply(v []any, n int) (reply, error) {
	bad := func() (reply, error) { return reply{}, fmt.Errorf("quotas: unexpected script reply %v", v) }
	if len(v) != replyHead && len(v) != replyHead+replyRule*n {
		return bad()
	}
	var x [replyHead]int64
	for i := range replyHead {
		var ok bool
		if x[i], ok = v[i].(int64); !ok {
			return bad()
		}
	}
	r := reply{status: x[0], wait: x[1], rule: x[2], now: x[3], at: x[4]}
	if len(v) == replyHead {
		// A calendar miss (stNoTicks) or a held reply: no rule states.
		return r, nil
	}
	r.rules = make([][replyRule]int64, n)
	for i := range n {
		for k := range replyRule {
			var ok bool
			if r.rules[i][k], ok = v[replyHead+replyRule*i+k].(int64); !ok {
				return bad()
			}
		}
	}
	return r, nil
}

// run evaluates every group in one parallel round trip. When a calendar
// rule's ticks missed the server's clock it learns the skew and runs again.
func (l *Limiter) run(ctx context.Context, gs [][]call, p params) ([]reply, error) {
	for attempt := 0; ; attempt++ {
		tm, err := l.timing()
		if err != nil {
			return nil, err
		}
		vs := make([][]any, len(gs))
		if !l.sharded {
			ks, argv, end := l.args(gs[0], p, tm)
			if vs[0], err = l.batch.Do(ctx, ks, argv, end); err != nil {
				return nil, err
			}
		} else if vs, err = l.pipelined(ctx, gs, p, tm); err != nil {
			return nil, err
		}
		replies := make([]reply, len(gs))
		retry := false
		for i, v := range vs {
			if replies[i], err = parseReply(v, len(gs[i])); err != nil {
				return nil, err
			}
			if l.now == nil {
				l.skew.Learn(time.UnixMicro(replies[i].now), time.Now())
			}
			retry = retry || replies[i].status == stNoTicks
		}
		if !retry {
			return replies, nil
		}
		if attempt > 0 {
			return nil, errors.New("quotas: calendar ticks do not cover the server's time even after correcting for clock skew")
		}
	}
}

// nonceBase starts this process's nonces: random, so that processes never
// share one; a counter makes them unique within the process.
var (
	nonceBase = func() string {
		var b [9]byte
		_, _ = rand.Read(b[:])
		return base64.RawURLEncoding.EncodeToString(b[:])
	}()
	nonceSeq atomic.Uint64
)

// newNonce names one request's GCRA bookings and sliding-window entries.
func newNonce() string {
	return nonceBase + strconv.FormatUint(nonceSeq.Add(1), 36) + ":"
}

// priority is r's priority at rule i: 1 to limits.MaxPriority.
func priority(r Request, i int) int {
	if r.Priorities == nil || r.Priorities[i] == 0 {
		return limits.DefaultPriority
	}
	return r.Priorities[i]
}

// requestNonce is a request's nonce: newNonce, followed, for a set with a
// fair rule, by the request's flow at the first (an encoded flow has no
// ':'), so that a booking taken over names its owner's flow (booked.lua,
// gc_charge).
func requestNonce(s *Set, calls []call) string {
	n := newNonce()
	if s.fair {
		for _, c := range calls {
			if c.c.fair {
				return n + strconv.FormatInt(c.weight, 10) + ":" + c.flow
			}
		}
	}
	return n
}

// assemble merges the groups' replies into one Decision. Now is the time of
// the group deciding the first rule.
func (l *Limiter) assemble(s *Set, gs [][]call, rs []reply, p params) Decision {
	d := Decision{Allowed: true, Rules: make([]RuleStatus, len(s.rules)), nonce: p.nonce, cost: p.n,
		ats: make([]int64, len(s.rules)), undo: make([][2]int64, len(s.rules))}
	worst := len(s.rules)
	for gi, g := range gs {
		r := rs[gi]
		if gi == 0 {
			d.Now = time.UnixMicro(r.now)
		}
		if r.status != stAdmitted {
			d.Allowed = false
			w := time.Duration(r.wait) * time.Microsecond
			if r.wait < 0 {
				w = Never
			}
			// The longest wait; Never above all; ties to the earlier rule.
			i := g[r.rule-1].i
			if d.Rule == "" || d.RetryAfter != Never && (w == Never || w > d.RetryAfter) || w == d.RetryAfter && i < worst {
				d.RetryAfter, d.Rule, worst = w, s.rules[i].Name, i
			}
		} else {
			d.Delay = max(d.Delay, time.Duration(r.wait)*time.Microsecond)
		}
		for j, c := range g {
			st := r.rules[j]
			if p.n > 0 && c.n != int64(p.n) {
				if d.costs == nil {
					d.costs = make([]int, len(s.rules))
					for i := range d.costs {
						d.costs[i] = p.n
					}
				}
				d.costs[c.i] = int(c.n)
			}
			d.ats[c.i], d.undo[c.i] = r.at, [2]int64{st[3], st[4]}
			d.Rules[c.i] = status(s, c, st)
			if c.c.kind == kindConcurrency && st[3] > 0 {
				ls := Lease{Rule: s.rules[c.i].Name, Key: c.key, Holder: p.req.Holder, Token: st[3], Duration: time.Duration(c.c.lease) * time.Microsecond, zkey: c.keys[0], hkey: c.keys[1]}
				if c.c.cfair {
					ls.wkey, ls.ekey = c.keys[2], c.keys[3]
				}
				if c.c.amin > 0 {
					ls.lkey, ls.amin, ls.amax = c.keys[2], c.c.amin, c.c.max
				}
				d.Leases = append(d.Leases, ls)
			}
		}
	}
	if !d.Allowed {
		d = d.denied()
	}
	return d
}

// status is rule c's status from its reply fields st; the last is a GCRA
// rule's interval, an adaptive concurrency rule's learned slots, or
// whether a fair concurrency rule that refused gives the request's flow
// the next slot (1) or serves another waiting flow first (2).
func status(s *Set, c call, st [replyRule]int64) RuleStatus {
	rs := RuleStatus{Name: s.rules[c.i].Name, Key: c.key, Used: int(st[0]), Remaining: int(st[1]), ResetAfter: time.Duration(st[2]) * time.Microsecond}
	switch {
	case c.c.amin > 0:
		rs.Slots = int(st[5])
	case c.c.kind == kindConcurrency:
		rs.Next, rs.Behind = st[5] == 1, st[5] == 2
	default:
		rs.Interval = time.Duration(st[5]) * time.Microsecond
	}
	return rs
}

// holderField is how holder h is named in a concurrency rule's keys. The
// tokens hash keeps its bookkeeping in fields that start with '~' ("~seq",
// "~exp"); a holder that starts with '~' gets one more, so that no holder
// names a bookkeeping field and distinct holders stay distinct.
func holderField(h string) string {
	if strings.HasPrefix(h, "~") {
		return "~" + h
	}
	return h
}
