package quotas

import (
	"context"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// TestReceiptRefundsLikeTheDecision: two keyspaces see the same random
// reservations on the same explicit clock; one refunds a random subset of
// them with the Decision itself, the other with the Decision parsed back
// from its Receipt. Every rule's status stays identical in both.
func TestReceiptRefundsLikeTheDecision(t *testing.T) {
	c := redistest.Client(t)
	start := time.Date(2027, 3, 13, 23, 0, 0, 0, time.UTC)
	pa, pb := redistest.Prefix(t), redistest.Prefix(t)
	a := newClocked(t, c, pa, start)
	b := newClocked(t, c, pb, start)
	set := mustSet(
		Rule{Name: "peak", Limit: GCRA(gcra.Limit{Rate: 5, Period: time.Second, Burst: 3})},
		Rule{Name: "window", Limit: FixedWindow{Limit: 20, Every: 10 * time.Second}},
		Rule{Name: "daily", Limit: CalendarWindow{Limit: 60, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		Rule{Name: "recent", Limit: SlidingWindow{Limit: 8, Every: 3 * time.Second}},
		Rule{Name: "biz", Limit: GCRA(gcra.Limit{Rate: 2, Period: time.Second, Burst: 1})},
	)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	var booked [][2]Decision // the same booking in a and in b
	refunds, states := 0, 0
	for i := 0; i < 400; i++ {
		step := time.Duration(rng.IntN(800)) * time.Millisecond
		a.now, b.now = a.now.Add(step), b.now.Add(step)
		req := Request{Keys: []string{"", "", "", "", []string{"b1", "b2"}[rng.IntN(2)]}, Cost: 1 + rng.IntN(2)}
		if rng.IntN(3) > 0 {
			da, err := a.Reserve(ctx, set, req, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			db, err := b.Reserve(ctx, set, req, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if da.Allowed != db.Allowed || da.Delay != db.Delay {
				t.Fatalf("op %d: the keyspaces diverged: %+v vs %+v", i, da, db)
			}
			if !da.Allowed {
				if da.Receipt() != "" {
					t.Fatalf("a denied decision has a receipt: %q", da.Receipt())
				}
				continue
			}
			booked = append(booked, [2]Decision{da, db})
			continue
		}
		if len(booked) == 0 {
			continue
		}
		// Half the time the latest booking, often with nothing charged
		// since: the exact undo; otherwise any, under later charges.
		k := len(booked) - 1
		if rng.IntN(2) == 0 {
			k = rng.IntN(len(booked))
		}
		d, db := booked[k][0], booked[k][1]
		booked = append(booked[:k], booked[k+1:]...)
		r, err := ParseReceipt(db.Receipt())
		if err != nil {
			t.Fatalf("op %d: %q: %v", i, db.Receipt(), err)
		}
		req = Request{Keys: []string{"", "", "", "", d.Rules[4].Key}, Cost: d.cost}
		if err := a.Refund(ctx, set, req, d); err != nil {
			t.Fatal(err)
		}
		if err := b.Refund(ctx, set, req, r); err != nil {
			t.Fatal(err)
		}
		refunds++
		for _, biz := range []string{"b1", "b2"} {
			sreq := Request{Keys: []string{"", "", "", "", biz}}
			sa, err := a.Status(ctx, set, sreq)
			if err != nil {
				t.Fatal(err)
			}
			sb, err := b.Status(ctx, set, sreq)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(sa.Rules, sb.Rules) {
				t.Fatalf("op %d: after refunding %q: by decision %+v, by receipt %+v", i, d.Receipt(), sa.Rules, sb.Rules)
			}
		}
		// The GCRA states themselves, not only what Status derives.
		for _, k := range []string{"q:{~g}:peak:gcra:200000:3", "q:{b1}:biz:gcra:500000:1", "q:{b2}:biz:gcra:500000:1"} {
			va, vb := c.Get(ctx, pa+k).Val(), c.Get(ctx, pb+k).Val()
			if va != vb {
				t.Fatalf("op %d: after refunding %q: %s is %q by decision, %q by receipt", i, d.Receipt(), k, va, vb)
			}
			if va != "" {
				states++
			}
		}
	}
	if refunds < 50 || states < 50 {
		t.Fatalf("only %d refunds exercised, %d GCRA states compared", refunds, states)
	}
}

func TestParseReceiptErrors(t *testing.T) {
	for _, s := range []string{"", "r1", "r1 1", "r2", "r2 x 1 - 1,2,3", "r2 -5 1 - 1,2,3", "r2 1 - 1,2,3", "r3 1 - 1,2,3", "r1 0 - 1,2,3", "r1 x - 1,2,3", "r1 1 - 1,2", "r1 1 - 1,2,x"} {
		if _, err := ParseReceipt(s); err == nil {
			t.Errorf("ParseReceipt(%q) accepted", s)
		}
	}
	d, err := ParseReceipt("r1 2 abc: 5,6,7 8,9,10")
	if err != nil || !d.Allowed || d.cost != 2 || d.nonce != "abc:" || !reflect.DeepEqual(d.ats, []int64{5, 8}) || !reflect.DeepEqual(d.undo, [][2]int64{{6, 7}, {9, 10}}) {
		t.Fatalf("%+v %v", d, err)
	}
	// An r1 receipt (before Now was kept) comes back as r2 without a time.
	if got := d.Receipt(); got != "r2 0 2 abc: 5,6,7 8,9,10" {
		t.Fatalf("round trip: %q", got)
	}
	d, err = ParseReceipt("r2 1795000000123456 2 abc: 5,6,7 8,9,10")
	if err != nil || d.Now.UnixMicro() != 1795000000123456 || d.cost != 2 {
		t.Fatalf("%+v %v", d, err)
	}
	if got := d.Receipt(); got != "r2 1795000000123456 2 abc: 5,6,7 8,9,10" {
		t.Fatalf("round trip: %q", got)
	}
}
