package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/redisconf"
)

// redisSettings reads the settings of the queues' Redis and, when the
// limits live on their own, of theirs (redisconf).
func redisSettings(ctx context.Context, queues, limits redis.UniversalClient) redisconf.Report {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	rep := redisconf.Read(ctx, queues)
	if limits != queues {
		rep.Nodes = append(rep.Nodes, redisconf.Read(ctx, limits).Nodes...)
	}
	return rep
}

// refuseEviction is --require-noeviction's verdict on rep: an error naming
// each master that may evict the limits' keys (or whose policy cannot be
// read), nil when none may.
func refuseEviction(rep redisconf.Report) error {
	ev := rep.Evicting()
	if len(ev) == 0 {
		return nil
	}
	var parts []string
	for _, n := range ev {
		policy := n.Policy
		if n.Unread() {
			policy = "unreadable"
		}
		parts = append(parts, fmt.Sprintf("%s (maxmemory-policy %s)", n.Addr, policy))
	}
	return fmt.Errorf("--require-noeviction: Redis may evict the limits' keys: %s; set maxmemory-policy noeviction", strings.Join(parts, ", "))
}

// settingsWatch keeps what the Redis settings last said, for /healthz,
// /limits and the metrics, and logs each warning when it appears and
// when it goes away. Safe for concurrent use.
type settingsWatch struct {
	queues, limits redis.UniversalClient
	logger         *slog.Logger
	report         func(redisconf.Report) // the metrics
	warnings       atomic.Pointer[[]string]
}

// Warnings returns the latest warnings (nil: none, or not read yet).
func (w *settingsWatch) Warnings() []string {
	if p := w.warnings.Load(); p != nil {
		return *p
	}
	return nil
}

// check reads the settings once and returns them.
func (w *settingsWatch) check(ctx context.Context) redisconf.Report {
	rep := redisSettings(ctx, w.queues, w.limits)
	now := rep.Warnings()
	before := w.Warnings()
	for _, s := range now {
		if !slices.Contains(before, s) {
			w.logger.Warn("Redis settings break the limits' promises", "warning", s)
		}
	}
	for _, s := range before {
		if !slices.Contains(now, s) {
			w.logger.Info("Redis settings fixed", "was", s)
		}
	}
	w.warnings.Store(&now)
	w.report(rep)
	return rep
}

// run checks the settings every interval until ctx is done.
func (w *settingsWatch) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check(ctx)
		}
	}
}

// checkSettings is --check with a Redis named: it prints each master's
// settings and warnings; exit 1 (runtime) when --require-noeviction
// refuses them or Redis does not answer.
func checkSettings(ctx context.Context, cfg *config, stdout, stderr io.Writer) int {
	queues := cfg.redis.Client(2)
	defer queues.Close()
	limits := queues
	if cfg.ownLimits {
		limits = cfg.limits.Client(2)
		defer limits.Close()
	}
	rep := redisSettings(ctx, queues, limits)
	for _, n := range rep.Nodes {
		if n.Err != nil {
			fmt.Fprintf(stderr, "worker: Redis %s: %v\n", n.Addr, n.Err)
			return exitRuntime
		}
		fmt.Fprintf(stdout, "redis %s: maxmemory-policy %s, maxmemory %d, appendonly %s, save points %s\n", n.Addr, orUnknown(n.Policy), n.MaxMemory, n.AOF, n.RDB)
	}
	for _, w := range rep.Warnings() {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	if cfg.requireNoEviction {
		if err := refuseEviction(rep); err != nil {
			fmt.Fprintf(stderr, "worker: %v\n", err)
			return exitRuntime
		}
	}
	return exitOK
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
