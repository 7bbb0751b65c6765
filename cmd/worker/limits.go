package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

const limitsUsage = `Usage: worker limits list [flags]
       worker limits set RULE KEY LIMIT [flags]
       worker limits tier RULE KEY PLAN [flags]
       worker limits rm RULE KEY [flags]
       worker limits pause RULE [KEY] [--for D] [--reason TEXT] [flags]
       worker limits resume RULE [KEY] [flags]

Live per-key overrides, kept in Redis: every worker that shares the Redis
and the --prefix applies them over its policy file within about a second,
without a reload, and they stay until removed. LIMIT is one limit block in
the policy file's syntax, of the same kind as the rule's, or "unlimited":
the key is exempt from the rule (its other rules still apply). tier puts
the key on one of the rule's plans (tiers: in the policy), whatever plan
its payloads name; rm takes it off. E.g.

  worker limits set per-business b7 'gcra: {rate: 5, per: 1s, burst: 2}'
  worker limits set per-business b9 unlimited
  worker limits tier per-business b7 enterprise
  worker limits rm per-business b7
  worker limits list

KEY is the key as the rule's key template renders it from a payload (for
key "{{.business_id}}", the business id). A live override replaces one in
the policy file for the same rule and key. Workers whose policy has no such
keyed rule, or a rule of another kind, skip it with a warning.

pause holds every task of RULE (or of its key KEY) fleet-wide: workers
stop starting them within about a second; they wait in their queue under
their own ID, no retry spent, nothing archived, until resume (or until --for
has passed), then decide again and run at the rule's rate. A pause of the
same RULE and KEY replaces the one before. Workers log it with --reason and
who set it; list and worker status show it.

Flags (before or after the arguments):
  --redis URL, --redis-cluster NODES, --redis-sentinel M@NODES, --redis-password P, --redis-tls,
  --redis-tls-ca FILE
                 the workers' Redis, as for the worker (defaults $REDIS_URL,
                 $REDIS_CLUSTER_ADDRS, $REDIS_SENTINEL)
  --limits-redis URL, --limits-redis-cluster NODES, --limits-redis-sentinel M@NODES,
  --limits-redis-password P, --limits-redis-tls, --limits-redis-tls-ca FILE
                 the workers' --limits-redis, if they keep the limits on a Redis
                 of their own: the overrides live there (no --redis needed)
  --prefix S     the workers' --prefix. Default "taskrl:".
  --policy FILE  set: also check RULE, KEY and LIMIT against this policy file
                 (the rule exists, has a key, has the same kind of limit);
                 pause, resume: that RULE exists and, with KEY, has a key.
  --for D        pause: end the pause by itself after D (Go duration, e.g.
                 30s, 10m, 2h). Default: until resume.
  --reason TEXT  pause: why, for the workers' logs and worker status.
  -h, --help     print this help and exit.

Exit status: 0 done, 2 bad arguments or LIMIT, 1 Redis failed.
`

