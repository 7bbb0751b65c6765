package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	_ "embed"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/history"
	"github.com/taskrl/taskrl/cmd/internal/metrics"
	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/policy"
)

const statusUsage = `Usage: worker status --policy FILE [--key K] [--json] [flags]
       worker status --policy FILE --waiting [--rule R [--key K]] [--queues LIST] [--limit N] [--json] [flags]

What the limits of a policy are doing now, as every worker sharing the Redis
and the --prefix sees them: per rule its limit (after the file's and the live
overrides), used, remaining, when it resets, until when an upstream throttle
blocks it, and the rate it decides at (learned, for an adaptive rule). A rule
keyed by a payload field shows its 10 busiest keys, or, with --key, that key.

With --waiting, the tasks that wait for the limits instead: each under the ID
its producer got from Enqueue, in asynq's scheduled set of --queues, with its
rules' keys, how long until its booked slot (or until it decides again) and
the reason asynq shows as its last error; all of them, those of --rule, or
those of --rule whose key is --key. At most 100,000 scheduled tasks are read
per queue.

Flags (before or after the arguments):
  --policy FILE  the workers' policy file. Required.
  --key K        the key to show for keyed rules (e.g. a business id).
  --json         print JSON (the same as a worker's /limits) instead of a table.
  --waiting      list the waiting tasks instead (see above).
  --rule R       with --waiting: only the tasks of rule R.
  --queues LIST  with --waiting: the queues to look in, NAME[=WEIGHT],... as for
                 the worker. Default "default".
  --limit N      with --waiting: list at most N tasks. Default 100.
  --redis URL, --redis-cluster NODES, --redis-sentinel M@NODES, --redis-password P, --redis-tls,
  --redis-tls-ca FILE
                 the workers' Redis, as for the worker (defaults $REDIS_URL,
                 $REDIS_CLUSTER_ADDRS, $REDIS_SENTINEL)
  --limits-redis URL, --limits-redis-cluster NODES, --limits-redis-sentinel M@NODES,
  --limits-redis-password P, --limits-redis-tls, --limits-redis-tls-ca FILE
                 the workers' --limits-redis, if they keep the limits on a Redis
                 of their own (then --redis is needed only with --waiting)
  --prefix S     the workers' --prefix. Default "taskrl:".
  -h, --help     print this help and exit.

Exit status: 0 done, 2 bad arguments or policy file, 1 Redis failed.
`

// statusCLI runs "worker status ...".
func statusCLI(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("worker status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	rf, lf := addRedisFlags(fs, getenv), addLimitsRedisFlags(fs)
	prefix := fs.String("prefix", "taskrl:", "")
	policyPath := fs.String("policy", "", "")
	key := fs.String("key", "", "")
	asJSON := fs.Bool("json", false, "")
	waitingOnly := fs.Bool("waiting", false, "")
	rule := fs.String("rule", "", "")
	queueList := fs.String("queues", "default", "")
	limit := fs.Int("limit", 100, "")
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "worker status: "+format+"\nRun worker status --help for usage.\n", a...)
		return exitUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			io.WriteString(stdout, statusUsage)
			return exitOK
		}
		return usage("%s", strings.Replace(err.Error(), " -", " --", 1))
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q (every option is a --flag)", fs.Arg(0))
	}
	if *policyPath == "" {
		return usage("--policy is required: the workers' policy file")
	}
	_, queues, err := parseQueues(*queueList)
	if err != nil {
		return usage("%v", err)
	}
	if !*waitingOnly && (*rule != "" || *limit != 100 || *queueList != "default") {
		return usage("--rule, --queues and --limit go with --waiting")
	}
	if *waitingOnly && *key != "" && *rule == "" {
		return usage("--key with --waiting names the tasks of one rule: give --rule too")
	}
	if *limit < 1 {
		return usage("--limit must be at least 1, got %d", *limit)
	}
	pol, err := policy.LoadFile(*policyPath)
	if err != nil {
		fmt.Fprintf(stderr, "worker status: %v\n", err)
		return exitUsage
	}
	if *rule != "" && !slices.ContainsFunc(pol.Rules(), func(r policy.Rule) bool { return r.Name == *rule }) {
		return usage("--rule: the policy has no rule %q", *rule)
	}
	qt, lt, err := limitsTarget(fs, rf, lf, *waitingOnly)
	if err != nil {
		return usage("%v", err)
	}
	client := qt.Client(4) // the queues': waiting tasks
	defer client.Close()
	limits := client
	if lt != qt {
		limits = lt.Client(4)
		defer limits.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The live overrides, as the workers apply them.
	if live, err := overrides.New(limits, *prefix).List(ctx); err == nil {
		for _, e := range live {
			if e.Err == nil {
				if q, err := pol.WithOverrides(e.Override()); err == nil {
					pol = q
				}
			}
		}
	}
	// out prints v as JSON with --json, else text() as a table.
	out := func(v any, text func() (string, error)) int {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(v); err != nil {
				return exitRuntime
			}
			return exitOK
		}
		t, err := text()
		if err != nil {
			fmt.Fprintf(stderr, "worker status: %v\n", err)
			return exitRuntime
		}
		io.WriteString(stdout, t)
		return exitOK
	}
	if *waitingOnly {
		ws, err := status.Waiting(ctx, client, pol, queues, *rule, *key, *limit)
		if err != nil {
			fmt.Fprintf(stderr, "worker status: %v\n", err)
			return exitRuntime
		}
		return out(ws, func() (string, error) {
			now, err := client.Time(ctx).Result()
			return status.WaitingText(ws, now), err
		})
	}
	rep, err := status.Collect(ctx, limits, *prefix, pol, *key)
	if err == nil {
		// The waiting index is on the queues' Redis.
		err = status.AddWaiting(ctx, client, *prefix, &rep)
	}
	if err == nil {
		rep.Warnings = redisSettings(ctx, client, limits).Warnings()
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker status: %v\n", err)
		return exitRuntime
	}
	return out(rep, func() (string, error) { return status.Text(rep), nil })
}

