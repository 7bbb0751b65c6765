package quotas

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// decider is what the cost tests need of a Model or a Limiter on an
// explicit clock.
type decider interface {
	allow(s *Set, req Request) (Decision, error)
	settle(s *Set, req Request, d Decision, actual []int) error
}

type modelDecider struct {
	m   *Model
	now *time.Time
}

func (md modelDecider) allow(s *Set, req Request) (Decision, error) {
	return md.m.AllowAt(*md.now, s, req)
}
func (md modelDecider) settle(s *Set, req Request, d Decision, actual []int) error {
	return md.m.SettleAt(*md.now, s, req, d, actual)
}

type limiterDecider struct{ l *clockedNow }

func (ld limiterDecider) allow(s *Set, req Request) (Decision, error) {
	return ld.l.Allow(context.Background(), s, req)
}
func (ld limiterDecider) settle(s *Set, req Request, d Decision, actual []int) error {
	return ld.l.Settle(context.Background(), s, req, d, actual)
}

// eachDecider runs f on the Model and, when Redis is there, on a Limiter,
// both on the explicit clock *now.
func eachDecider(t *testing.T, now *time.Time, f func(t *testing.T, d decider)) {
	t.Run("model", func(t *testing.T) { f(t, modelDecider{NewModel(), now}) })
	t.Run("redis", func(t *testing.T) {
		l := newClocked(t, redistest.Client(t), redistest.Prefix(t), *now)
		f(t, limiterDecider{&clockedNow{l, now}})
	})
}

// clockedNow is a clocked Limiter reading its time from a shared variable.
type clockedNow struct {
	*clocked
	now *time.Time
}

func (c *clockedNow) Allow(ctx context.Context, s *Set, req Request) (Decision, error) {
	c.clocked.now = *c.now
	return c.clocked.Allow(ctx, s, req)
}

func (c *clockedNow) Settle(ctx context.Context, s *Set, req Request, d Decision, actual []int) error {
	c.clocked.now = *c.now
	return c.clocked.Settle(ctx, s, req, d, actual)
}

