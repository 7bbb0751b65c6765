package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/cmd/internal/campaign"
	"github.com/taskrl/taskrl/cmd/internal/history"
	"github.com/taskrl/taskrl/cmd/internal/httpcall"
	"github.com/taskrl/taskrl/cmd/internal/metrics"
	"github.com/taskrl/taskrl/cmd/internal/overrides"
	"github.com/taskrl/taskrl/cmd/internal/status"
	"github.com/taskrl/taskrl/internal/egress"
	"github.com/taskrl/taskrl/policy"
	"github.com/taskrl/taskrl/taskrl"
)

// pingTimeout bounds the Redis check at start.
const pingTimeout = 5 * time.Second

// run starts the worker and serves tasks until ctx is done, then shuts down
// gracefully: no new tasks are taken, running ones get cfg.shutdownTimeout
// to finish (asynq puts the others back in their queue), then the
// middleware, the metrics server and the Redis client are closed. It returns
// an error when starting fails or the metrics server dies. hc is the
// policy file's http section.
func run(ctx context.Context, cfg *config, policy *policy.Policy, hc httpConf, logger *slog.Logger) error {
	client := cfg.redis.Client(cfg.pool)
	defer client.Close()
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", cfg.redis, err)
	}
	// The limits' Redis: --limits-redis..., else the queues'.
	limits := client
	if cfg.ownLimits {
		limits = cfg.limits.Client(cfg.pool)
		defer limits.Close()
		if err := limits.Ping(pctx).Err(); err != nil {
			return fmt.Errorf("cannot reach the limits' Redis at %s: %w", cfg.limits, err)
		}
		logger.Info("limits on their own Redis", "limits_redis", cfg.limits.String())
	}
	cancel()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.New(reg)
	if err != nil {
		return err
	}
	client.AddHook(m.RedisHook())
	if limits != client {
		limits.AddHook(m.RedisHook())
	}
	// The Redis settings that break the limits' promises: at start (a
	// refusal with --require-noeviction), then every --redis-check-interval.
	settings := &settingsWatch{queues: client, limits: limits, logger: logger, report: m.RedisSettings}
	if rep := settings.check(ctx); cfg.requireNoEviction {
		if err := refuseEviction(rep); err != nil {
			return err
		}
	}

	// The live page's history, counted by every worker (history package).
	var mw *taskrl.Middleware
	hist := history.NewRecorder(history.Config{Client: limits, Prefix: cfg.prefix, Logger: logger,
		Sample: func(ctx context.Context, busiest map[string][]string) (status.Report, error) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			rep, err := status.CollectKeys(ctx, limits, cfg.prefix, mw.Policy(), func(rule string) []string { return busiest[rule] })
			if err == nil {
				err = status.AddWaiting(ctx, client, cfg.prefix, &rep)
			}
			return rep, err
		}})
	mw, err = taskrl.New(taskrl.Config{
		Policy:         policy,
		Client:         client,
		LimitsClient:   limits,
		Prefix:         cfg.prefix,
		MaxHold:        cfg.maxHold,
		ThrottleBudget: cfg.throttleBudget,
		LocalShare:     cfg.localShare,
		Logger:         logger,
		Observer:       taskrl.ObserverFunc(func(e taskrl.Event) { m.Observe(e); hist.Observe(e) }),
		Shadow:         cfg.shadow,
		KeepOrder:      cfg.keepOrder,
	})
	if err != nil {
		return err
	}
	defer mw.Close()
	m.WatchShed(mw.ShedState)

	var redisErr atomic.Pointer[error] // last health check's failure, nil when fine
	srvCfg := mw.ServerConfig(asynq.Config{
		Concurrency:         cfg.concurrency,
		TaskCheckInterval:   cfg.taskCheck,
		Queues:              cfg.queues,
		StrictPriority:      cfg.strictPriority,
		ShutdownTimeout:     cfg.shutdownTimeout,
		Logger:              asynqLogger{logger.With("component", "asynq")},
		LogLevel:            asynqLevel(cfg.logLevel),
		ErrorHandler:        asynq.ErrorHandlerFunc(errorLogger(logger)),
		HealthCheckInterval: 5 * time.Second,
		HealthCheckFunc: func(err error) {
			if err == nil {
				redisErr.Store(nil)
			} else {
				redisErr.Store(&err)
			}
		},
	})

	var (
		metricsSrv  *http.Server
		metricsDone = make(chan error, 1)
	)
	if cfg.metricsAddr != "" {
		l, err := net.Listen("tcp", cfg.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		lh := &limitsHandler{client: limits, prefix: cfg.prefix, policy: mw.Policy, warnings: settings.Warnings}
		mux.Handle("/limits", lh)
		mux.Handle("/history", &historyHandler{reader: history.NewReader(limits, cfg.prefix), policy: mw.Policy})
		m.WatchFlows(lh.flows)
		mux.HandleFunc("/", servePage)
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if e := redisErr.Load(); e != nil {
				http.Error(w, "redis: "+(*e).Error(), http.StatusServiceUnavailable)
				return
			}
			// Healthy; the settings' warnings are details.
			body := "ok\n"
			for _, s := range settings.Warnings() {
				body += "warning: " + s + "\n"
			}
			w.Write([]byte(body))
		})
		metricsSrv = metricsServer(mux)
		go func() { metricsDone <- metricsSrv.Serve(l) }()
		logger.Info("metrics listening", "addr", l.Addr().String())
	}

	// http:call's egress policy (--allow-hosts, else the policy file's)
	// and settle headers, which a reload may change.
	guard := new(egress.Guard)
	guard.Set(cfg.egressPolicy(hc))
	logEgress(logger, guard.Policy(), cfg.allowHosts != nil)
	settle := new(atomic.Pointer[map[string]string])
	settle.Store(&hc.settle)
	apply := cfg.applyHTTP(guard, settle, logger, mw.SetPolicy)

	// The live overrides apply from the first task on.
	rl := &reloader{path: cfg.policyPath, apply: apply, logger: logger, result: m.PolicyReload, counts: m.Overrides,
		store: overrides.New(limits, cfg.prefix), base: policy, conf: hc, seen: cfg.policyData, version: -1}
	rl.pollLive(ctx)
	rctx, stopReload := context.WithCancel(ctx)
	defer stopReload()

	srv := asynq.NewServerFromRedisClient(client, srvCfg)
	mux := asynq.NewServeMux()
	mux.Use(maxPayload(cfg.maxPayload), mw.Handler)
	registerHandlers(mux, client, handlerDeps{
		httpClient: httpcall.NewClient(cfg.httpTimeout, guard),
		settle:     func() map[string]string { return *settle.Load() },
		metrics:    m,
		logger:     logger,
	})
	if err := srv.Start(mux); err != nil {
		if metricsSrv != nil {
			metricsSrv.Close()
		}
		return fmt.Errorf("starting the asynq server: %w", err)
	}
	rules := make([]string, 0, len(policy.Rules()))
	for _, r := range policy.Rules() {
		rules = append(rules, r.Name)
	}
	logger.Info("worker started",
		"redis", cfg.redis.String(), "tls", cfg.redis.TLS(),
		"queues", cfg.queueList(), "concurrency", cfg.concurrency,
		"policy", cfg.policyPath, "rules", rules, "redis_unavailable", string(policy.FailureMode()),
		"prefix", cfg.prefix, "shadow", cfg.shadow, "pid", os.Getpid())
	if q := unservedQueues(policy, cfg.queues); len(q) > 0 {
		logger.Warn("policy rules match queues this worker does not serve", "queues", q)
	}
	go rl.run(rctx, reloadSignals, policyCheckInterval)
	go settings.run(rctx, cfg.redisCheck)
	// The history's last counts are added once the running tasks are done.
	hctx, stopHist := context.WithCancel(context.WithoutCancel(ctx))
	histDone := make(chan struct{})
	go func() { defer close(histDone); hist.Run(hctx) }()

	var runErr error
	select {
	case <-ctx.Done():
		logger.Info("shutting down: no new tasks; waiting for running tasks", "timeout", cfg.shutdownTimeout)
	case err := <-metricsDone:
		runErr = fmt.Errorf("metrics server: %w", err)
		logger.Error("metrics server failed; shutting down", "err", err)
	}
	srv.Shutdown()
	stopHist()
	<-histDone
	mw.Close()
	if metricsSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := metricsSrv.Shutdown(sctx); err != nil {
			metricsSrv.Close()
		}
		cancel()
	}
	if runErr == nil {
		logger.Info("worker stopped")
	}
	return runErr
}

