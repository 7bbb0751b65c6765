// Command enqueue enqueues fan-out campaigns of asynq tasks: at once, on a
// cron schedule, or not at all but estimated under a policy's limits.
//
//	enqueue --redis URL --type TYPE --url URL --count N [--businesses K] [--queue Q] [--max-retry N]
//
// enqueues N tasks of type TYPE (default "http:call") on queue Q (default
// "default") whose payload is
//
//	{"url": URL, "method": "POST", "business_id": "b<i%K+1>"}
//
// for task i = 0..N-1 (K default 1), each with asynq's MaxRetry N when
// --max-retry is given (0 is legal; default asynq's 25). --redis is a
// redis:// or rediss:// URL or a bare host:port; it defaults to $REDIS_URL,
// then to 127.0.0.1:6379. --redis-cluster NODES (default
// $REDIS_CLUSTER_ADDRS) uses a Redis Cluster instead: its seed nodes as
// host:port,host:port,... or a go-redis cluster URL
// (redis://[[user]:password@]host:port?addr=host:port&...).
// --redis-sentinel MASTER@NODES (default $REDIS_SENTINEL) uses the primary
// Redis Sentinel manages under that name, found through the sentinels NODES,
// or a go-redis failover URL with master_name=. A flag beats the other
// forms' environment variables, and the three flags are exclusive.
// --redis-password replaces the password of any form. --redis-tls reaches
// a host:port or node list over TLS; --redis-tls-ca FILE verifies the
// servers' certificates against the CA certificates of a PEM file instead
// of the system's roots (it needs TLS). Certificates are always verified.
//
// --payload-file FILE replaces --count (--url and --businesses are then
// ignored): one task per line of FILE, each line a JSON object, blank lines
// ignored. The whole file is checked first; a bad line is reported with its
// number and nothing is enqueued.
//
// Tasks are enqueued by --parallel calls in flight (default 32). A progress
// bar is drawn on stderr when stderr is a terminal; a summary line
//
//	enqueued 100000 tasks to queue "default" in 3.2s (31000/s)
//
// is printed on stdout at the end.
//
// --cron SPEC [--tz ZONE] [--campaign NAME] registers the same fan-out as a
// recurring campaign instead: the process runs an asynq Scheduler that
// enqueues one "taskrl:fanout" task per tick on the queue, until SIGINT or
// SIGTERM (then it exits 0), and a worker that handles that type (see
// cmd/internal/campaign.NewFanoutHandler) enqueues the tasks, exactly once per
// tick however many such processes run. SPEC is a 5-field cron spec, a
// descriptor such as "@weekly", or "@every 10s"; ZONE an IANA time zone
// (default UTC). NAME defaults to a hash of the arguments, so processes
// started with the same arguments are the same campaign. --key-prefix
// (default "taskrl:") starts the Redis keys of the campaign's claims.
//
// --max-waiting N --policy FILE refuses the campaign (exit 1, nothing
// enqueued, the message naming the rule, key and count) when more than N
// tasks already wait (rescheduled by the workers' middleware, in any
// queue) under a rule of the policy for a key one of its tasks would take
// (taskrl.CheckBacklog; --prefix: the workers' key prefix, default
// "taskrl:"): backpressure for a producer whose customer's backlog is
// already long.
//
// --dry-run --policy FILE enqueues nothing: it prints how long the
// campaign would take under the policy's limits now (or at --start, RFC
// 3339; with --cron, at the next tick), each task running --task-duration
// (default 1s, used by concurrency rules). With a Redis given (--redis,
// --redis-cluster, --redis-sentinel or their variables) it starts from
// what the workers (--prefix) already spent and have waiting for the
// campaign's keys; with none, or one that does not answer (a warning
// says so), from idle limits. --plot FILE.svg also writes the schedule as
// an SVG chart: tasks started per second against each rule's limit over
// time, the window resets and the finish (estimate.Report.Chart).
//
// --simulate --policy FILE --vendor SPEC enqueues nothing and needs no
// Redis: it runs --duration (default 24h) of a fleet's traffic on a virtual
// clock, --workers (default 3) × --concurrency (default 16) task slots taking
// tasks of --type on --queue from a backlog that never runs dry (its
// payloads: the lines of --payload-file in turn, else {"business_id":"b1"}),
// admitted under the policy as the worker's middleware admits them, against
// a vendor whose limit follows SPEC, phases such as
// "20/s for 1h, 5/s burst 3 for 30m, 20/s" (strict GCRA, 429 with
// Retry-After in whole seconds) or "20 at once for 1m, 10 at once" (a
// service that slows down above that many calls at once), answering in
// --latency (default 20ms). It prints one row per --interval (default a
// 24th of the duration): the vendor's limit, the rate the policy's first
// adaptive rule has learned, the calls, the share answered 429 and the
// share of the vendor's limit used (for a service: its slots, the slots
// the first adaptive concurrency rule learned, the calls in service and
// the latency's p99); then, with several payloads, what each got; then
// the totals. --plot FILE.svg also writes the rows as an SVG chart against
// the vendor's limit (simulate.Report.Chart).
//
// Exit status: 0 when every task was enqueued (or the scheduler stopped on a
// signal, or the estimate was printed); 1 when Redis failed or some tasks
// were not enqueued (the message says how many were); 2 for a usage error,
// which names the flag, or a bad payload or policy file.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	_ "time/tzdata" // --tz and policy zones on machines without a zone database

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/taskrl/taskrl/cmd/internal/campaign"
	"github.com/taskrl/taskrl/cmd/internal/estimate"
	"github.com/taskrl/taskrl/cmd/internal/redisurl"
	"github.com/taskrl/taskrl/cmd/internal/simulate"
	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/cmd/internal/version"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// defaultRedis is --redis when neither the flag nor REDIS_URL is set.
