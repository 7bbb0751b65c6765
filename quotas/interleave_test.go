package quotas

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestShardedInterleavings checks, on the model, that deciding a set slot by
// slot with compensation never over-admits, whatever the interleaving of
// concurrent requests. Each request charges its slots one by one and, if one
// denied, undoes the others. After every step each GCRA key must hold at
// least the state that the charges not (yet) undone imply — refunds may give
// back less than was taken, never more — and the admitted requests must obey
// every GCRA rule over every span.
func TestShardedInterleavings(t *testing.T) {
	set := mustSet(Rule{Name: "peak", Limit: GCRA(peak)}, Rule{Name: "window", Limit: window}, Rule{Name: "business", Limit: GCRA(perBiz)}, Rule{Name: "slots", Limit: slots})
	l := &Limiter{prefix: "x:", sharded: true}
	type charge struct {
		key  string
		em   int64
		at   int64
		gone bool
	}
	for seed := uint64(0); seed < 60; seed++ {
		rng := rand.New(rand.NewPCG(seed, 9))
		m := newModel()
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		type pending struct {
			gs      [][]call
			rs      []reply
			charges [][]*charge // per group
			holder  string
			done    bool
		}
		var inflight []*pending
		var charges []*charge
		var admitted []int64
		check := func(step int) {
			truth := map[string]int64{}
			for _, c := range charges {
				if !c.gone {
					truth[c.key] = max(truth[c.key], c.at) + c.em
				}
			}
			for k, want := range truth {
				if got := max(m.tats[k], now); got < want && want > now {
					t.Fatalf("seed %d step %d: %s holds TAT %d, below the %d its charges imply", seed, step, k, got, want)
				}
			}
		}
		for step := 0; step < 1500; step++ {
			now += rng.Int64N(600)
			if len(inflight) < 20 && rng.IntN(3) == 0 {
				req := Request{Keys: []string{"", "", fmt.Sprintf("b%d", rng.IntN(5)), ""}, Holder: fmt.Sprintf("h%d", step)}
				calls, _ := l.bind(set, req, true)
				inflight = append(inflight, &pending{gs: l.groups(calls), holder: req.Holder})
				continue
			}
			if len(inflight) == 0 {
				continue
			}
			i := rng.IntN(len(inflight))
			p := inflight[i]
			if n := len(p.rs); n < len(p.gs) {
				g := p.gs[n]
				r := m.decide(g, opAllow, now, 1, 0, 0, p.holder, false, "n")
				p.rs = append(p.rs, r)
				var cs []*charge
				if r.status == stAdmitted {
					for _, c := range g {
						if c.c.kind == kindGCRA {
							ch := &charge{key: c.keys[0], em: c.c.em, at: now}
							cs = append(cs, ch)
							charges = append(charges, ch)
						}
					}
				}
				p.charges = append(p.charges, cs)
				check(step)
				continue
			}
			ok := true
			for _, r := range p.rs {
				ok = ok && r.status == stAdmitted
			}
			for gi, g := range p.gs {
				r := p.rs[gi]
				if r.status != stAdmitted {
					continue
				}
				ats, undo := make([]int64, 4), make([][2]int64, 4)
				for j, c := range g {
					ats[c.i], undo[c.i] = r.at, [2]int64{r.rules[j][3], r.rules[j][4]}
				}
				switch {
				case !ok:
					m.refund(g, now, 1, ats, undo, p.holder, "n", 0)
					for _, ch := range p.charges[gi] {
						ch.gone = true
					}
				case p.done:
					// An admitted request's work ends: release its slot.
					for j, c := range g {
						if c.c.kind == kindConcurrency {
							m.release(c.keys[0], p.holder, r.rules[j][3])
						}
					}
				}
			}
			check(step)
			if ok && !p.done {
				admitted = append(admitted, p.rs[0].now)
				p.done = true
				continue
			}
			inflight = append(inflight[:i], inflight[i+1:]...)
		}
		sort.Slice(admitted, func(a, b int) bool { return admitted[a] < admitted[b] })
		em := peak.Interval().Microseconds()
		for a := range admitted {
			for b := a; b < len(admitted); b++ {
				if n, bound := int64(b-a+1), int64(peak.Burst)+(admitted[b]-admitted[a])/em; n > bound {
					t.Fatalf("seed %d: %d admissions in %dµs, peak allows %d", seed, n, admitted[b]-admitted[a], bound)
				}
			}
		}
	}
}
