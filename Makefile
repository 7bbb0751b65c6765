# make test: the whole suite against real redis-server processes (a standalone
# server, a 3-master cluster, sentinels) started by internal/testkit/redistest
# on free loopback ports and stopped at the end. Installs redis-server, and
# Chromium for the live view's browser test, first when they are missing and
# the machine allows it (root with apt-get).

GO ?= go

.PHONY: test test-tools test-build test-beside test-short redis-server chromium check fuzz fuzz-ci fuzz-ci-httpcall fuzz-ci-egress fuzz-ci-policy bench fleet e2e-long

# The packages are tested one at a time (-p 1: their bars on timing must
# not share the cores), so their test binaries are built first on every
# core (-exec true runs none of them; 285 s of building at -p 1 on a fresh
# 2-core machine become 146 s), while redis-server and chromium install.
#
# test-beside runs beside the other packages' tests at nice 19: go vet and
# gofmt (91 s on a fresh machine), then BESIDE, whose tests decide on
# explicit clocks and bound nothing by the machine's speed (the engine's
# differential and property tests, the simulator, the estimator: about
# 250 s), on redis-servers of their own (the harness's children, niced
# with it). They use the CPU the end-to-end tests leave idle while they
# wait on real time: the end-to-end package's figures beside them were
# those of a run alone. Their output follows the rest's.
BESIDE = ./quotas ./gcra ./internal/calendar ./cmd/internal/simulate ./cmd/internal/estimate
HARNESS = $(GO) run ./internal/testkit/redistest/cmd/redisharness --
test:
	$(MAKE) -j2 test-tools test-build
	@beside=$$(mktemp); \
	nice -n 19 $(MAKE) --no-print-directory test-beside > $$beside 2>&1 & pid=$$!; \
	echo "beside, at nice 19: go vet, gofmt, $(BESIDE)"; \
	$(HARNESS) $(GO) test -race -count=1 -p 1 $$($(GO) list ./... | grep -v -x -F "$$($(GO) list $(BESIDE))"); rest=$$?; \
	wait $$pid; status=$$?; cat $$beside; rm -f $$beside; \
	[ $$rest = 0 ] && [ $$status = 0 ]
	cd bench && $(GO) test -count=1 ./...

test-tools:
	$(MAKE) --no-print-directory redis-server && $(MAKE) --no-print-directory chromium

test-build:
	$(GO) test -race -count=1 -exec true ./... > /dev/null

test-beside: check
	$(HARNESS) $(GO) test -race -count=1 -p 1 $(BESIDE)

# The inner loop, about a minute on 2 cores: no redis-server is started
# (redistest with -short); tests that need one skip, Example functions run
# on an embedded miniredis. make test runs everything.
test-short: check
	$(GO) test -short -count=1 ./...

check:
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

redis-server:
	@if command -v redis-server >/dev/null 2>&1; then \
		redis-server --version; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing redis-server with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null && redis-server --version; \
	else \
		echo "redis-server not found and cannot be installed here (needs root and apt-get)."; \
		echo "Install Redis 7: Debian/Ubuntu: sudo apt-get install redis-server; macOS: brew install redis"; \
		if [ "$$CI" = true ]; then exit 1; fi; \
	fi

