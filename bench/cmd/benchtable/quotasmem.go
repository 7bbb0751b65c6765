package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/bench"
	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/quotas"
)

// Prefixes of the quotas memory measurements, apart from the benchmark's.
const (
	memQuotasPrefix = "bench:qm:" // one rule per set, small limits
	memSetPrefix    = "bench:qb:" // the quotas-5rule set on fresh keys
)

// memHolder is a holder id shaped like an asynq task id (a UUID, 36 bytes).
const memHolder = "6f1c2a4e-9b7d-4c3e-8a21-5d0f7e9b3c12"

// keyInfo is what one Redis key costs.
type keyInfo struct {
	key, typ, enc string
	bytes         int64
	pttl          time.Duration
}

func inspect(ctx context.Context, c *redis.Client, key string) (keyInfo, error) {
	ki := keyInfo{key: key}
	var err error
	if ki.typ, err = c.Type(ctx, key).Result(); err != nil || ki.typ == "none" {
		return ki, err // "none": expired since it was found
	}
	if ki.enc, err = c.ObjectEncoding(ctx, key).Result(); err != nil {
		return ki, err
	}
	if ki.bytes, err = c.MemoryUsage(ctx, key, 0).Result(); err != nil {
		return ki, fmt.Errorf("MEMORY USAGE %s: %w", key, err)
	}
	ki.pttl, err = c.PTTL(ctx, key).Result()
	return ki, err
}

// scanKeys returns the keys matching pattern, sorted, found with SCAN.
func scanKeys(ctx context.Context, c *redis.Client, pattern string) ([]string, error) {
	var out []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		out = append(out, iter.Val())
	}
	slices.Sort(out)
	return out, iter.Err()
}