const defaultRedis = "127.0.0.1:6379"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: term.IsTerminal(int(os.Stderr.Fd())),
	})
	stop()
	os.Exit(code)
}

// quietRedis discards go-redis's internal log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// stdio is the process environment run works in.
type stdio struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// terminal reports whether stderr is a terminal (progress bar).
	terminal bool
}

// usageError is a command-line mistake: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// options are the parsed flags.
type options struct {
	redis                     string
	spec                      campaign.Spec
	payloadFile               string
	parallel                  int
	dryRun                    bool
	policy                    string
	taskDuration              time.Duration
	start                     time.Time
	redisFromEnv              bool // the Redis came from the environment
	redisCluster              string
	redisSentinel             string
	redisPassword             string
	redisTLS                  bool
	redisTLSCA                string
	cron, tz, name, keyPrefix string
	simulate                  bool
	sim                       simulate.Spec
	maxWaiting                int    // -1: no --max-waiting
	prefix                    string // the workers' --prefix, for --max-waiting and --dry-run
	redisGiven                bool   // a Redis flag or variable was given, not the default
	plot                      string // --plot: the SVG file of --dry-run or --simulate
}

func run(ctx context.Context, args []string, env stdio) int {
	// go-redis logs every failed dial on its own; the error reaches the
	// user once, through the command's own message.
	redis.SetLogger(quietRedis{})
	o, err := parse(args, env)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "enqueue: %v\n", err)
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintln(env.stderr, "run enqueue -h for usage")
		}
		return 2
	}
	switch {
	case o.simulate:
		err = simulateRun(o, env)
	case o.dryRun:
		err = dryRun(ctx, o, env)
	case o.spec.Cron != "":
		err = schedule(ctx, o, env)
	default:
		err = bulk(ctx, o, env)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "enqueue: %v\n", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

func parse(args []string, env stdio) (*options, error) {
	fs := flag.NewFlagSet("enqueue", flag.ContinueOnError)
	// Parse errors are reported by run, once; -h prints the usage on stdout.
	fs.SetOutput(io.Discard)
	var (
		o           options
		count       int
		businesses  int
		maxRetry    optInt
		start       string
		vendor      string
		retryAfter  string
		showVersion bool
	)
	fs.StringVar(&o.redis, "redis", "", "Redis `URL` (redis://, rediss:// or host:port); default $REDIS_URL, then "+defaultRedis)
	fs.StringVar(&o.redisCluster, "redis-cluster", "", "a Redis Cluster instead: seed `NODES` host:port,host:port,... or a redis:// cluster URL with addr= parameters; default $REDIS_CLUSTER_ADDRS")
	fs.StringVar(&o.redisSentinel, "redis-sentinel", "", "a Sentinel-managed primary instead: `MASTER@NODES` (the sentinels, host:port,...) or a redis:// failover URL with master_name=; default $REDIS_SENTINEL")
	fs.StringVar(&o.redisPassword, "redis-password", "", "Redis `password` (the primary's, for a sentinel), replacing any in the URL (never printed)")
	fs.BoolVar(&o.redisTLS, "redis-tls", false, "reach Redis over TLS (for host:port and node lists; rediss:// says so itself)")
	fs.StringVar(&o.redisTLSCA, "redis-tls-ca", "", "verify Redis's certificates against the CA certificates in this PEM `FILE` instead of the system's roots, for a private CA; needs TLS (rediss:// or --redis-tls). Certificates are always verified")
	fs.BoolVar(&showVersion, "version", false, "print the version (module version, commit, Go version) and exit")
	fs.StringVar(&o.spec.Type, "type", campaign.DefaultType, "task `type`")
	fs.StringVar(&o.spec.URL, "url", "", "the `URL` each generated http:call payload calls")
	fs.IntVar(&count, "count", 0, "`N` tasks to enqueue")
	fs.IntVar(&businesses, "businesses", 1, "business_id runs round-robin over b1..b`K`")
	fs.StringVar(&o.spec.Queue, "queue", "default", "asynq `queue`")
	fs.Var(&maxRetry, "max-retry", "asynq MaxRetry `N` for each task, 0 legal (default asynq's, 25)")
	fs.StringVar(&o.payloadFile, "payload-file", "", "JSON lines `FILE`, one payload object per line; replaces --count")
	fs.IntVar(&o.parallel, "parallel", campaign.DefaultParallel, "enqueue calls in flight")
	fs.IntVar(&o.maxWaiting, "max-waiting", -1, "refuse, enqueuing nothing, when more than `N` tasks already wait under a rule of --policy for a key a task would take")
	fs.StringVar(&o.prefix, "prefix", "taskrl:", "--max-waiting, --dry-run: the workers' key `prefix` (their --prefix)")
	fs.StringVar(&o.cron, "cron", "", "run a recurring campaign on this cron `SPEC` (5 fields, @daily, @every 10s, ...) until SIGINT/SIGTERM")
	fs.StringVar(&o.tz, "tz", "", "IANA time `ZONE` of --cron (default UTC)")
	fs.StringVar(&o.name, "campaign", "", "campaign `NAME` for --cron (default derived from the arguments)")
	fs.StringVar(&o.keyPrefix, "key-prefix", campaign.DefaultPrefix, "`prefix` of the campaign's Redis keys (--cron)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "enqueue nothing: estimate the campaign's duration under --policy")
	fs.StringVar(&o.policy, "policy", "", "policy `FILE` for --dry-run")
	fs.DurationVar(&o.taskDuration, "task-duration", estimate.DefaultTaskDuration, "how long each task runs, for concurrency rules in --dry-run")
	fs.StringVar(&start, "start", "", "--dry-run: when the campaign starts, RFC 3339 (default now)")
	fs.BoolVar(&o.simulate, "simulate", false, "enqueue nothing: simulate a fleet under --policy against --vendor")
	fs.StringVar(&vendor, "vendor", "", "--simulate: the vendor's limit over time, e.g. `\"20/s for 1h, 5/s\"` (or \"20 at once for 1m, 10 at once\": a service that slows down)")
	fs.IntVar(&o.sim.Workers, "workers", 3, "--simulate: worker processes")
	fs.IntVar(&o.sim.Concurrency, "concurrency", 16, "--simulate: task slots per worker")
	fs.DurationVar(&o.sim.Duration, "duration", 24*time.Hour, "--simulate: simulated time")
	fs.DurationVar(&o.sim.Interval, "interval", 0, "--simulate: one row per `D` (default duration/24)")
	fs.DurationVar(&o.sim.Latency, "latency", 20*time.Millisecond, "--simulate: the vendor's answer time")
	fs.IntVar(&o.sim.Backlog, "backlog", 0, "--simulate: tasks waiting at all times (default 1.5 s of the vendor's highest rate, at least 50)")
	fs.StringVar(&o.plot, "plot", "", "--dry-run, --simulate: also write the schedule as an SVG chart to `FILE` (tasks per second against the limits over time)")
	fs.StringVar(&retryAfter, "retry-after", "whole", "--simulate: what the vendor's 429 says: `whole` seconds (rounded up), exact (a fractional wait) or none (the worker waits 1 s)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: enqueue --redis URL --type TYPE --url URL --count N [--businesses K] [--queue Q] [--max-retry N]\n"+
			"       enqueue ... --payload-file FILE\n"+
			"       enqueue ... --max-waiting N --policy FILE\n"+
			"       enqueue ... --cron SPEC [--tz ZONE] [--campaign NAME]\n"+
			"       enqueue ... --dry-run --policy FILE [--task-duration D] [--start TIME] [--plot FILE.svg]\n"+
			"       enqueue --simulate --policy FILE --vendor SPEC [--retry-after whole|exact|none] [--workers N] [--concurrency C] [--duration D] [--interval I] [--plot FILE.svg]\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(env.stdout)
			fs.Usage()
			return nil, err
		}
		return nil, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if showVersion {
		fmt.Fprintln(env.stdout, version.String("enqueue"))
		return nil, flag.ErrHelp // done: exit 0
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["plot"] {
		switch {
		case !o.dryRun && !o.simulate:
			return nil, usagef("--plot: only used with --dry-run or --simulate")
		case strings.TrimSpace(o.plot) == "":
			return nil, usagef("--plot: needs a file name, e.g. --plot schedule.svg")
		}
	}
	simFlags := []string{"vendor", "workers", "concurrency", "duration", "interval", "latency", "backlog", "retry-after"}
	if o.simulate {
		return parseSimulate(&o, vendor, retryAfter, set)
	}
	for _, f := range simFlags {
		if set[f] {
			return nil, usagef("--%s: only used with --simulate", f)
		}
	}

	if strings.TrimSpace(o.spec.Type) == "" {
		return nil, usagef("--type: must not be blank")
	}
	if o.spec.Type == campaign.TypeFanout {
		return nil, usagef("--type: %q is the campaign fan-out task itself", campaign.TypeFanout)
	}
	if strings.TrimSpace(o.spec.Queue) == "" {
		return nil, usagef("--queue: must not be blank")
	}
	if set["max-retry"] {
		if maxRetry.v < 0 {
			return nil, usagef("--max-retry: must not be negative, got %d", maxRetry.v)
		}
		o.spec.MaxRetry = &maxRetry.v
	}
	if o.parallel < 1 {
		return nil, usagef("--parallel: must be at least 1, got %d", o.parallel)
	}
	if o.payloadFile != "" {
		if set["count"] {
			return nil, usagef("--count: not allowed with --payload-file, which replaces it")
		}
		payloads, err := readPayloads(o.payloadFile)
		if err != nil {
			return nil, err
		}
		o.spec.URL = ""
		o.spec.Payloads = payloads
	} else {
		if !set["count"] {
			return nil, usagef("--count: required (or --payload-file)")
		}
		if count < 1 {
			return nil, usagef("--count: must be at least 1, got %d", count)
		}
		if businesses < 1 {
			return nil, usagef("--businesses: must be at least 1, got %d", businesses)
		}
		if err := campaign.CheckURL(o.spec.URL); err != nil {
			return nil, usagef("--url: %v", err)
		}
		o.spec.Count, o.spec.Businesses = count, businesses
	}

	if o.cron == "" {
		for _, f := range []string{"tz", "campaign", "key-prefix"} {
			if set[f] {
				return nil, usagef("--%s: only used with --cron", f)
			}
		}
	} else {
		if _, err := campaign.LoadZone(o.tz); err != nil {
			return nil, usagef("--tz: %v", err)
		}
		if _, err := campaign.ParseSchedule(o.cron, o.tz); err != nil {
			return nil, usagef("--cron: %v", err)
		}
		if set["campaign"] {
			if err := campaign.ValidateName(o.name); err != nil {
				return nil, usagef("--campaign: %v", err)
			}
		}
		if err := keys.ValidatePrefix(o.keyPrefix); err != nil {
			return nil, usagef("--key-prefix: %v", err)
		}
		o.spec.Cron, o.spec.TZ, o.spec.Prefix = o.cron, o.tz, o.keyPrefix
		if err := o.spec.Validate(); err != nil {
			return nil, usagef("%v", err)
		}
		if o.name == "" {
			o.name = o.spec.DefaultName()
		}
		o.spec.Name = o.name
	}

	if o.dryRun {
		if o.policy == "" {
			return nil, usagef("--policy: required with --dry-run")
		}
		if o.taskDuration <= 0 {
			return nil, usagef("--task-duration: must be positive, got %s", o.taskDuration)
		}
		if start != "" {
			t, err := time.Parse(time.RFC3339Nano, start)
			if err != nil {
				return nil, usagef("--start: want an RFC 3339 time such as 2026-05-04T09:00:00Z: %v", err)
			}
			o.start = t
		}
	} else {
		for _, f := range []string{"policy", "task-duration", "start"} {
			if set[f] && (f != "policy" || !set["max-waiting"]) {
				return nil, usagef("--%s: only used with --dry-run", f)
			}
		}
	}
	if set["prefix"] && !set["max-waiting"] && !o.dryRun {
		return nil, usagef("--prefix: only used with --max-waiting or --dry-run")
	}
	if err := keys.ValidatePrefix(o.prefix); err != nil {
		return nil, usagef("--prefix: %v", err)
	}
	if set["max-waiting"] {
		switch {
		case o.maxWaiting < 0:
			return nil, usagef("--max-waiting: must be 0 or more, got %d", o.maxWaiting)
		case o.dryRun || o.cron != "":
			return nil, usagef("--max-waiting: only for tasks enqueued now, not with --dry-run or --cron")
		case o.policy == "":
			return nil, usagef("--max-waiting: needs --policy, the workers' policy file, to know the tasks' rules and keys")
		}
	}

	o.spec = o.spec.Normalize()
	if err := o.spec.Validate(); err != nil {
		return nil, usagef("%v", err)
	}

	// A flag beats the environment; more than one form in either is an
	// error; with none, the default single Redis.
	flags, envs := 0, 0
	for _, f := range [][2]string{{"redis", "REDIS_URL"}, {"redis-cluster", "REDIS_CLUSTER_ADDRS"}, {"redis-sentinel", "REDIS_SENTINEL"}} {
		if set[f[0]] {
			flags++
		}
		if env.getenv(f[1]) != "" {
			envs++
		}
	}
	o.redisGiven = flags+envs > 0
	switch {
	case flags > 1 || flags == 0 && envs > 1:
		return nil, usagef("%v", redisurl.ErrBoth)
	case flags == 1:
	case env.getenv("REDIS_CLUSTER_ADDRS") != "":
		o.redisCluster, o.redisFromEnv = env.getenv("REDIS_CLUSTER_ADDRS"), true
	case env.getenv("REDIS_SENTINEL") != "":
		o.redisSentinel, o.redisFromEnv = env.getenv("REDIS_SENTINEL"), true
	case env.getenv("REDIS_URL") != "":
		o.redis, o.redisFromEnv = env.getenv("REDIS_URL"), true
	default:
		o.redis = defaultRedis
	}
	return &o, nil
}

// parseSimulate checks the flags of --simulate, which enqueues nothing.
func parseSimulate(o *options, vendor, retryAfter string, set map[string]bool) (*options, error) {
	for _, f := range []string{"redis", "redis-cluster", "redis-sentinel", "redis-password", "redis-tls", "redis-tls-ca", "url", "count", "businesses", "max-retry", "parallel", "cron", "tz", "campaign", "key-prefix", "dry-run", "task-duration", "start"} {
		if set[f] {
			return nil, usagef("--%s: not used with --simulate", f)
		}
	}
	if o.policy == "" {
		return nil, usagef("--policy: required with --simulate")
	}
	if vendor == "" {
		return nil, usagef("--vendor: required with --simulate, e.g. --vendor \"20/s for 1h, 5/s\"")
	}
	v, err := simulate.ParseVendor(vendor)
	if err != nil {
		return nil, usagef("--vendor: %v", err)
	}
	if v.RetryAfter, err = simulate.ParseRetryAfter(retryAfter); err != nil {
		return nil, usagef("--retry-after: %v", err)
	}
	o.sim.Vendor, o.sim.Type, o.sim.Queue = v, o.spec.Type, o.spec.Queue
	switch {
	case o.sim.Workers < 1:
		return nil, usagef("--workers: must be at least 1, got %d", o.sim.Workers)
	case o.sim.Concurrency < 1:
		return nil, usagef("--concurrency: must be at least 1, got %d", o.sim.Concurrency)
	case o.sim.Duration <= 0:
		return nil, usagef("--duration: must be positive, got %s", o.sim.Duration)
	case o.sim.Interval < 0 || set["interval"] && o.sim.Interval == 0:
		return nil, usagef("--interval: must be positive, got %s", o.sim.Interval)
	case o.sim.Duration/max(o.sim.Interval, time.Nanosecond) > 100_000 && o.sim.Interval > 0:
		return nil, usagef("--interval: %s makes more than 100000 rows of %s", o.sim.Interval, o.sim.Duration)
	case o.sim.Latency < 0:
		return nil, usagef("--latency: must not be negative, got %s", o.sim.Latency)
	case o.sim.Backlog < 0 || set["backlog"] && o.sim.Backlog == 0:
		return nil, usagef("--backlog: must be at least 1, got %d", o.sim.Backlog)
	}
	o.sim.Payloads = [][]byte{[]byte(`{"business_id":"b1"}`)}
	if o.payloadFile != "" {
		payloads, err := readPayloads(o.payloadFile)
		if err != nil {
			return nil, err
		}
		o.sim.Payloads = o.sim.Payloads[:0]
		for _, p := range payloads {
			o.sim.Payloads = append(o.sim.Payloads, []byte(p))
		}
		if set["backlog"] && o.sim.Backlog < len(payloads) {
			return nil, usagef("--backlog: %d cannot hold the %d payloads of --payload-file", o.sim.Backlog, len(payloads))
		}
	}
	return o, nil
}

// optInt is an int flag without a default value.
type optInt struct{ v int }

func (o *optInt) String() string {
	if o == nil || o.v == 0 {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not a whole number")
	}
	o.v = v
	return nil
}

// readPayloads reads a JSON-lines file, checking every line before returning.
func readPayloads(path string) ([]json.RawMessage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("--payload-file: %v", err)
	}
	defer f.Close()
	var out []json.RawMessage
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if err := campaign.CheckPayload(b); err != nil {
			return nil, usagef("--payload-file %s: line %d: %v; nothing enqueued", path, line, err)
		}
		out = append(out, append(json.RawMessage(nil), b...))
	}
	if err := sc.Err(); err != nil {
		return nil, usagef("--payload-file %s: after line %d: %v; nothing enqueued", path, line, err)
	}
	if len(out) == 0 {
		return nil, usagef("--payload-file %s: no payloads (only blank lines)", path)
	}
	return out, nil
}

// connect opens and pings the Redis of --redis, --redis-cluster or
// --redis-sentinel.
func connect(ctx context.Context, o *options, pool int) (redis.UniversalClient, error) {
	target, err := redisurl.ParseTarget(o.redis, o.redisCluster, o.redisSentinel, o.redisPassword)
	if err != nil {
		name := [2]string{"--redis", "REDIS_URL"}
		switch {
		case o.redisCluster != "":
			name = [2]string{"--redis-cluster", "REDIS_CLUSTER_ADDRS"}
		case o.redisSentinel != "":
			name = [2]string{"--redis-sentinel", "REDIS_SENTINEL"}
		}
		i := 0
		if o.redisFromEnv {
			i = 1
		}
		return nil, usagef("%s: %v", name[i], err)
	}
	if o.redisTLS {
		target = target.WithTLS()
	}
	if o.redisTLSCA != "" {
		if target, err = target.WithCA(o.redisTLSCA); err != nil {
			return nil, usagef("--redis-tls-ca: %v", err)
		}
	}
	rdb := target.Client(pool)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("cannot reach Redis at %s: %v", target, err)
	}
	return rdb, nil
}

