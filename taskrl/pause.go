package taskrl

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/script"
	"github.com/taskrl/taskrl/policy"
)

// RulePause is an operator's pause of a rule, or of one key of a keyed
// rule: every worker sharing the limits' Redis and prefix holds the tasks
// it governs (they wait in their queue, under their own ID, no retry
// spent) until Until, or until ResumeRule when Until is zero; then they
// decide again and run at the rule's rate. Times are the Redis server's.
type RulePause struct {
	// Rule is the rule's name; Key the key paused, "" for the whole rule.
	Rule, Key string
	// For, given to PauseRule, is how long the pause lasts from when Redis
	// records it; 0: until ResumeRule.
	For time.Duration
	// Until is when the pause ends by itself (zero: when resumed), as
	// RulePauses reports it.
	Until time.Time
	// Reason and By say why and who, for logs and worker status.
	Reason, By string
	// At is when the pause was set, as RulePauses reports it.
	At time.Time
}

// pauseValue is a pause as stored (pauses.lua): its hash field is rule
// NUL key.
type pauseValue struct {
	Until  int64  `json:"until"` // Unix ms; 0: until resumed
	Reason string `json:"reason"`
	By     string `json:"by"`
	At     int64  `json:"at"` // Unix ms
}

// pausesKey is the hash of a prefix's pauses.
func pausesKey(prefix string) string {
	if prefix == "" {
		prefix = gcra.DefaultPrefix
	}
	return prefix + "pauses"
}

//go:embed pauses.lua
var pausesLua string

var pausesScript = script.New(pausesLua, "gcra")

// PauseRule pauses p.Rule (or its key p.Key, if not "") for p.For (0:
// until ResumeRule) for every worker using client as its limits' Redis
// (Config.LimitsClient, else Client) and prefix (Config.Prefix; "" is the
// default): they hold its tasks within about a second. A pause of the
// same rule and key replaces the one before. The pauses' hash expires a
// minute after every pause in it has ended. Safe for concurrent use.
func PauseRule(ctx context.Context, client redis.UniversalClient, prefix string, p RulePause) error {
	if p.Rule == "" || strings.ContainsRune(p.Rule, 0) || strings.ContainsRune(p.Key, 0) {
		return errors.New("taskrl: a pause needs a rule name, and neither it nor the key may hold a NUL byte")
	}
	if p.For < 0 {
		return fmt.Errorf("taskrl: a pause lasts a positive time (or 0: until resumed), got %v", p.For)
	}
	ms := p.For.Milliseconds()
	if p.For > 0 {
		ms = max(ms, 1)
	}
	return pausesScript.Run(ctx, client, []string{pausesKey(prefix)}, p.Rule+"\x00"+p.Key, "set", ms, p.Reason, p.By).Err()
}

// ResumeRule ends the pause of rule (or key of it) that PauseRule set;
// ok reports whether there was one. The tasks it held decide again within
// a few seconds (a paused task looks again every pauseRecheck) and run at
// the rule's rate. Safe for concurrent use.
func ResumeRule(ctx context.Context, client redis.UniversalClient, prefix, rule, key string) (ok bool, err error) {
	n, err := pausesScript.Run(ctx, client, []string{pausesKey(prefix)}, rule+"\x00"+key, "del", 0, "", "").Int()
	return n == 1, err
}

// RulePauses lists the pauses in force, by rule and key, at the Redis
// server's time. Safe for concurrent use.
func RulePauses(ctx context.Context, client redis.UniversalClient, prefix string) ([]RulePause, error) {
	m, err := client.HGetAll(ctx, pausesKey(prefix)).Result()
	if err != nil {
		return nil, err
	}
	now, err := client.Time(ctx).Result()
	if err != nil {
		return nil, err
	}
	return decodePauses(m, now), nil
}

// decodePauses returns the pauses of hash m in force at now, in order.
// Fields it cannot read are skipped: a pause holds nothing it cannot say.
func decodePauses(m map[string]string, now time.Time) []RulePause {
	var out []RulePause
	for f, s := range m {
		rule, key, ok := strings.Cut(f, "\x00")
		var v pauseValue
		if !ok || json.Unmarshal([]byte(s), &v) != nil {
			continue
		}
		p := RulePause{Rule: rule, Key: key, Reason: v.Reason, By: v.By, At: time.UnixMilli(v.At)}
		if v.Until != 0 {
			if p.Until = time.UnixMilli(v.Until); !p.Until.After(now) {
				continue
			}
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b RulePause) int { return strings.Compare(a.Rule+"\x00"+a.Key, b.Rule+"\x00"+b.Key) })
	return out
}

