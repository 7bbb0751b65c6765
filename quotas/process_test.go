package quotas

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

// The set the cross-process tests hammer: the peak GCRA is the tightest rule.
var (
	peak      = gcra.Limit{Rate: 50, Period: time.Second, Burst: 5}
	perBiz    = gcra.Limit{Rate: 20, Period: time.Second, Burst: 2}
	window    = FixedWindow{Limit: 1000, Every: 10 * time.Second}
	slots     = Concurrency{Max: 3, Lease: 30 * time.Second}
	hammerSet = mustSet(
		Rule{Name: "peak", Limit: GCRA(peak)},
		Rule{Name: "window", Limit: window},
		Rule{Name: "business", Limit: GCRA(perBiz)},
		Rule{Name: "slots", Limit: slots},
	)
)

func mustSet(rules ...Rule) *Set {
	s, err := NewSet(rules...)
	if err != nil {
		panic(err)
	}
	return s
}

// hammerEnv is what the parent hands its child processes.
type hammerEnv struct {
	Prefix  string
	Cluster bool
	Child   int
	// Patient callers wait RetryAfter (at most 100ms) after a denial, as the
	// middleware holds a task; impatient ones retry at once.
	Patient bool
	// Fair: the booking hammer's set shares its peak fairly.
	Fair bool
}

// runHammer starts 3 processes × 20 goroutines deciding hammerSet for 3 s.
// Each admission is logged, by the independent means of a Redis list, with
// its decision time and business; an independent INCR/DECR counter around
// the admitted work records the most holders ever seen at once.
func runHammer(t *testing.T, cluster, patient bool, minShare float64) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	var c redis.UniversalClient = redistest.Client(t)
	if cluster {
		c = redistest.Cluster(t)
	}
	prefix := redistest.Prefix(t)
	var wg sync.WaitGroup
	var calls atomic.Int64
	var mu sync.Mutex
	var decisions []logged
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			env, _ := json.Marshal(hammerEnv{Prefix: prefix, Cluster: cluster, Child: i, Patient: patient})
			out, err := redistest.Child("TestHammerChild", "QUOTAS_HAMMER="+string(env)).CombinedOutput()
			if err != nil {
				t.Errorf("child %d: %v\n%s", i, err, out)
				return
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "CALLS "); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					calls.Add(n)
				}
				if v, ok := strings.CutPrefix(sc.Text(), "D "); ok {
					var d logged
					fmt.Sscan(v, &d.at, &d.allowed, &d.rule, &d.biz)
					mu.Lock()
					decisions = append(decisions, d)
					mu.Unlock()
				}
			}
		}(i)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ctx := context.Background()
	logKey, maxKey := prefix+"{log}:admitted", prefix+"{log}:maxheld"
	entries := c.LRange(ctx, logKey, 0, -1).Val()
	// Each rule is checked against the time its own slot decided it at:
	// on Redis Cluster the business rule lives on another node.
	type adm struct {
		at, bizAt int64
		biz       string
	}
	var log []adm
	for _, e := range entries {
		f := strings.Fields(e)
		at, _ := strconv.ParseInt(f[0], 10, 64)
		bizAt, _ := strconv.ParseInt(f[2], 10, 64)
		log = append(log, adm{at, bizAt, f[1]})
	}
	sort.Slice(log, func(i, j int) bool { return log[i].at < log[j].at })
	if len(log) < 20 {
		t.Fatalf("only %d admissions", len(log))
	}
	// No GCRA rule ever exceeded: over every span, admissions <= burst + span/T.
	checkGCRA := func(name string, l gcra.Limit, ats []int64) {
		em := l.Interval().Microseconds()
		for i := range ats {
			for j := i; j < len(ats); j++ {
				if n, bound := int64(j-i+1), int64(l.Burst)+(ats[j]-ats[i])/em; n > bound {
					t.Fatalf("%s: %d admissions in %dµs, limit %v allows %d", name, n, ats[j]-ats[i], l, bound)
				}
			}
		}
	}
	var all []int64
	byBiz := map[string][]int64{}
	perWindow := map[int64]int{}
	for _, a := range log {
		all = append(all, a.at)
		byBiz[a.biz] = append(byBiz[a.biz], a.bizAt)
		perWindow[a.at/window.Every.Microseconds()]++
	}
	checkGCRA("peak", peak, all)
	for b, ats := range byBiz {
		sort.Slice(ats, func(i, j int) bool { return ats[i] < ats[j] })
		checkGCRA("business "+b, perBiz, ats)
	}
	for w, n := range perWindow {
		if n > window.Limit {
			t.Fatalf("window %d: %d admissions, limit %d", w, n, window.Limit)
		}
	}
	maxHeld, _ := c.Get(ctx, maxKey).Int()
	if maxHeld > slots.Max || maxHeld < 1 {
		t.Fatalf("independent counter saw %d holders at once, max %d", maxHeld, slots.Max)
	}
	if !cluster {
		replay(t, decisions)
	}
	// How much of what the tightest rule, peak, permits was used.
	span := log[len(log)-1].at - log[0].at
	permitted := int64(peak.Burst) + span/peak.Interval().Microseconds()
	t.Logf("%d decisions, %d admitted over %.3fs (peak permits %d: %.0f%%), at most %d held at once",
		calls.Load(), len(log), float64(span)/1e6, permitted, 100*float64(len(log))/float64(permitted), maxHeld)
	if float64(len(log)) < minShare*float64(permitted) {
		t.Fatalf("admitted %d, the tightest rule permits %d", len(log), permitted)
	}
}

