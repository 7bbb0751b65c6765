package quotas

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/batch"
	"github.com/taskrl/taskrl/internal/clock"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/internal/script"
)

var (
	//go:embed quotas.lua
	setLua string
	// setProgram decides rule sets; Redis runs it as a function where it
	// can (script.Program): its library is large.
	setProgram = script.NewProgram(setLua, "gcra", "booked", "rules", "learn")
	//go:embed lease.lua
	leaseLua    string
	leaseScript = script.New(leaseLua, "gcra", "rules")
)

// Never is the RetryAfter of a request that no wait can admit: its cost
// exceeds a rule's burst or limit.
const Never = gcra.Never

// explicitTTLFloor: see gcra; keys written on an explicit clock live at least
// this long by the server's clock.
const explicitTTLFloor = time.Hour

// tickMargin widens the range of calendar ticks sent with a request around
// the expected server time, so that moderate clock skew costs nothing.
const tickMargin = 10 * time.Minute

// maxTicks bounds the calendar ticks sent with one request.
const maxTicks = 64

// Config configures a Limiter.
type Config struct {
	// Client is the Redis connection: a *redis.Client, *redis.ClusterClient
	// or *redis.Ring. Required.
	Client redis.UniversalClient
	// Prefix starts every key. Default "taskrl:". At most 64 printable ASCII
	// bytes without spaces, '{' or '}'.
	Prefix string
	// Now, when set, supplies the time of every decision instead of the
	// Redis server's TIME: for tests and simulations only.
	Now func() time.Time
	// MaxBatch is how many concurrent requests one script call may carry
	// on a single Redis (a *redis.Client). While a few calls are in
	// flight, requests wait and go together in the next call, one round
	// trip for all of them; each request is still decided atomically, in
	// arrival order. A lone request never waits. A Redis error (such as
	// a timeout) fails every request of the call. 0 means 32; 1 sends
	// every request in its own call. On Redis Cluster and Ring every
	// request has its own calls.
	MaxBatch int
}

// Limiter decides rule sets against Redis. A Limiter is safe for concurrent
// use.
type Limiter struct {
	client  redis.UniversalClient
	prefix  string
	now     func() time.Time
	sharded bool
	// skew centres the calendar ticks sent with a request on the server's
	// clock.
	skew  clock.Skew
	batch *batch.Batcher
	// started and pools: units taken ahead (Rule.Prefetch).
	started time.Time
	pools   pools
}

// New validates cfg and returns a Limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Client == nil {
		return nil, errors.New("quotas: Config.Client is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = gcra.DefaultPrefix
	}
	if err := keys.ValidatePrefix(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("quotas: Config.Prefix: %w", err)
	}
	switch {
	case cfg.MaxBatch < 0:
		return nil, fmt.Errorf("quotas: Config.MaxBatch must not be negative, got %d", cfg.MaxBatch)
	case cfg.MaxBatch == 0:
		cfg.MaxBatch = 32
	}
	_, single := cfg.Client.(*redis.Client)
	return &Limiter{client: cfg.Client, prefix: cfg.Prefix + keys.Rules, now: cfg.Now, sharded: !single,
		batch: batch.New(cfg.Client, setProgram, joinRequests, "quotas", cfg.MaxBatch), started: time.Now()}, nil
}

// Request says whom a decision is for.
type Request struct {
	// Keys holds, per rule of the set in order, the entity the rule limits
	// (a business id, a customer); "" means the rule's one global key. Nil
	// means every rule is global. Any bytes are allowed.
	Keys []string
	// Cost is the units charged to every rule except concurrency rules,
	// which take one slot per holder. Zero means 1.
	Cost int
	// Costs holds, per rule of the set in order, the units charged to that
	// rule, in place of Cost; 0 means Cost. Concurrency rules ignore it.
	// Nil means Cost for every rule. A cost above a GCRA rule's burst or a
	// window's limit is never admitted: the Decision is denied with
	// RetryAfter Never and Rule naming the rule.
	Costs []int
	// Holder identifies who takes concurrency slots (an asynq task id). A
	// holder that acquires again replaces its own lease, so a redelivered
	// task never holds two slots. Required when the set has a concurrency
	// rule. Any bytes are allowed.
	Holder string
	// Critical lets the request use the slots concurrency rules reserve
	// for critical work, and puts it first in line at fair rules: it may
	// take over the booking of any request that is not critical.
	Critical bool
	// Fair holds, per rule of the set in order, the flow a fair rule
	// (Rule.Fair) shares its capacity among: a business id, a customer.
	// Other rules ignore it. Nil means every fair rule's flow is "". Any
	// bytes are allowed.
	Fair []string
}