// bulk enqueues the campaign now.
func bulk(ctx context.Context, o *options, env stdio) error {
	rdb, err := connect(ctx, o, o.parallel+4)
	if err != nil {
		return err
	}
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	spec := o.spec
	n := spec.Len()
	if o.maxWaiting >= 0 {
		if err := checkWaiting(ctx, rdb, o); err != nil {
			return err
		}
	}
	opts := spec.Options()
	src := func(i int) (*asynq.Task, []asynq.Option) {
		return asynq.NewTask(spec.Type, spec.Payload(i)), opts
	}

	var done atomic.Int64
	stopBar := func() {}
	if env.terminal {
		stopBar = progress(env.stderr, int64(n), &done)
	}
	began := time.Now()
	c, err := campaign.Enqueue(ctx, client, 0, n, o.parallel, src, &done)
	took := time.Since(began)
	stopBar()
	if err != nil {
		return fmt.Errorf("%d of %d tasks enqueued to queue %q; stopped at: %v", c.Enqueued, n, spec.Queue, err)
	}
	fmt.Fprintf(env.stdout, "enqueued %d tasks to queue %q in %s (%.0f/s)\n", c.Enqueued, spec.Queue, roundTook(took), float64(c.Enqueued)/max(took.Seconds(), 1e-9))
	return nil
}

