package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/policy"
)

// policyCheckInterval is how often the worker reads its policy file to see
// whether it changed: a change takes effect within about this long.
const policyCheckInterval = time.Second

// reloader keeps the middleware's policy in step with the policy file and
// the live overrides: it reloads the file on SIGHUP (a value on hup) and
// whenever its content changes, and the live overrides whenever their
// version in Redis changes. A file that does not validate leaves the
// running policy in place; its errors are logged, one line each, once per
// content. A live override the policy cannot take (its rule is gone, or
// has another kind of limit) is skipped with a warning.
type reloader struct {
	path   string
	apply  func(*policy.Policy, httpConf) error // the middleware's SetPolicy, and the http section's
	logger *slog.Logger
	result func(ok bool)              // counts a reload of the file; may be nil
	store  *overrides.Store           // the live overrides; nil: none
	counts func(applied, skipped int) // reports the live overrides; may be nil

	base    *policy.Policy    // the policy file's policy in force
	conf    httpConf          // the policy file's http section in force
	seen    []byte            // the content last loaded or refused
	live    []overrides.Entry // the live overrides as last read
	version int64             // of live; -1: never read
}

// run checks the file and the live overrides every interval, and the file
// on each value of hup, until ctx is done.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.check(true)
		case <-tick.C:
			r.check(false)
			r.pollLive(ctx)
		}
	}
}

// pollLive reads the live overrides if their version changed and applies
// them over the file's policy. It reports whether it applied a policy.
func (r *reloader) pollLive(ctx context.Context) bool {
	if r.store == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := r.store.Version(ctx)
	if err != nil || v == r.version {
		return false
	}
	live, err := r.store.List(ctx)
	if err != nil {
		return false
	}
	r.live, r.version = live, v
	if err := r.install(); err != nil {
		r.logger.Error("applying the live overrides failed", "err", err)
		return false
	}
	r.logger.Info("live overrides loaded", "version", v, "overrides", len(live))
	return true
}

// install applies the file's policy with the live overrides over it.
func (r *reloader) install() error {
	p, skipped := r.base, 0
	for _, e := range r.live {
		err := e.Err
		if err == nil {
			var q *policy.Policy
			if q, err = p.WithOverrides(e.Override()); err == nil {
				p = q
			}
		}
		if err != nil {
			skipped++
			r.logger.Warn("live override skipped", "rule", e.Rule, "key", e.Key, "limit", e.Spec, "err", strings.TrimPrefix(err.Error(), "policy: "))
		}
	}
	if err := r.apply(p, r.conf); err != nil {
		return err
	}
	if r.counts != nil {
		r.counts(len(r.live)-skipped, skipped)
	}
	return nil
}

// check reloads the file if it changed since it was last seen, or always
// when forced (SIGHUP). It reports whether a new policy was applied.
func (r *reloader) check(forced bool) bool {
	data, err := os.ReadFile(r.path)
	if err != nil {
		if forced || r.seen != nil {
			r.logger.Error("policy reload failed; keeping the running policy", "policy", r.path, "err", err)
			r.count(false)
		}
		r.seen = nil // the next readable content is new
		return false
	}
	if !forced && r.seen != nil && bytes.Equal(data, r.seen) {
		return false
	}
	r.seen = data
	p, err := policy.Parse(data)
	hc, herr := parseHTTPConf("", data, p)
	if err = errors.Join(err, herr); err != nil {
		lines := strings.Split(err.Error(), "\n")
		r.logger.Error("policy reload refused; keeping the running policy", "policy", r.path, "errors", len(lines))
		for _, l := range lines {
			r.logger.Error("policy error", "policy", r.path, "err", strings.TrimPrefix(l, "policy: "))
		}
		r.count(false)
		return false
	}
	old, oldConf := r.base, r.conf
	r.base, r.conf = p, hc
	if err := r.install(); err != nil {
		r.base, r.conf = old, oldConf
		r.logger.Error("policy reload failed; keeping the running policy", "policy", r.path, "err", err)
		r.count(false)
		return false
	}
	added, removed, changed := diffRules(old, p)
	r.logger.Info("policy reloaded", "policy", r.path, "rules", len(p.Rules()),
		"added", added, "removed", removed, "changed", changed, "redis_unavailable", string(p.FailureMode()))
	r.count(true)
	return true
}

func (r *reloader) count(ok bool) {
	if r.result != nil {
		r.result(ok)
	}
}

// diffRules names the rules of b that a lacks, of a that b lacks, and of
// both whose definition differs.
func diffRules(a, b *policy.Policy) (added, removed, changed []string) {
	old := map[string]policy.Rule{}
	for _, r := range a.Rules() {
		old[r.Name] = r
	}
	for _, r := range b.Rules() {
		o, ok := old[r.Name]
		switch {
		case !ok:
			added = append(added, r.Name)
		case !sameRule(o, r):
			changed = append(changed, r.Name)
		}
		delete(old, r.Name)
	}
	for name := range old {
		removed = append(removed, name)
	}
	slices.Sort(removed)
	return added, removed, changed
}

// sameRule reports whether a and b define the same rule (limits compared
// by their printed fields: a calendar window's zone is a pointer).
func sameRule(a, b policy.Rule) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}
