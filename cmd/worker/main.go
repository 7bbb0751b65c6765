// Command worker is a production asynq worker whose tasks respect the global
// (Redis-backed) rate limits and quotas of a policy file:
//
//	worker --redis URL --policy FILE --concurrency N [--queues NAME=WEIGHT,...] [--metrics-addr ADDR]
//
// It serves the built-in task type http:call (package cmd/internal/httpcall)
// through the taskrl middleware, exports Prometheus metrics and a health
// check, reloads the policy file on SIGHUP and when it changes, and shuts
// down gracefully on SIGTERM or SIGINT. "worker --check --policy FILE"
// validates a policy file and exits. Run it with --help for every flag and
// the exit statuses. The policy file's http section (allow_hosts,
// settle_headers: see httpConf) is the worker's own: the library skips it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // policy time zones on machines without a zone database

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/redisurl"
	"github.com/taskrl/taskrl/cmd/internal/version"
	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/internal/keys"
	"github.com/taskrl/taskrl/policy"
)

// Exit statuses.
const (
	exitOK      = 0
	exitRuntime = 1 // failed while starting (Redis, listener) or running
	exitUsage   = 2 // refused before connecting: bad flags or policy file
)

const usageText = `Usage: worker --redis URL --policy FILE --concurrency N [--queues NAME=WEIGHT,...] [--metrics-addr ADDR] [flags]
       worker --check --policy FILE
       worker limits list|set|rm ...   (live per-key overrides; worker limits --help)
       worker status --policy FILE [--key K] [--json]   (what the limits do now)

Runs an asynq worker whose tasks respect the global rate limits and quotas of
a policy file, shared through Redis with every other worker. Built-in task
type: http:call, payload {"url": "...", "method": "POST", "business_id": "b7",
"headers": {...}, "body": <any JSON>}; sent with Idempotency-Key: <task id>
and X-Business-ID: <business_id>. 2xx: done; 429: backs off every worker for
Retry-After and reschedules; other 4xx: archived with the reason; 5xx and
network errors: retried. Built-in task type taskrl:fanout turns each tick of
a campaign that "enqueue --cron" schedules into its tasks, once per tick.

The policy file's http section is the worker's own, for http:call:
  http:
    allow_hosts: [api.example.com, "*.example.net:443"]   (see --allow-hosts)
    settle_headers:        (the answer's header carries the call's actual cost
      - {rule: vendor-points, header: X-Actual-Cost}    under a rule with a cost)

Flags (--name and -name are the same; values as --name=V or --name V):
  --redis URL              Redis to use for queues and limits (see --limits-redis): redis://[[user]:password@]host[:port][/db],
                           rediss://... (TLS), unix:///path.sock, or a bare host[:port].
                           Default: $REDIS_URL. This, --redis-cluster or --redis-sentinel is required.
  --redis-cluster NODES    a Redis Cluster instead, for queues and limits alike: its seed nodes as
                           host:port,host:port,... or redis://[[user]:password@]host:port?addr=host:port&...
                           (rediss:// for TLS). Default: $REDIS_CLUSTER_ADDRS.
  --redis-sentinel M@NODES the primary named M that Redis Sentinel manages, found through the
                           sentinels NODES (host:port,host:port,...), or a go-redis failover URL
                           redis://[[user]:password@]host:port?master_name=M&addr=host:port (the
                           URL's password is the sentinels'). Default: $REDIS_SENTINEL.
                           --redis, --redis-cluster and --redis-sentinel are exclusive (a flag
                           given beats the other forms' environment variables).
  --redis-password P       the Redis password (the primary's, for a sentinel), replacing any in the
                           URL (for a list of nodes, the only way to give one). Never printed.
  --redis-tls              reach Redis over TLS, verifying its certificate against the system's roots
                           (for host:port and node lists; a rediss:// URL says so itself).
  --redis-tls-ca FILE      verify Redis's certificate (every node's, the sentinels') against the CA
                           certificates in this PEM file instead of the system's roots, for a private
                           CA. Needs TLS (rediss:// or --redis-tls). Certificates are always verified.
  --limits-redis URL       keep the limits (every rule's state, throttle markers, live overrides) on
                           this Redis instead of the queues' one. Every worker of the fleet, and
                           worker status and worker limits, must be given the same. Default: the
                           queues' Redis. The flags below are the --redis ones for the limits' Redis
                           (no environment defaults; -password and -tls need one of the forms).
  --limits-redis-cluster NODES     as --redis-cluster
  --limits-redis-sentinel M@NODES  as --redis-sentinel
  --limits-redis-password P        as --redis-password
  --limits-redis-tls               as --redis-tls
  --limits-redis-tls-ca FILE       as --redis-tls-ca
  --policy FILE            policy file (YAML; see docs/policy.md). Required.
                           A file that is wrong in any way is refused before anything connects,
                           naming line, rule and field. While running, the worker reloads it on
                           SIGHUP and within a second of a change of its content: a file that does
                           not validate is refused (each error logged; the running policy stays).
  --check                  validate the --policy file, print its rules and exit (0: valid, 2: not);
                           connects to nothing, needs no other flag. For CI and deploy hooks.
                           With a Redis named by a flag (--redis..., --limits-redis...), also reports
                           its settings that break the limits (eviction policy, persistence), each
                           master of a Cluster (1 with --require-noeviction when one may evict).
  --require-noeviction     refuse to start (exit 1) when a Redis the worker uses may evict the
                           limits' keys: a maxmemory-policy other than noeviction with maxmemory set,
                           or one that cannot be read. Without it such a Redis is a warning, logged,
                           in worker status, the live page, /healthz and taskrl_redis_settings.
  --redis-check-interval D how often a running worker reads the Redis settings again (a failover
                           may bring other ones). Default 1m.
  --concurrency N          tasks processed at once by this worker, at least 1. Default 10.
  --queues LIST            queues to serve with their weights, NAME=WEIGHT,... (weights positive
                           integers; a bare NAME has weight 1). Default "default=1".
  --strict-priority        serve queues strictly by weight: lower ones only when higher are empty.
  --metrics-addr ADDR      serve Prometheus metrics at http://ADDR/metrics, a health check at
                           /healthz (200 while Redis answers, else 503), the limits' state as JSON
                           at /limits (as worker status --json) and a page showing it at /, e.g. ":9090" or
                           "127.0.0.1:0" (the chosen address is logged as "metrics listening").
                           Default: off.
  --shutdown-timeout D     on SIGTERM/SIGINT, how long running tasks may finish; tasks still running
                           then are put back in their queue for another worker. Default 30s.
                           A second signal stops at once (running tasks are recovered by asynq later).
  --shadow                 shadow mode for the whole worker: every rule is decided and counted
                           (taskrl_decisions_total outcome would_admit / would_wait,
                           taskrl_shadow_wait_seconds) but no task waits for it; for trying a policy
                           on live traffic. A rule alone can be in shadow mode with "mode: shadow".
  --keep-order             leave asynq's queues in their order. By default, when a task is
                           rescheduled a minute or more ahead, the tasks of the same backlog
                           pending behind it whose turn is a minute or more away are moved to the
                           scheduled set until shortly before it, so that they do not hold back
                           other tasks; and when a fair concurrency rule refuses a task, the
                           tasks of its other flows enqueued behind it move to the head of the
                           queue, so that those flows get their turn.
  --max-hold D             longest a task waits for its turn inside the worker; longer waits
                           reschedule the task. Default 500ms.
  --task-check-interval D  how long an idle worker sleeps between looks at its queues (asynq's
                           TaskCheckInterval; it sleeps between 0.5 and 1.5 times D; each look is
                           three Redis commands per queue). A task rescheduled to a booked slot is
                           moved to pending 1.5 D + 100ms before it and waits for it in a worker
                           slot. Default 1s (asynq's): an idle worker costs Redis what a plain asynq
                           server does; shorter D starts new tasks sooner and holds slots less.
  --throttle-budget D      archive a task that would wait longer than D for its limits in all
                           (0: never). Default 0.
  --local-share N          for "redis_unavailable: local": how many workers share the limits, each
                           enforcing 1/N of every limit while Redis is down. Default 1.
  --prefix STRING          prefix of every limiter key in Redis; workers sharing limits must use the
                           same one. Default "taskrl:".
  --http-timeout D         timeout of each http:call request (the task's deadline applies too).
                           Default 30s.
  --allow-hosts LIST       the only hosts http:call may call, on the first request and on every
                           redirect: host, *.example.com (names under it), IP, each with an optional
                           :port, comma-separated, e.g. "api.vendor.com,*.example.net:443". Beats the
                           policy file's http.allow_hosts. Without either, any host may be called
                           (logged at start). Either way, link-local and cloud metadata addresses
                           (169.254.0.0/16, fe80::/10, ...) are never dialled, checked on the address
                           after DNS resolution. A refused call is archived with the reason, unsent.
  --max-payload SIZE       archive, with the reason and without decoding it, a task whose payload
                           is larger: bytes, or with KiB or MiB (e.g. 64KiB). Default 1MiB.
  --log-format text|json   log format on stderr. Default text.
  --log-level LEVEL        debug, info, warn or error. Default info.
  --version                print the version (module version, commit, Go version) and exit.
  -h, --help               print this help and exit.

Durations are Go durations: 500ms, 30s, 5m.

Exit status: 0 after a clean shutdown (or --help); 2 when refused before
connecting to anything (bad flags, bad policy file); 1 when starting or running
failed (Redis unreachable, metrics address in use, ...).
`

