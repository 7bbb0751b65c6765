package redistest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// EnvVar is the environment variable through which the servers started by
// Main or StartShared are handed to test processes. Its value is JSON:
//
//	{"standalone":{"addr":"127.0.0.1:P","run_id":"..."},"cluster":[{"addr":...,"run_id":...}, x3]}
//
// A process that finds it set only uses the servers after checking that each
// one still reports the recorded run_id.
const EnvVar = "TASKRL_REDISTEST"

// ErrRedisNotFound is returned by StartShared when redis-server is not on
// PATH. Its message tells the user how to install Redis.
var ErrRedisNotFound = errors.New(`redistest: redis-server not found on PATH; install Redis 7 (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis) or run "make test", which installs it where it can`)

type endpoint struct {
	Addr  string `json:"addr"`
	RunID string `json:"run_id"`
}

type sharedEnv struct {
	Standalone endpoint   `json:"standalone"`
	Cluster    []endpoint `json:"cluster"`
}

func (e *sharedEnv) clusterAddrs() []string {
	addrs := make([]string, len(e.Cluster))
	for i, n := range e.Cluster {
		addrs[i] = n.Addr
	}
	return addrs
}

func parseEnv(s string) (*sharedEnv, error) {
	var e sharedEnv
	if err := json.Unmarshal([]byte(s), &e); err != nil {
		return nil, fmt.Errorf("redistest: %s is not valid JSON: %w", EnvVar, err)
	}
	if e.Standalone.Addr == "" || e.Standalone.RunID == "" || len(e.Cluster) != 3 {
		return nil, fmt.Errorf("redistest: %s must name a standalone server and 3 cluster masters, each with addr and run_id", EnvVar)
	}
	for _, n := range e.Cluster {
		if n.Addr == "" || n.RunID == "" {
			return nil, fmt.Errorf("redistest: %s: cluster entry without addr or run_id", EnvVar)
		}
	}
	return &e, nil
}

// verifyEnv checks that every server named in e answers and reports the
// recorded run_id, so that tests are never pointed at a Redis server that
// this harness did not start (e.g. a port reused after the harness exited).
func verifyEnv(e *sharedEnv) error {
	for _, ep := range append([]endpoint{e.Standalone}, e.Cluster...) {
		info, err := rawDo(ep.Addr, 2*time.Second, "INFO", "server")
		if err != nil {
			return fmt.Errorf("redistest: %s names %s, which does not answer: %w", EnvVar, ep.Addr, err)
		}
		if got := infoField(info, "run_id"); got != ep.RunID {
			return fmt.Errorf("redistest: %s names %s with run_id %q, but the server there reports run_id %q; refusing to use a Redis server this harness did not start", EnvVar, ep.Addr, ep.RunID, got)
		}
	}
	return nil
}

// StartShared starts the servers that the tests of a whole run share: one
// standalone redis-server and a 3-master Redis Cluster, all on free loopback
// ports and in a fresh temporary directory. It returns the value to put into
// EnvVar for the test processes and a stop function that kills every server
// and removes the directory (safe to call more than once). If redis-server
// is not on PATH the error is ErrRedisNotFound.
//
// Main calls it when EnvVar is unset; the redisharness command calls it once
// for a whole "go test ./..." run.
func StartShared() (env string, stop func(), err error) {
	e, stop, err := startShared()
	if err != nil {
		return "", nil, err
	}
	b, err := json.Marshal(e)
	if err != nil {
		stop()
		return "", nil, err
	}
	return string(b), stop, nil
}

func startShared() (*sharedEnv, func(), error) {
	if _, err := lookRedis(); err != nil {
		return nil, nil, err
	}
	root, err := os.MkdirTemp("", "taskrl-redistest-")
	if err != nil {
		return nil, nil, fmt.Errorf("redistest: %w", err)
	}
	var (
		wg          sync.WaitGroup
		standalone  *proc
		nodes       []*proc
		sErr, cErr  error
		standaloneD string
	)
	standaloneD, sErr = mkdir(root, "standalone")
	wg.Add(2)
	go func() {
		defer wg.Done()
		if sErr == nil {
			standalone, sErr = startOnFreePort(standaloneD, nil, false)
		}
	}()
	go func() {
		defer wg.Done()
		// A cluster that does not settle (a bus port taken between our check
		// and the node's bind, by another run starting at the same moment)
		// is torn down and started again on other ports.
		for attempt := 0; attempt < 3; attempt++ {
			if nodes, cErr = startCluster(filepath.Join(root, "cluster"+strconv.Itoa(attempt))); cErr == nil {
				return
			}
		}
	}()
	wg.Wait()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			var all []*proc
			if standalone != nil {
				all = append(all, standalone)
			}
			all = append(all, nodes...)
			var w sync.WaitGroup
			for _, p := range all {
				w.Add(1)
				go func() { defer w.Done(); p.kill() }()
			}
			w.Wait()
			_ = os.RemoveAll(root)
		})
	}
	if err := errors.Join(sErr, cErr); err != nil {
		stop()
		return nil, nil, err
	}
	e := &sharedEnv{Standalone: endpoint{standalone.addr(), standalone.runID}}
	for _, n := range nodes {
		e.Cluster = append(e.Cluster, endpoint{n.addr(), n.runID})
	}
	return e, stop, nil
}

func mkdir(root, name string) (string, error) {
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("redistest: %w", err)
	}
	return dir, nil
}