// RuleStatus is the state of one rule's key after a decision.
type RuleStatus struct {
	// Name and Key identify the rule and the entity.
	Name, Key string
	// Used and Remaining are units in the current window (windows), in the
	// bucket (GCRA: Burst−Remaining) or slots held (concurrency).
	Used, Remaining int
	// ResetAfter is the time until the window ends, the bucket is full
	// again, the oldest sliding entry leaves, or the first lease expires.
	ResetAfter time.Duration
	// Interval is, for a GCRA or Adaptive rule, the emission interval the
	// decision used: for an Adaptive rule, the learned one (the rate is
	// one unit per Interval). Zero for other kinds.
	Interval time.Duration
}

// Lease is a concurrency slot taken by an admitted request; Renew keeps it,
// Release gives it back. The zero value is not a lease.
type Lease struct {
	// Rule and Key name the concurrency rule and entity.
	Rule, Key string
	// Holder is the request's Holder; Token is the fencing token issued at
	// acquisition: only the newest acquisition of a holder can renew or
	// release.
	Holder string
	Token  int64
	// Duration is the rule's lease length.
	Duration   time.Duration
	zkey, hkey string
}

// decided is when d was decided, µs (0: unknown).
func (d Decision) decided() int64 {
	if d.Now.IsZero() {
		return 0
	}
	return d.Now.UnixMicro()
}

// Decision is the outcome of deciding a set. Denied is a result, not an
// error.
type Decision struct {
	// Allowed reports whether every rule admitted (Allow) or the request
	// was booked (Reserve); then every rule was charged, otherwise none.
	Allowed bool
	// RetryAfter, when denied, is the longest wait among the rules that
	// denied (for concurrency, when the first lease expires: a release may
	// come sooner), or Never; for a Reserve not booked, the wait until the
	// earliest moment all rules admit.
	RetryAfter time.Duration
	// Rule names the rule that set RetryAfter.
	Rule string
	// Delay is, for a booked Reserve, how long until the booked moment.
	Delay time.Duration
	// Now is the decision time: the server's TIME or the explicit clock. On
	// Redis Cluster, rules in other slots are decided by their own node's
	// clock in the same round trip; Now is the time of the first rule.
	Now time.Time
	// Rules holds each rule's state after the decision, in set order;
	// read only (decisions admitted from one prefetched batch share it).
	Rules []RuleStatus
	// Leases are the concurrency slots an Allow took.
	Leases []Lease

	pf    *prefetch  // admitted from units taken ahead (Rule.Prefetch)
	nonce string     // names this request's GCRA bookings and sliding-window entries
	cost  int        // units charged
	costs []int      // per rule, units charged, when they differ from cost; else nil
	ats   []int64    // per rule, µs its group charged at
	undo  [][2]int64 // per rule, what a refund needs to undo the charge
}