chromium:
	@if command -v chromium >/dev/null 2>&1; then \
		chromium --version 2>/dev/null || true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium with apt-get (the live view's browser test)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null && chromium --version 2>/dev/null || true; \
	else \
		echo "chromium not found: the live view's browser test (cmd/worker TestLiveView) will skip."; \
	fi
	@if [ "$$CI" = true ] && ! command -v chromium >/dev/null 2>&1; then echo "chromium is required in CI"; exit 1; fi

# Short coverage-guided fuzzing of every fuzz target (not part of make test).
FUZZTIME ?= 30s
fuzz: redis-server
	$(GO) test ./internal/keys -run '^$$' -fuzz FuzzEncode -fuzztime $(FUZZTIME)
	$(GO) test ./internal/asynqstore -run '^$$' -fuzz FuzzDecode -fuzztime $(FUZZTIME)
	$(GO) test ./gcra -run '^$$' -fuzz FuzzDifferential -fuzztime $(FUZZTIME)
	$(GO) test ./quotas -run '^$$' -fuzz FuzzDifferential -fuzztime $(FUZZTIME)
	$(GO) test ./quotas -run '^$$' -fuzz FuzzKeys -fuzztime $(FUZZTIME)
	$(GO) test ./internal/calendar -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)
	$(GO) test ./policy -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME)
	$(GO) test ./policy -run '^$$' -fuzz FuzzRequest -fuzztime $(FUZZTIME)
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzNewRequest -fuzztime $(FUZZTIME)
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzRetryAfter -fuzztime $(FUZZTIME)
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzQuotaSpent -fuzztime $(FUZZTIME)
	$(GO) test ./internal/egress -run '^$$' -fuzz FuzzEgress -fuzztime $(FUZZTIME)

# What CI fuzzes beside make test: the targets over what a task's author
# controls (the http:call payload, the answers' Retry-After and rate-limit
# headers, key templates, egress patterns and URLs), a few seconds each.
# Budgets are counts of inputs, not durations: Go 1.26's fuzz coordinator
# can report "context deadline exceeded" as a failure when a -fuzztime
# duration ends while a worker is busy (golang/go#75804, fixed in Go
# 1.27); a count has no deadline to race. make test already runs every
# target's seed corpus and the regression cases kept in testdata/fuzz.
# Most of the time is building for fuzzing, which instruments every
# package imported, the standard library's too: on a fresh 2-core machine
# httpcall's targets take 103 s, after which policy's and egress's take 8 s
# and 9 s (all three side by side, each building the same packages: 155 s).
fuzz-ci: fuzz-ci-httpcall
	$(MAKE) -j2 fuzz-ci-egress fuzz-ci-policy

fuzz-ci-httpcall:
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzNewRequest -fuzztime 20000x
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzRetryAfter -fuzztime 30000x
	$(GO) test ./cmd/internal/httpcall -run '^$$' -fuzz FuzzQuotaSpent -fuzztime 30000x

fuzz-ci-egress:
	$(GO) test ./internal/egress -run '^$$' -fuzz FuzzEgress -fuzztime 200000x

fuzz-ci-policy:
	$(GO) test ./policy -run '^$$' -fuzz FuzzRequest -fuzztime 4000x

# Peer comparison benchmarks (separate module; see BENCHMARKS.md).
bench: redis-server
	cd bench && $(GO) run ./cmd/benchtable

# Fleet cost with the built worker (bench/fleet_test.go): idle workers'
# Redis commands per second against idle plain asynq servers in the same
# run (bar 1.5x), the start error of paced copies (bar p99 5 ms), and
# Redis commands per task and throughput with 0, 1 and 5 rules and under a
# backlog. About 2.5 minutes, not part of make test; figures in
# BENCHMARKS.md.
fleet: redis-server
	cd bench && TASKRL_FLEET=1 $(GO) test -count=1 -run 'TestIdleFleet|TestPacedStart|TestFleetCost|TestBacklogDrain' -v .

# The long versions of two tests: the adaptive-rule end-to-end scenarios
# at full length (phases of 60 s; also 6 workers, an API at 3/s and one
# at 300/s) and the 3-process fleet under a backlog of 100 times its rate
# (20 times in make test): about 10 minutes, not part of make test;
# figures in BENCHMARKS.md.
e2e-long: redis-server
	TASKRL_LONG=1 $(GO) run ./internal/testkit/redistest/cmd/redisharness -- $(GO) test -count=1 -timeout 30m -run 'TestAdaptive|TestFleetBacklog' -v ./cmd/internal/e2e ./taskrl