// checkWaiting refuses the campaign, with a message, when more than
// --max-waiting tasks already wait in its queue under a rule of --policy
// for a key one of its tasks would take (a keyed rule's key, or a global
// rule's one).
func checkWaiting(ctx context.Context, rdb redis.UniversalClient, o *options) error {
	pol, err := policy.LoadFile(o.policy)
	if err != nil {
		return usagef("--policy: %v", err)
	}
	spec := o.spec
	b := pol.Bind(spec.Type, spec.Queue)
	if b == nil {
		return nil // no rule governs the tasks: none waits for one
	}
	seen := map[string]bool{}
	for i := range spec.Len() {
		payload := spec.Payload(i)
		keys, err := b.Keys(payload)
		if err != nil {
			continue // the workers archive it: it never waits
		}
		if k := strings.Join(keys, "\x00"); seen[k] {
			continue
		} else {
			seen[k] = true
		}
		err = taskrl.CheckBacklog(ctx, rdb, o.prefix, pol, spec.Type, spec.Queue, payload, o.maxWaiting)
		var be *taskrl.BacklogError
		switch {
		case errors.As(err, &be):
			what := fmt.Sprintf("rule %q", be.Rule)
			if be.Key != "" {
				what += fmt.Sprintf(" for key %q", be.Key)
			}
			return fmt.Errorf("refused by --max-waiting %d: %d tasks already wait under %s, which task %d would join; nothing enqueued", o.maxWaiting, be.Waiting, what, i+1)
		case err != nil:
			return fmt.Errorf("--max-waiting: %w", err)
		}
	}
	return nil
}