// config is the parsed and validated command line.
type config struct {
	redis           redisurl.Target
	limits          redisurl.Target // --limits-redis..., if ownLimits
	ownLimits       bool
	pool            int // connections per Redis node
	policyPath      string
	concurrency     int
	queues          map[string]int
	queueOrder      []string // queue names in command-line order, for logs
	strictPriority  bool
	metricsAddr     string
	shutdownTimeout time.Duration
	maxHold         time.Duration
	taskCheck       time.Duration
	throttleBudget  time.Duration
	localShare      int
	prefix          string
	httpTimeout     time.Duration
	maxPayload      int            // bytes
	allowHosts      *egress.Policy // --allow-hosts; nil: the policy file's http.allow_hosts (httpConf)
	logFormat       string
	logLevel        slog.Level
	check           bool // --check: validate the policy file and exit
	// checkRedis: --check with a Redis given (the flags of either):
	// report its settings too.
	checkRedis        bool
	requireNoEviction bool          // --require-noeviction
	redisCheck        time.Duration // --redis-check-interval
	shadow            bool          // --shadow: decide every rule, enforce none
	keepOrder         bool          // --keep-order: no sweep
	policyData        []byte        // the policy file as read at start
}

// errVersion is parseFlags' answer to --version.
var errVersion = errors.New("version asked")