// pauseFresh is how long a worker trusts the pauses it read; a task that
// finds them older reads them again first. Only a worker with tasks reads
// them: an idle fleet makes no call for them.
const pauseFresh = 500 * time.Millisecond

// pauseRecheck is how long a task held by a pause without an end waits
// before it looks again.
const pauseRecheck = 2 * time.Second

// pauses is a Middleware's view of the pauses in force.
type pauses struct {
	m       *Middleware
	mu      sync.Mutex
	read    time.Time // when byRule was read
	reading bool      // a task is reading them
	byRule  map[string]map[string]RulePause
	seen    map[string]bool // pauses already logged, by rule NUL key NUL at
}

// held returns the pause that holds a task of binding b with keys, if one
// does; a pause of the whole rule comes first.
func (ps *pauses) held(ctx context.Context, b *policy.Binding, keys []string) (RulePause, bool) {
	if ps.m.cfg.Shadow {
		return RulePause{}, false // nothing is enforced
	}
	by := ps.current(ctx)
	if len(by) == 0 {
		return RulePause{}, false
	}
	now := ps.m.serverNow()
	on := func(p RulePause, ok bool) bool { return ok && (p.Until.IsZero() || p.Until.After(now)) }
	for i, r := range b.Rules() {
		if b.Rule(i).Shadow || b.Exempt(i) {
			continue // a shadow rule holds nothing back, nor one the key is exempt from
		}
		if ks := by[r.Name]; ks != nil {
			if p, ok := ks[""]; on(p, ok) {
				return p, true
			}
			if i < len(keys) {
				if p, ok := ks[keys[i]]; on(p, ok) {
					return p, true
				}
			}
		}
	}
	return RulePause{}, false
}

// current returns the pauses in force, read again if older than
// pauseFresh; while another task reads them, and on a Redis error, the
// last read (logged).
func (ps *pauses) current(ctx context.Context) map[string]map[string]RulePause {
	ps.mu.Lock()
	now := time.Now()
	if ps.reading || now.Sub(ps.read) < pauseFresh || now.UnixNano() < ps.m.down.Load() {
		// Fresh, being read, or Redis failed a moment ago (guard).
		by := ps.byRule
		ps.mu.Unlock()
		return by
	}
	ps.read, ps.reading = now, true
	ps.mu.Unlock()
	m, err := ps.m.cfg.LimitsClient.HGetAll(ctx, pausesKey(ps.m.prefix)).Result()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.reading = false
	if err != nil {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			ps.m.down.Store(time.Now().Add(time.Second).UnixNano())
		}
		ps.m.cfg.Logger.Warn("taskrl: reading the rules' pauses failed; the last read holds", "err", err)
		return ps.byRule
	}
	by := map[string]map[string]RulePause{}
	seen := map[string]bool{}
	for _, p := range decodePauses(m, ps.m.serverNow()) {
		if by[p.Rule] == nil {
			by[p.Rule] = map[string]RulePause{}
		}
		by[p.Rule][p.Key] = p
		id := p.Rule + "\x00" + p.Key + "\x00" + p.At.String()
		seen[id] = true
		if !ps.seen[id] {
			ps.m.cfg.Logger.Info("taskrl: rule paused by an operator; its tasks wait", "rule", p.Rule, "key", p.Key,
				"until", untilText(p.Until), "reason", p.Reason, "by", p.By)
		}
	}
	for id := range ps.seen {
		if !seen[id] {
			rule, rest, _ := strings.Cut(id, "\x00")
			key, _, _ := strings.Cut(rest, "\x00")
			ps.m.cfg.Logger.Info("taskrl: rule pause over; its tasks decide again", "rule", rule, "key", key)
		}
	}
	ps.byRule, ps.seen = by, seen
	return by
}

// untilText is a pause's end for people: a time, or "resumed".
func untilText(t time.Time) string {
	if t.IsZero() {
		return "resumed"
	}
	return t.UTC().Format(time.RFC3339)
}

// hold reschedules the job's task, held by pause p, to decide again when
// p ends (on the server's clock), or after pauseRecheck if it has no end:
// nothing is charged, no retry spent, its ID kept, and the time held does
// not count toward Config.ThrottleBudget.
func (j *job) hold(p RulePause) error {
	wait := pauseRecheck
	if !p.Until.IsZero() {
		wait = max(p.Until.Sub(j.m.serverNow()), 0)
	}
	j.observe(Event{Outcome: Held, Rule: p.Rule, Wait: wait})
	j.onHold = true
	return j.reschedule(p.Rule, wait, time.Time{}, "")
}