// egressPolicy is the egress policy of http:call under the policy file's
// http section hc: --allow-hosts when given, else hc's allow_hosts.
func (cfg *config) egressPolicy(hc httpConf) *egress.Policy {
	if cfg.allowHosts != nil {
		return cfg.allowHosts
	}
	e, err := egress.New(hc.allowHosts)
	if err != nil { // cannot happen: parseHTTPConf validated the hosts
		panic(err)
	}
	return e
}

// applyHTTP returns the reloader's apply: set (the middleware's SetPolicy),
// then the policy file's http section: its settle headers into settle,
// its allow_hosts into guard when they changed (--allow-hosts, when given,
// stays).
func (cfg *config) applyHTTP(guard *egress.Guard, settle *atomic.Pointer[map[string]string], logger *slog.Logger, set func(*policy.Policy) error) func(*policy.Policy, httpConf) error {
	return func(p *policy.Policy, hc httpConf) error {
		if err := set(p); err != nil {
			return err
		}
		settle.Store(&hc.settle)
		if e := cfg.egressPolicy(hc); !slices.Equal(e.Hosts(), guard.Policy().Hosts()) {
			guard.Set(e)
			logEgress(logger, e, false)
		}
		return nil
	}
}

// logEgress says which hosts http:call may call.
func logEgress(logger *slog.Logger, e *egress.Policy, flag bool) {
	if !e.Restricted() {
		logger.Warn("http:call is unrestricted: a task may make this worker call any host; set --allow-hosts or http.allow_hosts in the policy file. Link-local and cloud metadata addresses are refused")
		return
	}
	from := "policy file"
	if flag {
		from = "--allow-hosts"
	}
	logger.Info("http:call may call only the allowed hosts", "allow_hosts", e.Hosts(), "from", from)
}