// TestCostAndSettleArithmetic checks cost per rule and Settle on explicit
// times against figures computed from the limits alone: a GCRA rule of 30
// a second with a burst of 30 (T = 1s/30, rounded up to whole µs) takes 10
// requests of cost 3 from idle and then asks the 11th to wait 3·T; settled
// at 1 each, the 10 give 20 units back, so that 6 more requests of cost 3
// pass at once and the next waits T. Settled higher, the difference is
// charged without a conformance check.
func TestCostAndSettleArithmetic(t *testing.T) {
	em := (time.Second/time.Microsecond + 29) / 30 * time.Microsecond // T of 30/s, rounded up to a whole µs
	set := mustSet(Rule{Name: "api", Limit: GCRA(gcra.Limit{Rate: 30, Period: time.Second, Burst: 30})},
		Rule{Name: "daily", Limit: FixedWindow{Limit: 1000, Every: 24 * time.Hour}})
	// Cost 3 on the GCRA rule, 1 on the window.
	req := Request{Costs: []int{3, 1}}
	start := time.Date(2027, 5, 4, 10, 0, 0, 0, time.UTC)

	// fill takes the burst: 10 requests of cost 3 admitted, the 11th told
	// to wait 3·T.
	fill := func(t *testing.T, d decider) []Decision {
		var ds []Decision
		for i := 0; i < 10; i++ {
			dec, err := d.allow(set, req)
			if err != nil || !dec.Allowed {
				t.Fatalf("request %d of cost 3: %+v %v", i, dec, err)
			}
			ds = append(ds, dec)
		}
		dec, err := d.allow(set, req)
		if err != nil || dec.Allowed || dec.RetryAfter != 3*em || dec.Rule != "api" {
			t.Fatalf("11th request: %+v %v, want a wait of 3·T = %v on api", dec, err, 3*em)
		}
		if dec.Rules[1].Used != 10 {
			t.Fatalf("the window counted %d, want 10 (cost 1 each)", dec.Rules[1].Used)
		}
		return ds
	}
	// more counts the requests of cost 3 admitted at once, and returns the
	// wait of the first one denied.
	more := func(t *testing.T, d decider) (int, time.Duration) {
		for n := 0; ; n++ {
			dec, err := d.allow(set, req)
			if err != nil {
				t.Fatal(err)
			}
			if !dec.Allowed {
				return n, dec.RetryAfter
			}
		}
	}

	t.Run("lower", func(t *testing.T) {
		now := start
		eachDecider(t, &now, func(t *testing.T, d decider) {
			ds := fill(t, d)
			// Every request actually cost 1 on api; the window keeps its 1.
			for _, dec := range ds {
				if err := d.settle(set, req, dec, []int{1, -1}); err != nil {
					t.Fatal(err)
				}
			}
			n, wait := more(t, d)
			if n != 6 || wait != em {
				t.Errorf("after settling at 1: %d more requests of cost 3 at once and a wait of %v, want 6 and T = %v", n, wait, em)
			}
		})
	})
	t.Run("higher", func(t *testing.T) {
		now := start
		eachDecider(t, &now, func(t *testing.T, d decider) {
			dec, err := d.allow(set, req)
			if err != nil || !dec.Allowed {
				t.Fatal(dec, err)
			}
			// It cost 10 on api and 2 on the window, settled 2·T later: 7
			// and 1 more, charged at once.
			now = now.Add(2 * em)
			if err := d.settle(set, req, dec, []int{10, 2}); err != nil {
				t.Fatal(err)
			}
			// TAT = start + 3T, 2T passed: start + 3T + 7T = now + 8T;
			// room for (30 − 8) / 3 = 7 requests of cost 3, the next
			// waits until 30T of virtual time ends 3T before its own end:
			// TAT now + 29T, + 3T − 30T = now + 2T.
			n, wait := more(t, d)
			if n != 7 || wait != 2*em {
				t.Errorf("after settling at 10: %d requests of cost 3 at once and a wait of %v, want 7 and 2·T = %v", n, wait, 2*em)
			}
			st, err := d.allow(set, Request{Costs: []int{1, 1}})
			if err != nil || st.Rules[1].Used != 1+1+7+1 {
				t.Errorf("window: %+v %v, want 10 counted (1 charged, 1 settled more, 7, this 1)", st.Rules, err)
			}
		})
	})
	t.Run("above burst", func(t *testing.T) {
		now := start
		eachDecider(t, &now, func(t *testing.T, d decider) {
			dec, err := d.allow(set, Request{Costs: []int{31, 1}})
			if err != nil || dec.Allowed || dec.RetryAfter != Never || dec.Rule != "api" {
				t.Fatalf("cost 31 over a burst of 30: %+v %v, want never, on api", dec, err)
			}
			dec, err = d.allow(set, Request{Costs: []int{1, 1001}})
			if err != nil || dec.Allowed || dec.RetryAfter != Never || dec.Rule != "daily" {
				t.Fatalf("cost 1001 over a window of 1000: %+v %v, want never, on daily", dec, err)
			}
		})
	})
}