//go:embed status.html
var statusPage []byte

// limitsHandler serves the running policy's state as JSON (/limits), read
// at most once a second however many clients ask.
type limitsHandler struct {
	client   redis.UniversalClient
	prefix   string
	policy   func() *policy.Policy
	warnings func() []string // the Redis settings' (settingsWatch)

	mu   sync.Mutex
	at   time.Time
	rep  status.Report
	body []byte
}

// report returns the report and its JSON, read again if older than a
// second.
func (h *limitsHandler) report(ctx context.Context) (status.Report, []byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) >= time.Second {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rep, err := status.Collect(ctx, h.client, h.prefix, h.policy(), "")
		cancel()
		if err != nil {
			return status.Report{}, nil, err
		}
		rep.Warnings = h.warnings()
		body, err := json.Marshal(rep)
		if err != nil {
			return status.Report{}, nil, err
		}
		h.at, h.rep, h.body = time.Now(), rep, body
	}
	return h.rep, h.body, nil
}

func (h *limitsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, body, err := h.report(r.Context())
	if err != nil {
		http.Error(w, "reading the limits: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(body)
}

// flows counts each fair rule's flows holding slots and waiting in the
// report (taskrl_fair_flows), and at a rule with priorities those waiting
// at each level (taskrl_priority_flows); none while Redis cannot be read.
func (h *limitsHandler) flows() []metrics.FairFlows {
	rep, _, err := h.report(context.Background())
	if err != nil {
		return nil
	}
	var out []metrics.FairFlows
	for _, r := range rep.Rules {
		if !r.Fair {
			continue
		}
		f := metrics.FairFlows{Rule: r.Name}
		if r.Priorities {
			f.Levels = map[int]int{}
		}
		keys := r.Busiest
		if r.KeyState != nil {
			keys = []status.KeyState{*r.KeyState}
		}
		for _, k := range keys {
			for _, fl := range k.Flows {
				if fl.Held > 0 {
					f.Holding++
				}
				if fl.Waiting {
					f.Waiting++
				}
				if fl.Waiting && fl.Level > 0 {
					f.Levels[fl.Level]++
				}
			}
		}
		out = append(out, f)
	}
	return out
}

// historyHandler serves the history of the running policy's rules as JSON
// (/history, history.History), read at most once a second however many
// clients ask.
type historyHandler struct {
	reader *history.Reader
	policy func() *policy.Policy

	mu   sync.Mutex
	at   time.Time
	body []byte
	err  error // of the reading at h.at
}

func (h *historyHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.at) >= time.Second {
		// A failure is kept for the second too: an unreachable Redis is
		// not asked again by every client.
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		hist, err := h.reader.Read(ctx, h.policy())
		cancel()
		if err == nil {
			h.body, err = json.Marshal(hist)
		}
		h.at, h.err = time.Now(), err
	}
	if h.err != nil {
		http.Error(w, "reading the history: "+h.err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(h.body)
}

// servePage serves the live view, a page that reads /limits every 2 s.
func servePage(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(statusPage)
}