// call is one rule bound to its entity.
type call struct {
	i    int
	key  string // entity
	keys []string
	tag  string
	flow string // a fair rule's flow, encoded
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
		if c.c.fair && r.Fair != nil {
			c.flow = keys.Encode(r.Fair[i])
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

const (
	opAllow = iota
	opReserve
	opRefund
	opStatus
	opBlock
	opHeld
	opEarliest   // a reserve's moment, nothing charged (Cluster)
	opReserveAt  // a reserve of exactly p.notBefore, or nothing (Cluster)
	opAllowAfter // an allow at the previous request's now, if it was admitted then (ReserveAndAllow)
	opSettle     // a charge becomes its actual cost (Settle)
)

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
	// Held: when the charge was decided (µs, 0: unknown).
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
	nk, na := 0, 10
	for _, c := range g {
		nk += len(c.keys)
		na += len(c.c.args) + 3
	}
	ks = make([]string, 0, nk)
	argv = make([]any, 0, na+1)
	// One request: the script's request count, then the request.
	horizon := p.horizon.Microseconds()
	if p.op == opHeld || p.op == opRefund || p.op == opSettle {
		horizon = p.decided
	}
	argv = append(argv, 1, p.op, now, tm.floor, groupCost(g, p.n), horizon, holderField(p.req.Holder), b2i(p.req.Critical), p.nonce, at, len(g))
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
		if c.c.fair {
			argv = append(argv, c.flow)
			fair = true
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

// sameCosts reports whether req.Costs charges every rule req.Cost (nil,
// or each 0 or Cost).
func sameCosts(req Request) bool {
	for _, n := range req.Costs {
		if n != 0 && n != max(req.Cost, 1) {
			return false
		}
	}
	return true
}

// withCosts sets each call's cost to what decision d charged its rule.
func withCosts(calls []call, d Decision) {
	for i := range calls {
		calls[i].n = int64(d.cost)
		if d.costs != nil {
			calls[i].n = int64(d.costs[calls[i].i])
		}
	}
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

// specAt is where the rules' parameters start in args' argv: after the
// request count and nine request arguments.
const specAt = 10

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
	rules                       [][6]int64 // used, remaining, reset, u1, u2, em
}

// parseReply reads one request's reply: v holds int64s.
func parseReply(v []any, n int) (reply, error) {
	bad := func() (reply, error) { return reply{}, fmt.Errorf("quotas: unexpected script reply %v", v) }
	if len(v) < 5 || len(v) != 5 && len(v) != 5+6*n {
		return bad()
	}
	var x [5]int64
	for i := range 5 {
		var ok bool
		if x[i], ok = v[i].(int64); !ok {
			return bad()
		}
	}
	r := reply{status: x[0], wait: x[1], rule: x[2], now: x[3], at: x[4]}
	if len(v) == 5 {
		// A calendar miss (status -2) or a held reply: no rule states.
		return r, nil
	}
	if len(v) != 5+6*n {
		return bad()
	}
	r.rules = make([][6]int64, n)
	for i := range n {
		for k := range 6 {
			var ok bool
			if r.rules[i][k], ok = v[5+6*i+k].(int64); !ok {
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
			retry = retry || replies[i].status == -2
		}
		if !retry {
			return replies, nil
		}
		if attempt > 0 {
			return nil, errors.New("quotas: calendar ticks do not cover the server's time even after correcting for clock skew")
		}
	}
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

// Allow admits the request if every rule of the set admits it now, and then
// charges every rule (concurrency rules hand out a Lease each); if any rule
// denies, nothing is charged and the Decision names the rule with the
// longest wait. On a single Redis this is one script call. On Redis Cluster,
// rules whose keys live in different slots are decided by one script per
// slot, sent in one parallel round trip; if some slots admit and another
// denies, the admitted charges are undone in a second round trip, so the set
// never over-admits (a concurrent request may be denied meanwhile). When
// every rule of the set has Rule.Prefetch, Allow and Reserve admit from
// units this Limiter took ahead in a batch while it has some, without a
// call; the Decision is then as of the batch (its Rules are the batch's
// state), and Refund puts the units back while they are usable.
func (l *Limiter) Allow(ctx context.Context, s *Set, req Request) (Decision, error) {
	return l.decide(ctx, s, req, opAllow, 0)
}

// Reserve books the earliest moment, at most horizon away, at which every
// rule except concurrency rules admits the request, charging them for that
// moment only: the caller acts after Decision.Delay, and the capacity
// before the moment stays free for other requests (see GCRA). Concurrency
// is taken when the work starts (Allow), never reserved. If no such moment
// lies within the horizon, nothing is charged and RetryAfter says when it
// would be. Nor is anything booked beyond the reset of a fixed or calendar
// window longer than the horizon that is full until then (a daily quota
// spent an hour before midnight): the request would keep its slot after the
// reset even if refunds freed quota before it, so it is told to come back
// at the reset instead. RetryAfter is then the wait until the moment found,
// and Rule names the window.
func (l *Limiter) Reserve(ctx context.Context, s *Set, req Request, horizon time.Duration) (Decision, error) {
	return l.decide(ctx, s, req, opReserve, max(horizon, 0))
}

// ReserveAndAllow is Reserve of req under s and then, if that admits the
// request now (Allowed, Delay 0), Allow of slots under slotSet at the same
// moment, decided in one script call on a single Redis: the same decisions
// as the two calls made back to back, in one round trip and at one read of
// the server's clock. decided reports whether the slots were decided (sd
// is their Decision); if not (the rates did not admit now, or the call
// cannot carry both: Redis Cluster, a set with Rule.Prefetch, a calendar
// rule whose ticks missed the clock), rd is Reserve's decision alone and
// the caller calls Allow itself when it wants the slots.
func (l *Limiter) ReserveAndAllow(ctx context.Context, s *Set, req Request, horizon time.Duration, slotSet *Set, slots Request) (rd, sd Decision, decided bool, err error) {
	if l.sharded || s == nil || slotSet == nil || s.prefetch != 0 || slotSet.prefetch != 0 {
		rd, err = l.Reserve(ctx, s, req, horizon)
		return rd, Decision{}, false, err
	}
	rcalls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	scalls, err := l.bind(slotSet, slots, true)
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	tm, err := l.timing()
	if err != nil {
		return Decision{}, Decision{}, false, err
	}
	rp := params{op: opReserve, req: req, n: max(req.Cost, 1), horizon: max(horizon, 0)}
	if s.named {
		rp.nonce = newNonce()
	}
	sp := params{op: opAllowAfter, req: slots, n: max(slots.Cost, 1)}
	if slotSet.named {
		sp.nonce = newNonce()
	}
	rks, rargv, _ := l.args(rcalls, rp, tm)
	sks, sargv, _ := l.args(scalls, sp, tm)
	if tm.now < 0 {
		sargv[2] = prevNow
	}
	cmd := setProgram.Head(len(rks) + len(sks))
	for _, k := range rks {
		cmd = append(cmd, k)
	}
	for _, k := range sks {
		cmd = append(cmd, k)
	}
	cmd = append(cmd, 2)
	cmd = append(cmd, rargv[1:]...)
	cmd = append(cmd, sargv[1:]...)
	v, err := setProgram.Run(ctx, l.client, cmd).Slice()
	if err != nil {
		return Decision{}, Decision{}, false, fmt.Errorf("quotas: %w", err)
	}
	var rs [2]reply
	for i, n := range []int{len(rcalls), len(scalls)} {
		var x []any
		if len(v) == 2 {
			x, _ = v[i].([]any)
		}
		if x == nil {
			return Decision{}, Decision{}, false, fmt.Errorf("quotas: unexpected script reply %v", v)
		}
		if rs[i], err = parseReply(x, n); err != nil {
			return Decision{}, Decision{}, false, err
		}
	}
	if rs[0].status == -2 {
		// Calendar ticks around the wrong time: nothing was charged.
		rd, err = l.Reserve(ctx, s, req, horizon)
		return rd, Decision{}, false, err
	}
	if l.now == nil {
		l.skew.Learn(time.UnixMicro(rs[0].now), time.Now())
	}
	rd = l.assemble(s, [][]call{rcalls}, rs[:1], rp)
	if rs[1].status == -3 || rs[1].status == -2 {
		// Not decided: the rates did not admit now (or, -2, the slots'
		// calendar ticks missed; nothing charged).
		return rd, Decision{}, false, nil
	}
	sp.op = opAllow
	return rd, l.assemble(slotSet, [][]call{scalls}, rs[1:], sp), true, nil
}

// Status reports every rule's state without charging anything. Allowed is
// true.
func (l *Limiter) Status(ctx context.Context, s *Set, req Request) (Decision, error) {
	calls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, err
	}
	gs := l.groups(calls)
	rs, err := l.run(ctx, gs, params{op: opStatus, req: req})
	if err != nil {
		return Decision{}, err
	}
	return l.assemble(s, gs, rs, params{req: req}), nil
}

func (l *Limiter) decide(ctx context.Context, s *Set, req Request, op int, horizon time.Duration) (Decision, error) {
	if s == nil || s.prefetch == 0 || !sameCosts(req) {
		// Per-rule costs that differ are decided one by one, without a
		// pool.
		return l.decideNow(ctx, s, req, op, horizon)
	}
	d, p, err := l.prefetched(ctx, s, req)
	if err != nil || d.Allowed {
		return d, err
	}
	d, err = l.decideNow(ctx, s, req, op, horizon)
	if err == nil && p != nil {
		l.resume(p, d)
	}
	return d, err
}

// decideNow is decide without prefetched units.
func (l *Limiter) decideNow(ctx context.Context, s *Set, req Request, op int, horizon time.Duration) (Decision, error) {
	calls, err := l.bind(s, req, op == opAllow)
	if err != nil {
		return Decision{}, err
	}
	p := params{op: op, req: req, n: max(req.Cost, 1), horizon: horizon}
	gs := l.groups(calls)
	if op == opReserve && len(gs) > 1 {
		return l.reserveAcross(ctx, s, gs, p)
	}
	if s.named {
		p.nonce = newNonce()
	}
	rs, err := l.run(ctx, gs, p)
	if err != nil {
		return Decision{}, err
	}
	d := l.assemble(s, gs, rs, p)
	if len(gs) == 1 || d.Allowed {
		return d, nil
	}
	// Undo what some slots charged, and report the state after that.
	return l.undone(ctx, s, gs, rs, p, d)
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
			p.nonce = newNonce()
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
			missed = missed || r.status != 1
			refused = refused || r.status != 1 && r.at <= r.now
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
		if r.status != 1 {
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
				d.Leases = append(d.Leases, Lease{Rule: s.rules[c.i].Name, Key: c.key, Holder: p.req.Holder, Token: st[3], Duration: time.Duration(c.c.lease) * time.Microsecond, zkey: c.keys[0], hkey: c.keys[1]})
			}
		}
	}
	if !d.Allowed {
		d = d.denied()
	}
	return d
}

func status(s *Set, c call, st [6]int64) RuleStatus {
	return RuleStatus{Name: s.rules[c.i].Name, Key: c.key, Used: int(st[0]), Remaining: int(st[1]), ResetAfter: time.Duration(st[2]) * time.Microsecond,
		Interval: time.Duration(st[5]) * time.Microsecond}
}

// denied clears what only an admitted decision carries.
func (d Decision) denied() Decision {
	d.Allowed, d.Delay, d.Leases = false, 0, nil
	return d
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
		if rs[i].status != 1 {
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

// Refund undoes the charges of an admitted or booked Decision d made for
// req: GCRA rules get the cost back (exactly, if nothing was charged since;
// otherwise less the time since, as the bucket may have refilled), windows
// un-count it in the window it was charged to, sliding windows drop its
// entries and its leases are released. Use it when an admitted request did
// not happen. Refunding a denied decision does nothing.
func (l *Limiter) Refund(ctx context.Context, s *Set, req Request, d Decision) error {
	if !d.Allowed {
		return nil
	}
	if d.pf != nil {
		l.unfetch(poolKey(s, req), d)
		return nil
	}
	calls, err := l.bind(s, req, true)
	if err != nil {
		return err
	}
	if len(d.ats) != len(calls) {
		return errors.New("quotas: the Decision is not from this Set")
	}
	withCosts(calls, d)
	_, err = l.run(ctx, l.groups(calls), params{op: opRefund, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided()})
	return err
}

// Settle changes the charges of an admitted or booked Decision d made for
// req to what the request actually cost: actual holds, per rule of s in
// order, the units really spent on it (0: nothing was spent); a negative
// value leaves that rule's charge as it is, as do concurrency rules. Where
// the actual cost is lower, the difference is given back as Refund would
// give back a charge of that many units: a GCRA booking of its own shrinks
// (a charge that extended the TAT moves it back, exactly if nothing was
// charged since, otherwise less the time since the charge, and never while
// later charges are booked beyond a burst ahead), a window un-counts it in
// the window it was charged to, a sliding window drops that many of the
// request's entries. Where it is higher, the difference is charged now
// without a conformance check: the units were spent, and later requests
// wait for them (a GCRA rule's TAT moves on from max(TAT, now), a window
// counts them in the window of now, a sliding window logs them now).
// Settle a Decision once, and do not Refund it afterwards: the charge it
// describes has changed. A denied Decision is not settled. A Decision
// admitted from prefetched units (Rule.Prefetch) cannot be settled (an
// error). d may come from ParseReceipt.
func (l *Limiter) Settle(ctx context.Context, s *Set, req Request, d Decision, actual []int) error {
	if !d.Allowed {
		return nil
	}
	if d.pf != nil {
		return errors.New("quotas: a Decision admitted from prefetched units cannot be settled")
	}
	calls, err := l.bind(s, req, false)
	if err != nil {
		return err
	}
	p, err := settleParams(calls, req, d, actual)
	if err != nil || p.op < 0 {
		return err
	}
	var gs [][]call
	for _, g := range l.groups(calls) {
		if slices.ContainsFunc(g, func(c call) bool { return int64(p.acts[c.i]) != c.n }) {
			gs = append(gs, g)
		}
	}
	_, err = l.run(ctx, gs, p)
	return err
}

// settleParams checks Settle's arguments and returns its params, with op
// -1 when nothing changes.
func settleParams(calls []call, req Request, d Decision, actual []int) (params, error) {
	if len(d.ats) != len(calls) {
		return params{}, errors.New("quotas: the Decision is not from this Set")
	}
	if len(actual) != len(calls) {
		return params{}, fmt.Errorf("quotas: Settle has %d actual costs for %d rules", len(actual), len(calls))
	}
	withCosts(calls, d)
	acts := make([]int, len(calls))
	change := false
	for i, c := range calls {
		acts[i] = actual[i]
		if acts[i] < 0 || c.c.kind == kindConcurrency {
			acts[i] = int(c.n)
		}
		change = change || int64(acts[i]) != c.n
	}
	if !change {
		return params{op: -1}, nil
	}
	return params{op: opSettle, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided(), acts: acts}, nil
}

// Held reports whether the booking an admitted or booked Decision d made
// for req on the set's first fair rule (Rule.Fair) is still its own: false
// once a request of a flow with less than its share took it over. A
// booking's owner asks before it runs; on false it has no slot and should
// refund d (which then gives back only its own, keyed rules: the taker
// inherited the rest) and decide again. A booking of an Adaptive rule is
// no longer held once the rule's rate was cut after d was decided, if its
// slot comes after the cut: it was booked at a rate the remote side
// refused; the owner refunds it (all of it) and decides again at the
// learned rate. With no fair or adaptive rule in the set it reports true
// without a call.
func (l *Limiter) Held(ctx context.Context, s *Set, req Request, d Decision) (bool, error) {
	if !d.Allowed || !s.fair && !s.adaptive {
		return true, nil
	}
	calls, err := l.bind(s, req, false)
	if err != nil {
		return false, err
	}
	if len(d.ats) != len(calls) {
		return false, errors.New("quotas: the Decision is not from this Set")
	}
	withCosts(calls, d)
	var gs [][]call
	for _, g := range l.groups(calls) {
		if slices.ContainsFunc(g, func(c call) bool { return c.c.fair || c.c.learn != nil }) {
			gs = append(gs, g)
		}
	}
	rs, err := l.run(ctx, gs, params{op: opHeld, req: req, n: d.cost, nonce: d.nonce, ats: d.ats, undo: d.undo, decided: d.decided()})
	if err != nil {
		return false, err
	}
	for _, r := range rs {
		if r.status != 1 {
			return false, nil
		}
	}
	return true, nil
}

// Block makes the set's rules admit nothing for the request's keys until
// the given time: use it when the remote side answered "429 Too Many
// Requests, retry after ...", so that every worker backs off together.
// GCRA rules then resume at their rate (their TAT moves); window and
// concurrency rules keep the end in a key of their own (NAME:block, which
// lives until then), read by every decision, and their counts and slots
// are left as they are. A block is never shortened by a later, shorter
// one. until is compared with the server's clock (or Config.Now).
func (l *Limiter) Block(ctx context.Context, s *Set, req Request, until time.Time) (Decision, error) {
	l.dropPools()
	calls, err := l.bind(s, req, false)
	if err != nil {
		return Decision{}, err
	}
	gs := l.groups(calls)
	rs, err := l.run(ctx, gs, params{op: opBlock, req: req, notBefore: until.UnixMicro()})
	if err != nil {
		return Decision{}, err
	}
	return l.assemble(s, gs, rs, params{req: req}), nil
}

// Renew extends lease to its Duration from now if its holder still holds
// it under its token. It reports false when the lease was lost (expired and
// reclaimed, or re-acquired by a redelivery of the same holder).
func (l *Limiter) Renew(ctx context.Context, lease Lease) (bool, error) {
	return l.lease(ctx, lease, 0)
}

// Release gives lease's slot back if its holder still holds it under its
// token; it reports whether it did.
func (l *Limiter) Release(ctx context.Context, lease Lease) (bool, error) {
	return l.lease(ctx, lease, 1)
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

func (l *Limiter) lease(ctx context.Context, ls Lease, op int) (bool, error) {
	if ls.zkey == "" {
		return false, errors.New("quotas: not a lease from a Decision")
	}
	tm, err := l.timing()
	if err != nil {
		return false, err
	}
	v, err := leaseScript.Run(ctx, l.client, []string{ls.zkey, ls.hkey}, op, tm.now, tm.floor, holderField(ls.Holder), ls.Token, ls.Duration.Microseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("quotas: %w", err)
	}
	return v == 1, nil
}
