package taskrl

import (
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// borrowPolicy: a vendor's 8/s shared fairly among businesses, each
// business held to 2/s that may borrow up to 2x while the vendor has room.
const borrowPolicy = `
rules:
  - name: vendor
    match: {type: "http:*"}
    fair: "{{.business_id}}"
    gcra: {rate: 8, per: 1s}
  - name: business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    borrow: 2x
    gcra: {rate: 2, per: 1s}
overrides:
  - {rule: business, key: big, gcra: {rate: 3, per: 1s}}
`

// TestBorrowLimits: borrow: 2x makes the middleware decide a keyed rule at
// twice its rate, an override of its keys alike; borrow: true up to the
// shared rule's rate; the written limit stays what Rules reports.
func TestBorrowLimits(t *testing.T) {
	p, err := policy.Parse([]byte(borrowPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Rules()[1].Borrow; got != 2 {
		t.Fatalf("borrow: 2x read as %v", got)
	}
	b := p.Bind("http:call", "q")
	rate := func(l quotas.Limit) float64 { g := l.(quotas.GCRA); return g.Rate / g.Period.Seconds() }
	if r := rate(b.Rules()[1].Limit); r != 4 {
		t.Errorf("the business rule is decided at %v/s, want 4/s (2/s borrowing 2x)", r)
	}
	if r := rate(b.ForKeys([]string{"", "big"}).Rules()[1].Limit); r != 6 {
		t.Errorf("the override of key big is decided at %v/s, want 6/s (3/s borrowing 2x)", r)
	}
	if r := rate(p.Rules()[1].Limit); r != 2 {
		t.Errorf("Rules reports %v/s, want the written 2/s", r)
	}

	p, err = policy.Parse([]byte(strings.Replace(borrowPolicy, "borrow: 2x", "borrow: true", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Rules()[1].Borrow; got != 4 {
		t.Errorf("borrow: true under an 8/s shared rule on a 2/s rule: factor %v, want 4", got)
	}
	if r := rate(p.Bind("http:call", "q").Rules()[1].Limit); r != 8 {
		t.Errorf("borrow: true decides at %v/s, want the shared 8/s", r)
	}
}

// TestBorrowErrors: every way a borrowing rule can be wrong is refused with
// its line and field, including a policy with no shared limit to borrow
// from or to give the capacity back.
func TestBorrowErrors(t *testing.T) {
	shared := "  - name: vendor\n    match: {type: \"http:call\"}\n    fair: \"{{.b}}\"\n    gcra: {rate: 6, per: 1s}\n"
	rule := func(extra string) string {
		return "rules:\n" + shared + "  - name: a\n    match: {type: \"http:call\"}\n    key: \"{{.b}}\"\n    " + extra + "\n"
	}
	cases := []struct{ name, doc, want string }{
		{"not a factor", rule("borrow: lots\n    gcra: {rate: 2, per: 1s}"), `policy: line 9: rule "a": borrow: must be true, false or a factor like 2x, got "lots"`},
		{"at most 1", rule("borrow: 0.5x\n    gcra: {rate: 2, per: 1s}"), `policy: line 9: rule "a": borrow: must be true or a factor above 1 and at most 100 (2x), got 0.5`},
		{"too much", rule("borrow: 200\n    gcra: {rate: 2, per: 1s}"), `policy: line 9: rule "a": borrow: must be true or a factor above 1 and at most 100 (2x), got 200`},
		{"concurrency", rule("borrow: 2x\n    concurrency: {max: 2, lease: 30s}"), `policy: line 9: rule "a": borrow: only a gcra rate can borrow; this rule's limit is 2 at once, lease 30s (concurrency)`},
		{"global", "rules:\n" + shared + "  - name: a\n    match: {type: \"http:call\"}\n    borrow: 2x\n    gcra: {rate: 2, per: 1s}\n", `policy: line 8: rule "a": borrow: only a keyed rule (key: ...) can borrow`},
		{"fair", rule("fair: \"{{.b}}\"\n    borrow: 2x\n    gcra: {rate: 2, per: 1s}"), `policy: line 10: rule "a": borrow: a fair rule cannot borrow`},
		{"no shared rule", "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    key: \"{{.b}}\"\n    borrow: 2x\n    gcra: {rate: 2, per: 1s}\n", `policy: line 5: rule "a": borrow: needs an enforced fair gcra rule (fair: ...) governing every task this rule governs`},
		{"shared in shadow", strings.Replace(rule("borrow: 2x\n    gcra: {rate: 2, per: 1s}"), "    fair:", "    mode: shadow\n    fair:", 1), `policy: line 10: rule "a": borrow: needs an enforced fair gcra rule`},
		{"shared matches fewer", strings.Replace(rule("borrow: 2x\n    gcra: {rate: 2, per: 1s}"), `match: {type: "http:call"}`, `match: {type: "http:call", queue: vendor}`, 1), `no rule's match covers {type: "http:call"}`},
		{"shared no faster", rule("borrow: true\n    gcra: {rate: 6, per: 1s}"), `policy: line 9: rule "a": borrow: true, but the shared rule "vendor" (6/1s burst 1 (GCRA)) is no faster than this rule (6/1s burst 1 (GCRA)): nothing to borrow`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant it to contain %s", err, tc.want)
			}
		})
	}
	// A glob covers a literal type; a pattern is covered only by itself.
	for _, tc := range []struct {
		shared, rule string
		ok           bool
	}{{"http:*", "http:call", true}, {"", "http:call", true}, {"http:*", "http:*", true}, {"http:call", "http:*", false}, {"mail:*", "http:call", false}} {
		doc := "rules:\n  - {name: v, match: {type: \"" + tc.shared + "\", queue: q}, fair: \"{{.b}}\", gcra: {rate: 6, per: 1s}}\n" +
			"  - {name: a, match: {type: \"" + tc.rule + "\", queue: q}, key: \"{{.b}}\", borrow: 2x, gcra: {rate: 2, per: 1s}}\n"
		if _, err := policy.Parse([]byte(doc)); (err == nil) != tc.ok {
			t.Errorf("shared %q, borrowing %q: got %v, want accepted %v", tc.shared, tc.rule, err, tc.ok)
		}
	}
}

// TestBorrowGivesBack, on an explicit clock and the reference model, as the
// middleware books: business a alone with 40 tasks books them at its
// borrowed 4/s (its own 2/s would need 19.5 s, 4/s 9.75 s); 2 s later
// businesses b and c come with 10 tasks each: they take a's bookings over
// (quotas' fair take-over) and each runs at least at its own 2/s within
// 1 s of arriving, computed from the limits alone: the i-th task (from 0)
// no later than arrival + 1 s + i/2 s; a, whose bookings were taken, books
// again from the slots given back and keeps its own 2/s too (at least 7
// tasks from 1 s to 5 s after the others came). Every task runs once in
// the end, and no second holds more than the vendor's 8 (burst 1: 8 + 1).
func TestBorrowGivesBack(t *testing.T) {
	p, err := policy.Parse([]byte(borrowPolicy))
	if err != nil {
		t.Fatal(err)
	}
	set := bindSet(t, p.Bind("http:call", "q"))
	m := quotas.NewModel()
	t0 := time.Unix(1700000000, 0)
	const horizon = time.Minute
	type task struct {
		biz  string
		req  quotas.Request
		d    quotas.Decision
		at   time.Time
		from time.Time
	}
	var tasks []*task
	book := func(tk *task, now time.Time) {
		d, err := m.ReserveAt(now, set, tk.req, horizon)
		if err != nil || !d.Allowed {
			t.Fatalf("business %s at %v: %+v %v", tk.biz, now.Sub(t0), d, err)
		}
		tk.d, tk.at = d, now.Add(d.Delay)
	}
	add := func(biz string, n int, now time.Time) {
		for range n {
			tk := &task{biz: biz, from: now, req: quotas.Request{Keys: []string{"", biz}, Fair: []string{biz, ""}}}
			tasks = append(tasks, tk)
			book(tk, now)
		}
	}
	add("a", 40, t0)
	var last time.Time
	for _, tk := range tasks {
		last = tk.at
	}
	if got, own := last.Sub(t0), 39*500*time.Millisecond; got >= own/2+time.Millisecond {
		t.Fatalf("alone, a's 40th task is booked %v ahead: not borrowing (4/s books it at 9.75 s, its own 2/s at %v)", got, own)
	}
	t1 := t0.Add(2 * time.Second)
	for range 10 {
		add("b", 1, t1)
		add("c", 1, t1)
	}
	// Time passes in 10 ms steps; a task checks that its booking is still
	// its own 300 ms before its moment (the middleware checks when the
	// booked copy comes back: design.md 1.5) and books again if not.
	ran := map[string][]time.Time{}
	for now := t1; now.Before(t0.Add(time.Minute)); now = now.Add(10 * time.Millisecond) {
		for _, tk := range tasks {
			if tk.at.IsZero() || tk.at.After(now.Add(300*time.Millisecond)) {
				continue
			}
			held, err := m.HeldAt(now, set, tk.req, tk.d)
			if err != nil {
				t.Fatal(err)
			}
			if !held {
				if err := m.RefundAt(now, set, tk.req, tk.d); err != nil {
					t.Fatal(err)
				}
				book(tk, now)
				continue
			}
			ran[tk.biz] = append(ran[tk.biz], tk.at)
			tk.at = time.Time{}
		}
	}
	if n := len(ran["a"]) + len(ran["b"]) + len(ran["c"]); n != 60 {
		t.Fatalf("%d of 60 tasks ran", n)
	}
	perSecond := map[int64]int{}
	for _, ats := range ran {
		for _, at := range ats {
			perSecond[at.Unix()]++
		}
	}
	for s, n := range perSecond {
		if n > 9 {
			t.Errorf("%d tasks in second %d: more than the vendor's 8/s allows", n, s-t0.Unix())
		}
	}
	for _, biz := range []string{"b", "c"} {
		ats := ran[biz]
		for i, at := range ats {
			if lim := t1.Add(time.Second + time.Duration(i)*500*time.Millisecond); at.After(lim) {
				t.Errorf("business %s's task %d ran %v after it came, later than its own 2/s allows within 1 s (%v)", biz, i, at.Sub(t1), lim.Sub(t1))
			}
		}
		t.Logf("business %s: first task %v after it came, last %v", biz, ats[0].Sub(t1), ats[len(ats)-1].Sub(t1))
	}
	var aAfter int
	for _, at := range ran["a"] {
		if !at.Before(t1.Add(time.Second)) && at.Before(t1.Add(5*time.Second)) {
			aAfter++
		}
	}
	t.Logf("business a: %d tasks from 1 s to 5 s after the others came (its own 2/s: 8)", aAfter)
	if aAfter < 7 {
		t.Errorf("business a ran %d tasks from 1 s to 5 s after the others came: below its own 2/s (8)", aAfter)
	}
}