// TestReceiptKeepsCosts: a Decision with per-rule costs survives its
// Receipt, and the parsed one refunds and settles as the Decision itself
// does; receipts without per-rule costs keep their old form.
func TestReceiptKeepsCosts(t *testing.T) {
	set := mustSet(Rule{Name: "api", Limit: GCRA(gcra.Limit{Rate: 30, Period: time.Second, Burst: 30})},
		Rule{Name: "win", Limit: SlidingWindow{Limit: 100, Every: time.Minute}},
		Rule{Name: "day", Limit: FixedWindow{Limit: 100, Every: 24 * time.Hour}})
	now := time.Date(2027, 5, 4, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		req   Request
		shape string // the receipt's rule fields, each number as 9
	}{
		{Request{Cost: 2}, "9,9,9 9,9,9 9,9,9"},
		{Request{Costs: []int{3, 0, 5}}, "9,9,9,9 9,9,9 9,9,9,9"},
		{Request{Cost: 4, Costs: []int{4, 4, 1}}, "9,9,9 9,9,9 9,9,9,9"},
	} {
		a, b := NewModel(), NewModel()
		da, err := a.AllowAt(now, set, tc.req)
		if err != nil || !da.Allowed {
			t.Fatal(da, err)
		}
		db, err := b.AllowAt(now, set, tc.req)
		if err != nil || !db.Allowed {
			t.Fatal(db, err)
		}
		r := db.Receipt()
		var shape []byte
		f := 0
		for i := 0; i < len(r); i++ {
			if r[i] == ' ' {
				f++
			}
			if f < 4 {
				continue
			}
			switch c := r[i]; {
			case c >= '0' && c <= '9' || c == '-':
				if len(shape) == 0 || shape[len(shape)-1] != '9' {
					shape = append(shape, '9')
				}
			default:
				shape = append(shape, c)
			}
		}
		if got := string(shape[1:]); got != tc.shape {
			t.Errorf("%+v: receipt %q has rule fields %q, want %q", tc.req, r, got, tc.shape)
		}
		p, err := ParseReceipt(r)
		if err != nil {
			t.Fatalf("%q: %v", r, err)
		}
		if !reflect.DeepEqual(p.costs, db.costs) || p.cost != db.cost {
			t.Errorf("%q: parsed costs %v/%d, want %v/%d", r, p.costs, p.cost, db.costs, db.cost)
		}
		later := now // GCRA: the TAT of a cost 1 left
		actual := []int{1, 0, 2}
		if err := a.SettleAt(later, set, tc.req, da, actual); err != nil {
			t.Fatal(err)
		}
		if err := b.SettleAt(later, set, tc.req, p, actual); err != nil {
			t.Fatal(err)
		}
		sa, _ := a.StatusAt(later, set, tc.req)
		sb, _ := b.StatusAt(later, set, tc.req)
		if !reflect.DeepEqual(sa.Rules, sb.Rules) {
			t.Errorf("%+v: settled from the receipt %v, from the decision %v", tc.req, sb.Rules, sa.Rules)
		}
		if got := fmt.Sprint(sb.Rules[0].Used, sb.Rules[1].Used, sb.Rules[2].Used); got != "1 0 2" {
			t.Errorf("%+v: after settling at %v: used %s, want 1 0 2", tc.req, actual, got)
		}
	}
	// An r1 receipt of an earlier version still parses.
	if d, err := ParseReceipt("r1 2 abc: 1,5,3 1,-7,0"); err != nil || d.cost != 2 || d.costs != nil || len(d.ats) != 2 {
		t.Errorf("r1 receipt: %+v %v", d, err)
	}
	for _, bad := range []string{"r2 1 2 n 1,2,3,0", "r2 1 2 n 1,2,3,x", "r2 1 2 n 1,2,3,4,5"} {
		if _, err := ParseReceipt(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestReceiptSettlesOnRedis: two keyspaces take the same reservations of
// per-rule costs on the same explicit clock, some booked ahead; one settles
// each with the Decision, the other with the Decision parsed back from its
// Receipt, to random actual costs: every rule's state stays the same.
func TestReceiptSettlesOnRedis(t *testing.T) {
	c := redistest.Client(t)
	start := time.Date(2027, 5, 4, 10, 0, 0, 0, time.UTC)
	a := newClocked(t, c, redistest.Prefix(t), start)
	b := newClocked(t, c, redistest.Prefix(t), start)
	set := mustSet(Rule{Name: "api", Limit: GCRA(gcra.Limit{Rate: 30, Period: time.Second, Burst: 10})},
		Rule{Name: "win", Limit: SlidingWindow{Limit: 40, Every: time.Second}},
		Rule{Name: "day", Limit: FixedWindow{Limit: 1000, Every: 24 * time.Hour}})
	ctx := context.Background()
	req := Request{Costs: []int{3, 2, 0}, Cost: 1}
	var ds [][2]Decision
	for i := 0; i < 12; i++ {
		da, err := a.Reserve(ctx, set, req, time.Minute)
		if err != nil || !da.Allowed {
			t.Fatal(da, err)
		}
		db, err := b.Reserve(ctx, set, req, time.Minute)
		if err != nil || da.Delay != db.Delay {
			t.Fatal(db, err)
		}
		ds = append(ds, [2]Decision{da, db})
	}
	if ds[11][0].Delay == 0 {
		t.Fatal("nothing was booked ahead")
	}
	for i, d := range ds {
		step := 40 * time.Millisecond
		a.now, b.now = a.now.Add(step), b.now.Add(step)
		actual := []int{i % 4, (i + 1) % 3, 1 + i%2}
		p, err := ParseReceipt(d[1].Receipt())
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Settle(ctx, set, req, d[0], actual); err != nil {
			t.Fatal(err)
		}
		if err := b.Settle(ctx, set, req, p, actual); err != nil {
			t.Fatal(err)
		}
		sa, _ := a.Status(ctx, set, req)
		sb, _ := b.Status(ctx, set, req)
		if !reflect.DeepEqual(sa.Rules, sb.Rules) {
			t.Fatalf("settle %d to %v: from the receipt %v, from the decision %v", i, actual, sb.Rules, sa.Rules)
		}
	}
}