// logged is one decision of a hammering child, on one Redis.
type logged struct {
	at      int64
	allowed bool
	rule    string
	biz     string
}

// replay runs every decision the children made, in the order the server
// made them, through the model of the rate and window rules: each admission
// must conform to every rule, and each denial by one of them must be one the
// model makes too, so the limiter admitted exactly what the rules permit, not
// one request fewer, however loaded the machine. Denials by the concurrency
// rule charge nothing and are skipped.
func replay(t *testing.T, ds []logged) {
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].at < ds[j].at })
	rates := mustSet(hammerSet.rules[:3]...)
	l := &Limiter{prefix: "replay:"}
	m := newModel()
	for i, d := range ds {
		if d.rule == "slots" {
			continue
		}
		calls, _ := l.bind(rates, Request{Keys: []string{"", "", d.biz}}, true)
		r := m.decide(calls, opAllow, d.at, 1, 0, 0, "", false, "")
		rule := "-"
		if r.status != stAdmitted {
			rule = rates.rules[r.rule-1].Name
		}
		if (r.status == stAdmitted) != d.allowed || !d.allowed && rule != d.rule {
			t.Fatalf("decision %d of %d at %d for %s: limiter said allowed=%v rule=%s, the rules say allowed=%v rule=%s",
				i, len(ds), d.at, d.biz, d.allowed, d.rule, r.status == stAdmitted, rule)
		}
	}
	t.Logf("replayed %d decisions: each one is what the rules permit", len(ds))
}

// On one Redis the set is one script: with 60 callers retrying at once,
// every decision is exactly what the rules permit.
func TestCrossProcess(t *testing.T) { runHammer(t, false, false, 0) }

// On Redis Cluster the set spans two slots; decisions charge per slot and
// undo on denial. It never over-admits; callers that retry without pause
// make undo frequent, and each undo that others raced gives back a little
// less than it took, so only a floor on the share is asserted.
func TestCrossProcessCluster(t *testing.T) { runHammer(t, true, false, 0.1) }

// Callers that wait as the middleware does keep undo rare: most of what the
// tightest rule permits is used.
func TestCrossProcessClusterPatient(t *testing.T) { runHammer(t, true, true, 0.5) }