// progress draws a progress bar of done out of n on w until the returned
// function is called.
func progress(w io.Writer, n int64, done *atomic.Int64) (stop func()) {
	bar := progressbar.NewOptions64(n,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("enqueue"),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("tasks"),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionFullWidth(),
	)
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				bar.Set64(done.Load())
				fmt.Fprintln(w)
				return
			case <-tick.C:
				bar.Set64(done.Load())
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// schedule runs the recurring campaign until ctx is done.
func schedule(ctx context.Context, o *options, env stdio) error {
	rdb, err := connect(ctx, o, 4)
	if err != nil {
		return err
	}
	defer rdb.Close()
	logger := slog.New(slog.NewTextHandler(env.stderr, nil))
	return campaign.RunScheduler(ctx, rdb, o.spec, logger)
}

// dryRun prints the campaign's estimate under --policy: from what Redis
// holds now (units used, tasks waiting, status.Ahead) when a Redis was
// given (a flag or the environment) and answers, else from idle limits.
func dryRun(ctx context.Context, o *options, env stdio) error {
	p, err := policy.LoadFile(o.policy)
	if err != nil {
		return usageError{err.Error()}
	}
	start := o.start
	if start.IsZero() {
		start = time.Now()
		if o.spec.Cron != "" {
			sched, err := campaign.ParseSchedule(o.spec.Cron, o.spec.TZ)
			if err != nil {
				return usagef("--cron: %v", err)
			}
			start = sched.Next(start)
		}
	}
	spec := o.spec
	opt := estimate.Options{Start: start, TaskDuration: o.taskDuration}
	if o.redisGiven {
		rdb, err := connect(ctx, o, 4)
		var u usageError
		switch {
		case errors.As(err, &u):
			return err
		case err != nil:
			fmt.Fprintf(env.stderr, "enqueue: %v: estimating from idle limits\n", err)
		default:
			defer rdb.Close()
			opt.Ahead = func(rule, key string) (int, int, error) {
				return status.Ahead(ctx, rdb, o.prefix, p, rule, key)
			}
		}
	}
	rep, err := estimate.Run(p, estimate.Campaign{Type: spec.Type, Queue: spec.Queue, N: spec.Len(), Payload: spec.Payload}, opt)
	if err != nil {
		return err
	}
	if err := rep.Write(env.stdout); err != nil {
		return err
	}
	if o.plot != "" {
		return writePlot(o.plot, rep.Plot)
	}
	return nil
}

// writePlot writes the SVG that draw writes to path, through a temporary
// file in the same directory renamed over it: a reader never sees half a
// chart, and a failure leaves any previous file as it was.
func writePlot(path string, draw func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // not the temporary file's name
		}
		return fmt.Errorf("--plot %s: %v", path, err)
	}
	tmp := f.Name()
	w := bufio.NewWriter(f)
	err = draw(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("--plot %s: %v", path, err)
	}
	return nil
}

// simulateRun runs --simulate and prints its table.
func simulateRun(o *options, env stdio) error {
	p, err := policy.LoadFile(o.policy)
	if err != nil {
		return usageError{err.Error()}
	}
	spec := o.sim
	spec.Policy = p
	began := time.Now()
	rep, err := simulate.Run(spec)
	if err != nil {
		return usageError{err.Error()}
	}
	if err := rep.Write(env.stdout, spec, time.Since(began)); err != nil {
		return err
	}
	if o.plot != "" {
		return writePlot(o.plot, func(w io.Writer) error { return rep.Plot(w, spec) })
	}
	return nil
}

// roundTook rounds a duration for the summary line: to 100ms from a second
// up, to the millisecond below.
func roundTook(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}
