// Package overrides keeps live per-key overrides in Redis, where every
// worker sees them within a second without a reload: "worker limits set
// per-business b7 'gcra: {rate: 5, per: 1s}'" writes one, the workers read
// them (Store.Version once a second, Store.List when it changed) and apply
// them over their policy file's (policy.Policy.WithOverrides).
//
// Layout (internal/keys.Overrides): a hash PREFIX "overrides:{o}" whose
// fields are the JSON array [rule, key] and whose values are the limit in
// the policy file's syntax, as given; and a counter PREFIX
// "overrides:{o}:version" that every change increments, in the same slot.
// Neither expires: they are configuration, kept until removed.
//
// Application code of the binaries, imported by cmd/worker.
package overrides

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/quotas"
)

// Store reads and writes the live overrides under one key prefix. Safe for
// concurrent use.
type Store struct {
	client        redis.UniversalClient
	hash, version string
}

// New returns the store of the workers that use prefix (their --prefix).
func New(client redis.UniversalClient, prefix string) *Store {
	h, v := keys.Overrides(prefix)
	return &Store{client: client, hash: h, version: v}
}

// Entry is one stored override.
type Entry struct {
	Rule, Key string
	// Spec is the limit as stored, in the policy file's syntax.
	Spec string
	// Limit is Spec parsed, nil when Err is set, or with Unlimited or Tier.
	Limit quotas.Limit
	// Unlimited: Spec is "unlimited", the key is exempt from the rule.
	Unlimited bool
	// Tier: Spec is "tier: PLAN", the key is on the rule's plan PLAN.
	Tier string
	// Err says why the entry cannot be used (a bad field name or limit),
	// nil when it can.
	Err error
}

// Override returns the entry as a policy.Override.
func (e Entry) Override() policy.Override {
	return policy.Override{Rule: e.Rule, Key: e.Key, Limit: e.Limit, Unlimited: e.Unlimited, Tier: e.Tier}
}

// Unlimited is the spec that exempts a key from its rule
// (policy.Override.Unlimited): "worker limits set per-business b7
// unlimited".
const Unlimited = "unlimited"

// tierSpec starts the spec that puts a key on a plan of its rule
// (policy.Override.Tier): "tier: pro" ("worker limits tier per-business b7
// pro").
const tierSpec = "tier:"

// TierSpec is the spec of plan.
func TierSpec(plan string) string { return tierSpec + " " + plan }

// ParseSpec parses a spec as Set takes it: Unlimited, "tier: PLAN" or a
// limit in the policy file's syntax (policy.ParseLimit), into the
// override's Limit, Unlimited or Tier.
func ParseSpec(spec string) (policy.Override, error) {
	s := strings.TrimSpace(spec)
	if s == Unlimited {
		return policy.Override{Unlimited: true}, nil
	}
	if plan, ok := strings.CutPrefix(s, tierSpec); ok {
		if plan = strings.TrimSpace(plan); plan == "" {
			return policy.Override{}, fmt.Errorf("tier: names no plan")
		}
		return policy.Override{Tier: plan}, nil
	}
	lim, err := policy.ParseLimit([]byte(spec))
	return policy.Override{Limit: lim}, err
}

// Set stores the limit spec (policy file syntax, e.g. "gcra: {rate: 5,
// per: 1s}", Unlimited or TierSpec(plan)) for key of rule, replacing any, after checking
// that spec parses; policy, if not nil, must also accept it (the rule
// exists, has a key and the same kind of limit, or may exempt a key).
func (s *Store) Set(ctx context.Context, rule, key, spec string, pol *policy.Policy) error {
	o, err := ParseSpec(spec)
	if err != nil {
		return err
	}
	if rule == "" || key == "" {
		return fmt.Errorf("the rule and the key must not be empty")
	}
	if pol != nil {
		o.Rule, o.Key = rule, key
		if _, err := pol.WithOverrides(o); err != nil {
			return err
		}
	}
	field, _ := json.Marshal([]string{rule, key})
	_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, s.hash, string(field), strings.TrimSpace(spec))
		p.Incr(ctx, s.version)
		return nil
	})
	return err
}

// Remove deletes the override of key of rule and reports whether there
// was one.
func (s *Store) Remove(ctx context.Context, rule, key string) (bool, error) {
	field, _ := json.Marshal([]string{rule, key})
	var n *redis.IntCmd
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		n = p.HDel(ctx, s.hash, string(field))
		p.Incr(ctx, s.version)
		return nil
	})
	if err != nil {
		return false, err
	}
	return n.Val() == 1, nil
}

// Version returns the change counter: a different value means the
// overrides changed (0: never set).
func (s *Store) Version(ctx context.Context) (int64, error) {
	v, err := s.client.Get(ctx, s.version).Int64()
	if err == redis.Nil {
		return 0, nil
	}
	return v, err
}

// List returns every stored override, sorted by rule and key, each parsed
// (Entry.Err when it cannot be).
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	m, err := s.client.HGetAll(ctx, s.hash).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(m))
	for field, spec := range m {
		e := Entry{Spec: spec}
		var rk []string
		if json.Unmarshal([]byte(field), &rk) != nil || len(rk) != 2 {
			e.Rule, e.Err = field, fmt.Errorf("not a [rule, key] field: %q", field)
		} else {
			e.Rule, e.Key = rk[0], rk[1]
			var o policy.Override
			o, e.Err = ParseSpec(spec)
			e.Limit, e.Unlimited, e.Tier = o.Limit, o.Unlimited, o.Tier
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return strings.Compare(a.Rule+"\x00"+a.Key, b.Rule+"\x00"+b.Key)
	})
	return out, nil
}