// handlerDeps is what the built-in task handlers need besides Redis.
type handlerDeps struct {
	httpClient *http.Client
	settle     func() map[string]string // http:call's settle headers; nil: none
	metrics    *metrics.Metrics         // may be nil
	logger     *slog.Logger
}

// registerHandlers registers the built-in task types on mux: http:call and
// the fan-out of the campaigns "enqueue --cron" schedules.
func registerHandlers(mux *asynq.ServeMux, client redis.UniversalClient, deps handlerDeps) {
	mux.Handle(campaign.TypeFanout, campaign.NewFanoutHandler(client, campaign.WithLogger(deps.logger)))
	var opts []httpcall.Option
	if deps.metrics != nil {
		opts = append(opts, httpcall.WithResultHook(deps.metrics.HTTPCall))
	}
	opts = append(opts, httpcall.WithLogger(deps.logger), httpcall.WithSettleHeaders(deps.settle))
	mux.Handle(httpcall.TypeHTTPCall, httpcall.NewHandler(deps.httpClient, opts...))
}

// errorLogger logs each task that returned an error.
func errorLogger(logger *slog.Logger) func(ctx context.Context, t *asynq.Task, err error) {
	return func(ctx context.Context, t *asynq.Task, err error) {
		id, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		maxRetry, _ := asynq.GetMaxRetry(ctx)
		switch {
		case errors.Is(err, asynq.SkipRetry) || retried >= maxRetry:
			logger.Warn("task failed; archived", "type", t.Type(), "id", id, "queue", queue, "retried", retried, "err", err)
		default:
			logger.Warn("task failed; will retry", "type", t.Type(), "id", id, "queue", queue, "retried", retried, "max_retry", maxRetry, "err", err)
		}
	}
}

// maxPayload archives, with the reason, a task whose payload is larger
// than limit bytes, before anything decodes it (the policy's key
// templates, http:call).
func maxPayload(limit int) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if n := len(t.Payload()); n > limit {
				return fmt.Errorf("payload of %d bytes is larger than --max-payload (%d bytes); not decoded: %w", n, limit, asynq.SkipRetry)
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// metricsServer is the --metrics-addr server: a client that is slow to
// send its request or to read the answer is cut off.
func metricsServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
}