// usageError is a command line that cannot be run; cli prints it with a
// hint and exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// reloadSignals receives SIGHUP, which reloads the policy file; nil (never
// receives) unless main set it up.
var reloadSignals chan os.Signal

func main() {
	reloadSignals = make(chan os.Signal, 1)
	signal.Notify(reloadSignals, syscall.SIGHUP)
	// The first signal starts a graceful shutdown; a second one ends the
	// process at once with the default action. Both are queued, so a
	// second signal that arrives before the first is handled is not lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-sigs
		cancel()
		s := <-sigs
		signal.Reset(syscall.SIGTERM, os.Interrupt)
		if p, err := os.FindProcess(os.Getpid()); err == nil {
			_ = p.Signal(s)
		}
	}()
	os.Exit(cli(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// cli runs the worker with the given arguments and environment until ctx is
// done, and returns the exit status.
func cli(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "limits" {
		return limitsCLI(ctx, args[1:], getenv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "status" {
		return statusCLI(ctx, args[1:], getenv, stdout, stderr)
	}
	cfg, err := parseFlags(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		io.WriteString(stdout, usageText)
		return exitOK
	}
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, version.String("worker"))
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker: %v\nRun worker --help for usage.\n", err)
		return exitUsage
	}
	// Read before it is loaded: a change in between is seen as one by the
	// reloader, never missed.
	cfg.policyData, _ = os.ReadFile(cfg.policyPath)
	pol, err := policy.LoadFile(cfg.policyPath)
	hc, herr := parseHTTPConf(cfg.policyPath, cfg.policyData, pol)
	if err = errors.Join(err, herr); err != nil {
		if cfg.check {
			fmt.Fprintf(stderr, "%v\n", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "worker: refusing to start: the policy file cannot be used; nothing was started.\n%v\n", err)
		return exitUsage
	}
	if sh, ok := pol.Shed(); ok && sh.Signal == policy.ShedProbe {
		fmt.Fprintf(stderr, "worker: policy %s: shed.signal: probe is a Config.ShedProbe of a program using the library; the worker has none: use fleet_busy or upstream_errors\n", cfg.policyPath)
		return exitUsage
	}
	if cfg.check {
		names := make([]string, 0, len(pol.Rules()))
		for _, r := range pol.Rules() {
			names = append(names, r.Name)
		}
		hosts := ""
		if hc.allowHosts != nil {
			hosts = ", http.allow_hosts: " + strings.Join(hc.allowHosts, ", ")
		}
		fmt.Fprintf(stdout, "policy %s: ok, %d rules (%s), redis_unavailable: %s%s\n", cfg.policyPath, len(names), strings.Join(names, ", "), pol.FailureMode(), hosts)
		if cfg.checkRedis {
			return checkSettings(ctx, cfg, stdout, stderr)
		}
		return exitOK
	}
	logger := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	redis.SetLogger(redisLogger{logger.With("component", "go-redis")})
	if err := run(ctx, cfg, pol, hc, logger); err != nil {
		logger.Error("worker failed", "err", err)
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return exitRuntime
	}
	return exitOK
}

// parseFlags parses and validates the command line; getenv supplies
// REDIS_URL. The error is flag.ErrHelp for --help, otherwise a *usageError
// naming the flag.
func parseFlags(args []string, getenv func(string) string) (*config, error) {
	fs, f := newFlagSet(getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		// The flag package names flags with one dash; the usage text uses two.
		msg := strings.Replace(err.Error(), "flag provided but not defined: -", "unknown flag: --", 1)
		msg = strings.Replace(msg, "for flag -", "for flag --", 1)
		msg = strings.Replace(msg, "flag needs an argument: -", "flag needs an argument: --", 1)
		return nil, &usageError{msg: msg}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (every option is a --flag)", fs.Arg(0))
	}
	if *f.version {
		return nil, errVersion
	}
	cfg := &config{
		policyPath:        *f.policy,
		concurrency:       *f.concurrency,
		strictPriority:    *f.strict,
		metricsAddr:       *f.metricsAddr,
		shutdownTimeout:   *f.shutdown,
		maxHold:           *f.maxHold,
		taskCheck:         *f.taskCheck,
		throttleBudget:    *f.budget,
		localShare:        *f.localShare,
		prefix:            *f.prefix,
		httpTimeout:       *f.httpTimeout,
		logFormat:         *f.logFormat,
		check:             *f.check,
		requireNoEviction: *f.noEviction,
		redisCheck:        *f.redisCheck,
		shadow:            *f.shadow,
		keepOrder:         *f.keepOrder,
	}
	var err error
	if cfg.check {
		if cfg.policyPath == "" {
			return nil, usagef("--check needs --policy FILE: the policy file to validate")
		}
		// A Redis named on the command line is checked too.
		named := false
		fs.Visit(func(fl *flag.Flag) {
			named = named || strings.HasPrefix(fl.Name, "redis") && fl.Name != "redis-check-interval" || strings.HasPrefix(fl.Name, "limits-redis")
		})
		if named {
			if cfg.redis, _, err = f.redis.target(fs); err != nil {
				return nil, err
			}
			if cfg.limits, cfg.ownLimits, err = f.limits.target(fs); err != nil {
				return nil, err
			}
			cfg.checkRedis = true
		}
		return cfg, nil
	}
	if cfg.redis, _, err = f.redis.target(fs); err != nil {
		return nil, err
	}
	if cfg.limits, cfg.ownLimits, err = f.limits.target(fs); err != nil {
		return nil, err
	}
	if cfg.policyPath == "" {
		return nil, usagef("--policy is required: the policy file (YAML) with the rules to apply")
	}
	if cfg.concurrency < 1 {
		return nil, usagef("--concurrency must be at least 1, got %d", cfg.concurrency)
	}
	if cfg.queues, cfg.queueOrder, err = parseQueues(*f.queues); err != nil {
		return nil, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		zero bool // whether 0 is allowed
	}{
		{"--shutdown-timeout", cfg.shutdownTimeout, false},
		{"--max-hold", cfg.maxHold, false},
		{"--task-check-interval", cfg.taskCheck, false},
		{"--throttle-budget", cfg.throttleBudget, true},
		{"--redis-check-interval", cfg.redisCheck, false},
		{"--http-timeout", cfg.httpTimeout, false},
	} {
		if d.v < 0 || (d.v == 0 && !d.zero) {
			return nil, usagef("%s must be a positive duration, got %v", d.name, d.v)
		}
	}
	if cfg.localShare < 1 {
		return nil, usagef("--local-share must be at least 1, got %d", cfg.localShare)
	}
	if cfg.maxPayload, err = parseSize(*f.maxPayload); err != nil {
		return nil, usagef("--max-payload: %v", err)
	}
	if *f.allowHosts != "" {
		if cfg.allowHosts, err = egress.ParseList(*f.allowHosts); err != nil {
			return nil, usagef("--allow-hosts: %v", err)
		}
	}
	if cfg.prefix == "" {
		return nil, usagef("--prefix must not be empty")
	}
	if err := keys.ValidatePrefix(cfg.prefix); err != nil {
		return nil, usagef("--prefix: %v", err)
	}
	if cfg.logFormat != "text" && cfg.logFormat != "json" {
		return nil, usagef("--log-format must be text or json, got %q", cfg.logFormat)
	}
	if err := cfg.logLevel.UnmarshalText([]byte(*f.logLevel)); err != nil {
		return nil, usagef("--log-level must be debug, info, warn or error, got %q", *f.logLevel)
	}
	if cfg.metricsAddr != "" {
		if _, port, err := net.SplitHostPort(cfg.metricsAddr); err != nil {
			return nil, usagef("--metrics-addr must be host:port or :port, got %q", cfg.metricsAddr)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, usagef("--metrics-addr: port must be a number from 0 to 65535, got %q", port)
		}
	}
	// Every busy worker slot may use a connection for its limits while
	// asynq uses others; keep the pool from being the bottleneck.
	cfg.pool = max(10*runtime.GOMAXPROCS(0), 2*cfg.concurrency+10)
	return cfg, nil
}

// redisFlags are the Redis flags every command of the worker takes: those
// of the queues' Redis (name "redis": --redis, --redis-cluster, ...) and
// those of a separate Redis for the limits (name "limits-redis").
type redisFlags struct {
	name                                    string
	url, cluster, sentinel, password, tlsCA *string
	tls                                     *bool
}

// addRedisFlags defines the queues' Redis flags on fs; getenv supplies
// their environment defaults.
func addRedisFlags(fs *flag.FlagSet, getenv func(string) string) redisFlags {
	return addNamedRedisFlags(fs, "redis", getenv("REDIS_URL"), getenv("REDIS_CLUSTER_ADDRS"), getenv("REDIS_SENTINEL"))
}

// addLimitsRedisFlags defines the limits' Redis flags on fs: optional,
// with no environment defaults.
func addLimitsRedisFlags(fs *flag.FlagSet) redisFlags {
	return addNamedRedisFlags(fs, "limits-redis", "", "", "")
}

// addNamedRedisFlags defines the flags of one Redis, named after name,
// with the given defaults for its three forms.
func addNamedRedisFlags(fs *flag.FlagSet, name, url, cluster, sentinel string) redisFlags {
	return redisFlags{
		name:     name,
		url:      fs.String(name, url, ""),
		cluster:  fs.String(name+"-cluster", cluster, ""),
		sentinel: fs.String(name+"-sentinel", sentinel, ""),
		password: fs.String(name+"-password", "", ""),
		tls:      fs.Bool(name+"-tls", false, ""),
		tlsCA:    fs.String(name+"-tls-ca", "", ""),
	}
}

// target resolves the flags as fs parsed them: a flag given beats the
// other forms' environment variables; more than one form is a usage
// error, as is none for the queues' Redis. ok is false when none of the
// limits' Redis flags was given: the limits live with the queues.
func (f redisFlags) target(fs *flag.FlagSet) (t redisurl.Target, ok bool, err error) {
	url, cluster, sentinel := *f.url, *f.cluster, *f.sentinel
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	forms := []struct {
		flag string
		val  *string
	}{{f.name, &url}, {f.name + "-cluster", &cluster}, {f.name + "-sentinel", &sentinel}}
	given := set[f.name] || set[f.name+"-cluster"] || set[f.name+"-sentinel"]
	for _, form := range forms {
		if given && !set[form.flag] {
			*form.val = ""
		}
	}
	if url == "" && cluster == "" && sentinel == "" {
		if f.name != "redis" {
			for _, o := range []string{"-password", "-tls", "-tls-ca"} {
				if set[f.name+o] {
					return redisurl.Target{}, false, usagef("--%s%s needs --%s, --%s-cluster or --%s-sentinel", f.name, o, f.name, f.name, f.name)
				}
			}
			return redisurl.Target{}, false, nil
		}
		return redisurl.Target{}, false, usagef("--redis (or REDIS_URL), --redis-cluster (or REDIS_CLUSTER_ADDRS) or --redis-sentinel (or REDIS_SENTINEL) is required, e.g. --redis redis://localhost:6379/0")
	}
	t, err = redisurl.ParseTarget(url, cluster, sentinel, *f.password)
	if errors.Is(err, redisurl.ErrBoth) {
		if f.name != "redis" {
			return redisurl.Target{}, false, usagef("--%s, --%s-cluster and --%s-sentinel are exclusive: give one", f.name, f.name, f.name)
		}
		return redisurl.Target{}, false, usagef("%v", err)
	}
	if err != nil {
		flagName := "--" + f.name
		for _, form := range forms {
			if *form.val != "" {
				flagName = "--" + form.flag
			}
		}
		return redisurl.Target{}, false, usagef("%s: %v", flagName, err)
	}
	if *f.tls {
		t = t.WithTLS()
	}
	if *f.tlsCA != "" {
		if t, err = t.WithCA(*f.tlsCA); err != nil {
			return redisurl.Target{}, false, usagef("--%s-tls-ca: %v", f.name, err)
		}
	}
	return t, true, nil
}

// limitsTarget resolves a subcommand's Redis flags: the limits' Redis
// (--limits-redis..., else the queues' --redis...) and, when queues is
// set, the queues' too. A subcommand that reads only the limits needs no
// --redis when --limits-redis is given.
func limitsTarget(fs *flag.FlagSet, rf, lf redisFlags, queues bool) (q, l redisurl.Target, err error) {
	l, own, err := lf.target(fs)
	if err != nil {
		return q, l, err
	}
	if own && !queues {
		return l, l, nil
	}
	if q, _, err = rf.target(fs); err != nil || own {
		return q, l, err
	}
	return q, q, nil
}

// flagValues holds the flags' values as parsed.
type flagValues struct {
	redis, limits                                            redisFlags
	policy, queues, metricsAddr, prefix, logFormat, logLevel *string
	maxPayload, allowHosts                                   *string
	concurrency, localShare                                  *int
	strict, check, shadow, version, keepOrder, noEviction    *bool
	shutdown, maxHold, taskCheck, budget, httpTimeout        *time.Duration
	redisCheck                                               *time.Duration
}

// newFlagSet defines the worker's flags; getenv supplies REDIS_URL, the
// default of --redis. Every flag must be described in usageText.
func newFlagSet(getenv func(string) string) (*flag.FlagSet, *flagValues) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs, &flagValues{
		redis:       addRedisFlags(fs, getenv),
		limits:      addLimitsRedisFlags(fs),
		policy:      fs.String("policy", "", ""),
		concurrency: fs.Int("concurrency", 10, ""),
		queues:      fs.String("queues", "default=1", ""),
		strict:      fs.Bool("strict-priority", false, ""),
		check:       fs.Bool("check", false, ""),
		noEviction:  fs.Bool("require-noeviction", false, ""),
		redisCheck:  fs.Duration("redis-check-interval", time.Minute, ""),
		shadow:      fs.Bool("shadow", false, ""),
		keepOrder:   fs.Bool("keep-order", false, ""),
		version:     fs.Bool("version", false, ""),
		metricsAddr: fs.String("metrics-addr", "", ""),
		shutdown:    fs.Duration("shutdown-timeout", 30*time.Second, ""),
		maxHold:     fs.Duration("max-hold", 500*time.Millisecond, ""),
		taskCheck:   fs.Duration("task-check-interval", time.Second, ""),
		budget:      fs.Duration("throttle-budget", 0, ""),
		localShare:  fs.Int("local-share", 1, ""),
		prefix:      fs.String("prefix", "taskrl:", ""),
		httpTimeout: fs.Duration("http-timeout", 30*time.Second, ""),
		maxPayload:  fs.String("max-payload", "1MiB", ""),
		allowHosts:  fs.String("allow-hosts", "", ""),
		logFormat:   fs.String("log-format", "text", ""),
		logLevel:    fs.String("log-level", "info", ""),
	}
}

// parseSize reads a size in bytes: a whole number, optionally followed by
// KiB or MiB; at least 1 and at most 512MiB (Redis's largest string).
func parseSize(s string) (int, error) {
	n, unit := strings.TrimSpace(s), 1
	for _, u := range []struct {
		suffix string
		size   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}} {
		if v, ok := strings.CutSuffix(n, u.suffix); ok {
			n, unit = strings.TrimSpace(v), u.size
			break
		}
	}
	v, err := strconv.Atoi(n)
	if err != nil || v < 1 || v > (512<<20)/unit {
		return 0, fmt.Errorf("want a size between 1 and 512MiB, such as 1048576, 64KiB or 1MiB; got %q", s)
	}
	return v * unit, nil
}

// parseQueues parses NAME=WEIGHT,... into asynq's queue map and the names
// in order.
func parseQueues(s string) (map[string]int, []string, error) {
	queues := map[string]int{}
	var order []string
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, nil, usagef("--queues: empty entry in %q; want NAME=WEIGHT,...", s)
		}
		name, weight, hasWeight := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		w := 1
		if hasWeight {
			var err error
			w, err = strconv.Atoi(strings.TrimSpace(weight))
			if err != nil || w < 1 {
				return nil, nil, usagef("--queues: weight of queue %q must be a positive integer, got %q", name, strings.TrimSpace(weight))
			}
		}
		if name == "" {
			return nil, nil, usagef("--queues: empty queue name in %q", item)
		}
		if strings.IndexFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0 {
			return nil, nil, usagef("--queues: queue name %q contains a control character", name)
		}
		if _, dup := queues[name]; dup {
			return nil, nil, usagef("--queues: queue %q is listed twice", name)
		}
		queues[name] = w
		order = append(order, name)
	}
	return queues, order, nil
}

// queueList renders the queues as NAME=WEIGHT,... in command-line order.
func (c *config) queueList() string {
	parts := make([]string, len(c.queueOrder))
	for i, q := range c.queueOrder {
		parts[i] = q + "=" + strconv.Itoa(c.queues[q])
	}
	return strings.Join(parts, ",")
}

// unservedQueues returns the queues the policy's rules match that this
// worker does not serve.
func unservedQueues(p *policy.Policy, queues map[string]int) []string {
	var out []string
	for _, r := range p.Rules() {
		if q := r.Match.Queue; q != "" && queues[q] == 0 && !slices.Contains(out, q) {
			out = append(out, q)
		}
	}
	return out
}