// limitsCLI runs "worker limits ...".
func limitsCLI(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("worker limits", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	rf, lf := addRedisFlags(fs, getenv), addLimitsRedisFlags(fs)
	prefix := fs.String("prefix", "taskrl:", "")
	policyPath := fs.String("policy", "", "")
	pauseFor := fs.Duration("for", 0, "")
	reason := fs.String("reason", "", "")
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "worker limits: "+format+"\nRun worker limits --help for usage.\n", a...)
		return exitUsage
	}
	// Flags may come before, between or after the arguments.
	var pos []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				io.WriteString(stdout, limitsUsage)
				return exitOK
			}
			return usage("%s", strings.Replace(err.Error(), " -", " --", 1))
		}
		if fs.NArg() == 0 {
			break
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	want := map[string]int{"list": 0, "set": 3, "tier": 3, "rm": 2, "pause": 1, "resume": 1}
	if len(pos) == 0 {
		return usage("want list, set, tier, rm, pause or resume")
	}
	n, ok := want[pos[0]]
	if !ok {
		return usage("unknown command %q: want list, set, tier, rm, pause or resume", pos[0])
	}
	if pos[0] == "tier" && len(pos) == 4 {
		// tier RULE KEY PLAN is set RULE KEY "tier: PLAN".
		if pos[3] == "" {
			return usage("tier: PLAN must not be empty")
		}
		pos = []string{"set", pos[1], pos[2], overrides.TierSpec(pos[3])}
	}
	pausing := pos[0] == "pause" || pos[0] == "resume"
	switch {
	case pausing && (len(pos) < 2 || len(pos) > 3):
		return usage("%s takes RULE and an optional KEY, got %d arguments", pos[0], len(pos)-1)
	case !pausing && len(pos)-1 != n:
		return usage("%s takes %d arguments, got %d", pos[0], n, len(pos)-1)
	case pos[0] != "pause" && (*pauseFor != 0 || *reason != ""):
		return usage("--for and --reason go with pause")
	case *pauseFor < 0:
		return usage("--for must be a positive duration, got %v", *pauseFor)
	case pausing && pos[1] == "":
		return usage("%s: RULE must not be empty", pos[0])
	}
	if pausing && len(pos) == 2 {
		pos = append(pos, "")
	}
	var pol *policy.Policy
	if *policyPath != "" {
		var err error
		if pol, err = policy.LoadFile(*policyPath); err != nil {
			fmt.Fprintf(stderr, "worker limits: %v\n", err)
			return exitUsage
		}
	}
	if pausing && pol != nil {
		i := slices.IndexFunc(pol.Rules(), func(r policy.Rule) bool { return r.Name == pos[1] })
		switch {
		case i < 0:
			return usage("%s: the policy has no rule %q", pos[0], pos[1])
		case pos[2] != "" && pol.Rules()[i].Key == "":
			return usage("%s: rule %q has no key: pause it whole (no KEY)", pos[0], pos[1])
		}
	}
	if pos[0] == "set" {
		// The limit is checked before anything connects.
		if _, err := overrides.ParseSpec(pos[3]); err != nil {
			return usage("LIMIT %q: %v", pos[3], strings.TrimPrefix(err.Error(), "policy: "))
		}
	}
	_, target, err := limitsTarget(fs, rf, lf, false)
	if err != nil {
		return usage("%v", err)
	}
	client := target.Client(2)
	defer client.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	store := overrides.New(client, *prefix)
	fail := func(err error) int {
		fmt.Fprintf(stderr, "worker limits: %v\n", err)
		return exitRuntime
	}
	switch pos[0] {
	case "set":
		if err := store.Set(ctx, pos[1], pos[2], pos[3], pol); err != nil {
			var pe *policy.Error
			if errors.As(err, &pe) {
				fmt.Fprintf(stderr, "worker limits: %v\n", err)
				return exitUsage
			}
			return fail(err)
		}
		fmt.Fprintf(stdout, "set: rule %s key %s: %s\n", pos[1], pos[2], strings.TrimSpace(pos[3]))
	case "pause":
		p := taskrl.RulePause{Rule: pos[1], Key: pos[2], For: *pauseFor, Reason: *reason, By: operator(getenv)}
		if err := taskrl.PauseRule(ctx, client, *prefix, p); err != nil {
			return fail(err)
		}
		end := "until resumed"
		if p.For > 0 {
			end = "for " + p.For.String()
		}
		fmt.Fprintf(stdout, "paused: %s %s\n", pauseName(p.Rule, p.Key), end)
	case "resume":
		had, err := taskrl.ResumeRule(ctx, client, *prefix, pos[1], pos[2])
		if err != nil {
			return fail(err)
		}
		if !had {
			fmt.Fprintf(stdout, "not paused: %s\n", pauseName(pos[1], pos[2]))
		} else {
			fmt.Fprintf(stdout, "resumed: %s\n", pauseName(pos[1], pos[2]))
		}
	case "rm":
		had, err := store.Remove(ctx, pos[1], pos[2])
		if err != nil {
			return fail(err)
		}
		if !had {
			fmt.Fprintf(stdout, "no override for rule %s key %s\n", pos[1], pos[2])
		} else {
			fmt.Fprintf(stdout, "removed: rule %s key %s\n", pos[1], pos[2])
		}
	default:
		list, err := store.List(ctx)
		if err != nil {
			return fail(err)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "RULE\tKEY\tLIMIT")
		for _, e := range list {
			lim := e.Spec
			if e.Err != nil {
				lim += "  (unusable: " + strings.TrimPrefix(e.Err.Error(), "policy: ") + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Rule, e.Key, lim)
		}
		tw.Flush()
		ps, err := taskrl.RulePauses(ctx, client, *prefix)
		if err != nil {
			return fail(err)
		}
		if len(ps) > 0 {
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\nPAUSED\tKEY\tUNTIL\tBY\tREASON")
			for _, p := range ps {
				key := p.Key
				if key == "" {
					key = "(all)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Rule, key, pauseEnd(p.Until), p.By, p.Reason)
			}
			tw.Flush()
		}
	}
	return exitOK
}

// pauseName names a pause for people: rule R, or rule R key K.
func pauseName(rule, key string) string {
	if key == "" {
		return "rule " + rule
	}
	return "rule " + rule + " key " + key
}

// pauseEnd is a pause's end for people.
func pauseEnd(t time.Time) string {
	if t.IsZero() {
		return "resumed"
	}
	return t.UTC().Format(time.RFC3339)
}

// operator names who runs the command, for the workers' logs: $USER at
// the host.
func operator(getenv func(string) string) string {
	host, _ := os.Hostname()
	if u := getenv("USER"); u != "" {
		return u + "@" + host
	}
	return host
}