// TestHammerChild is the child side of runHammer; it does nothing unless
// started by it.
func TestHammerChild(t *testing.T) {
	v := os.Getenv("QUOTAS_HAMMER")
	if v == "" {
		t.Skip("run by TestCrossProcess")
	}
	var env hammerEnv
	if err := json.Unmarshal([]byte(v), &env); err != nil {
		t.Fatal(err)
	}
	var c redis.UniversalClient = redistest.Client(t)
	if env.Cluster {
		c = redistest.Cluster(t)
	}
	l, err := New(Config{Client: c, Prefix: env.Prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	logKey, heldKey, maxKey := env.Prefix+"{log}:admitted", env.Prefix+"{log}:held", env.Prefix+"{log}:maxheld"
	raiseMax := redis.NewScript(`local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > v then redis.call('SET', KEYS[1], ARGV[1]) end`)
	var calls atomic.Int64
	var mu sync.Mutex
	var lines []string
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(env.Child), uint64(g)))
			for seq := 0; time.Now().Before(stop); seq++ {
				biz := fmt.Sprintf("b%d", 1+rng.IntN(5))
				req := Request{Keys: []string{"", "", biz, ""}, Holder: fmt.Sprintf("c%d-g%d-%d", env.Child, g, seq)}
				d, err := l.Allow(ctx, hammerSet, req)
				calls.Add(1)
				if err != nil {
					t.Error(err)
					return
				}
				if !env.Cluster {
					rule := d.Rule
					if d.Allowed {
						rule = "-"
					}
					mu.Lock()
					lines = append(lines, fmt.Sprintf("D %d %v %s %s", d.Now.UnixMicro(), d.Allowed, rule, biz))
					mu.Unlock()
				}
				if !d.Allowed {
					if env.Patient {
						time.Sleep(min(d.RetryAfter, 100*time.Millisecond))
					}
					continue
				}
				held := c.Incr(ctx, heldKey).Val()
				raiseMax.Run(ctx, c, []string{maxKey}, held)
				c.RPush(ctx, logKey, fmt.Sprintf("%d %s %d", d.ats[0], biz, d.ats[2]))
				time.Sleep(time.Millisecond)
				c.Decr(ctx, heldKey)
				for _, ls := range d.Leases {
					if ok, err := l.Release(ctx, ls); !ok || err != nil {
						t.Errorf("release %+v: %v %v", ls, ok, err)
					}
				}
			}
		}(g)
	}
	wg.Wait()
	fmt.Println(strings.Join(lines, "\n"))
	fmt.Printf("CALLS %d\n", calls.Load())
}

// TestLeaseReclaimedAfterKill takes the only slot of a concurrency rule in a
// child process that renews it every 300ms, kills the child with SIGKILL and
// measures how soon the slot is free again: after the lease, within lease + 1s.
func TestLeaseReclaimedAfterKill(t *testing.T) {
	if os.Getenv("QUOTAS_HOLDER") != "" {
		holdForever(t)
		return
	}
	c := redistest.Client(t)
	prefix := redistest.Prefix(t)
	cmd := redistest.Child("TestLeaseReclaimedAfterKill", "QUOTAS_HOLDER="+prefix)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "HELD") {
	}
	go func() {
		for sc.Scan() {
		}
	}()
	l, _ := New(Config{Client: c, Prefix: prefix})
	ctx := context.Background()
	req := Request{Holder: "parent"}
	time.Sleep(700 * time.Millisecond) // past two renewals
	if d, err := l.Allow(ctx, leaseSet, req); err != nil || d.Allowed {
		t.Fatalf("slot free while the child holds it: %+v %v", d, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := c.Time(ctx).Val()
	for {
		d, err := l.Allow(ctx, leaseSet, req)
		if err != nil {
			t.Fatal(err)
		}
		wait := d.Now.Sub(killed)
		if d.Allowed {
			t.Logf("slot free %v after SIGKILL (lease %v, renewed every 300ms)", wait, leaseLen)
			if wait < leaseLen-400*time.Millisecond {
				t.Fatalf("slot freed %v after the kill, before the lease ran out", wait)
			}
			return
		}
		if wait > leaseLen+time.Second {
			t.Fatalf("slot still held %v after SIGKILL", wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const leaseLen = 2 * time.Second

var leaseSet = mustSet(Rule{Name: "one", Limit: Concurrency{Max: 1, Lease: leaseLen}})

func holdForever(t *testing.T) {
	c := redistest.Client(t)
	l, _ := New(Config{Client: c, Prefix: os.Getenv("QUOTAS_HOLDER")})
	ctx := context.Background()
	d, err := l.Allow(ctx, leaseSet, Request{Holder: "child"})
	if err != nil || !d.Allowed {
		t.Fatalf("child could not take the slot: %+v %v", d, err)
	}
	fmt.Println("HELD")
	for {
		time.Sleep(300 * time.Millisecond)
		if ok, err := l.Renew(ctx, d.Leases[0]); !ok || err != nil {
			t.Fatalf("renew: %v %v", ok, err)
		}
	}
}