// printQuotasMemory measures the keys each quotas rule kind writes after
// one allowed decision, the per-entry cost of a sliding window, and the keys
// one quotas-5rule decision writes.
func printQuotasMemory(ctx context.Context, env *bench.Env) error {
	c := env.Client
	l, err := quotas.New(quotas.Config{Client: c, Prefix: memQuotasPrefix})
	if err != nil {
		return err
	}
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	kinds := []struct {
		kind  string
		limit quotas.Limit
	}{
		{"GCRA", quotas.GCRA(gcra.Limit{Rate: 10, Period: time.Minute, Burst: 10})},
		{"fixed window", quotas.FixedWindow{Limit: 100, Every: time.Minute}},
		{"calendar window", quotas.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		{"sliding window", quotas.SlidingWindow{Limit: 100, Every: time.Minute}},
		{"concurrency (1 holder)", quotas.Concurrency{Max: 10, Lease: 30 * time.Second}},
	}
	fmt.Println()
	fmt.Printf("quotas: keys one rule writes after one allowed decision on a fresh entity (found with SCAN %s*; MEMORY USAGE … SAMPLES 0; holder id %d bytes):\n\n", memQuotasPrefix, len(memHolder))
	fmt.Println("| rule kind | limit | key | type / encoding | bytes (MEMORY USAGE) | PTTL |")
	fmt.Println("|---|---|---|---|---:|---:|")
	for i, k := range kinds {
		set, err := quotas.NewSet(quotas.Rule{Name: "r", Limit: k.limit})
		if err != nil {
			return err
		}
		ent := "mem-" + suffix + "-" + strconv.Itoa(i)
		d, err := l.Allow(ctx, set, quotas.Request{Keys: []string{ent}, Holder: memHolder})
		if err != nil {
			return err
		}
		if !d.Allowed {
			return fmt.Errorf("quotas memory: %s denied", k.kind)
		}
		ks, err := scanKeys(ctx, c, memQuotasPrefix+"q:{"+ent+"}:*")
		if err != nil {
			return err
		}
		if len(ks) == 0 {
			return fmt.Errorf("quotas memory: %s wrote no key under %s", k.kind, memQuotasPrefix)
		}
		var total int64
		for _, key := range ks {
			ki, err := inspect(ctx, c, key)
			if err != nil {
				return err
			}
			total += ki.bytes
			fmt.Printf("| %s | %s | `%s` (%d B) | %s / %s | %d | %s |\n", k.kind, k.limit, key, len(key), ki.typ, ki.enc, ki.bytes, fmtTTL(ki.pttl))
		}
		if len(ks) > 1 {
			fmt.Printf("| %s, total | | %d keys | | %d | |\n", k.kind, len(ks), total)
		}
		for _, ls := range d.Leases {
			if _, err := l.Release(ctx, ls); err != nil {
				return err
			}
		}
	}

	// Sliding window: bytes per admitted entry. Redis keeps a sorted set of
	// up to 128 entries as a listpack, larger ones as a skiplist + dict.
	fmt.Println()
	fmt.Println("quotas sliding window: bytes of its key after n admitted requests (one Allow each):")
	fmt.Println()
	fmt.Println("| limit | n | encoding | bytes | bytes per entry |")
	fmt.Println("|---|---:|---|---:|---|")
	for _, sw := range []struct {
		limit  int
		at     []int
		lo, hi int
	}{
		{100, []int{1, 10, 100}, 1, 100},
		{1000, []int{129, 200, 1000}, 200, 1000},
	} {
		set, err := quotas.NewSet(quotas.Rule{Name: "r", Limit: quotas.SlidingWindow{Limit: sw.limit, Every: time.Minute}})
		if err != nil {
			return err
		}
		ent := "mem-" + suffix + "-sliding-" + strconv.Itoa(sw.limit)
		bytesAt := map[int]int64{}
		var key string
		for n := 1; n <= sw.at[len(sw.at)-1]; n++ {
			d, err := l.Allow(ctx, set, quotas.Request{Keys: []string{ent}})
			if err != nil {
				return err
			}
			if !d.Allowed {
				return fmt.Errorf("quotas memory: sliding window denied request %d", n)
			}
			if !slices.Contains(sw.at, n) {
				continue
			}
			if key == "" {
				ks, err := scanKeys(ctx, c, memQuotasPrefix+"q:{"+ent+"}:*")
				if err != nil || len(ks) != 1 {
					return fmt.Errorf("quotas memory: sliding window keys %v: %v", ks, err)
				}
				key = ks[0]
			}
			ki, err := inspect(ctx, c, key)
			if err != nil {
				return err
			}
			bytesAt[n] = ki.bytes
			per := ""
			if n == sw.hi {
				per = fmt.Sprintf("(%d − %d) / %d = %.1f", bytesAt[sw.hi], bytesAt[sw.lo], sw.hi-sw.lo, float64(bytesAt[sw.hi]-bytesAt[sw.lo])/float64(sw.hi-sw.lo))
			}
			fmt.Printf("| %d per 1m | %d | %s | %d | %s |\n", sw.limit, n, ki.enc, ki.bytes, per)
		}
	}

	// The benchmark's 5-rule set on fresh keys: what one decision writes,
	// and what is left after its lease is released.
	ql, err := quotas.New(quotas.Config{Client: c, Prefix: memSetPrefix})
	if err != nil {
		return err
	}
	biz := "mem-" + suffix
	d, err := ql.Allow(ctx, bench.FiveRules, quotas.Request{Keys: []string{"", "", "", biz, biz}, Holder: memHolder})
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Printf("quotas-5rule set (the benchmark's limits): keys after one Allow on fresh keys, and after its Release (SCAN %s*):\n\n", memSetPrefix)
	fmt.Println("| key | type / encoding | bytes after Allow | PTTL after Allow | after Release |")
	fmt.Println("|---|---|---:|---:|---|")
	ks, err := scanKeys(ctx, c, memSetPrefix+"*")
	if err != nil {
		return err
	}
	infos := make([]keyInfo, len(ks))
	for i, key := range ks {
		if infos[i], err = inspect(ctx, c, key); err != nil {
			return err
		}
	}
	for _, ls := range d.Leases {
		if _, err := ql.Release(ctx, ls); err != nil {
			return err
		}
	}
	var total int64
	for _, ki := range infos {
		after := "gone"
		if n, err := c.Exists(ctx, ki.key).Result(); err != nil {
			return err
		} else if n == 1 {
			a, err := inspect(ctx, c, ki.key)
			if err != nil {
				return err
			}
			after = fmt.Sprintf("%d B, PTTL %s", a.bytes, fmtTTL(a.pttl))
		}
		total += ki.bytes
		if ki.typ == "none" {
			fmt.Printf("| `%s` | expired between SCAN and inspection (TTL ~1 ms at this limit) | — | — | %s |\n", ki.key, after)
			continue
		}
		fmt.Printf("| `%s` | %s / %s | %d | %s | %s |\n", ki.key, ki.typ, ki.enc, ki.bytes, fmtTTL(ki.pttl), after)
	}
	fmt.Printf("| total, %d keys | | %d | | |\n", len(infos), total)
	return nil
}
