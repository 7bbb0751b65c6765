package redistest

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook that counts the commands and the pipelines a
// client sends: add it with client.AddHook. Safe for concurrent use.
type Counter struct {
	cmds, pipes atomic.Int64
	mu          sync.Mutex
	kinds       map[string]int64
}

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		c.count(kind(cmd))
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipes.Add(1)
		k := "pipeline"
		if len(cmds) > 0 {
			k += "(" + kind(cmds[0]) + ")"
		}
		c.count(k)
		return next(ctx, cmds)
	}
}

func (c *Counter) count(k string) {
	c.mu.Lock()
	if c.kinds == nil {
		c.kinds = map[string]int64{}
	}
	c.kinds[k]++
	c.mu.Unlock()
}

// kind names a command by its name and, for scripts, the shape of its first
// key (the key up to its hash tag), e.g. "evalsha asynq:{", "fcall taskrl:q:{", "get taskrl:block:{".
func kind(cmd redis.Cmder) string {
	args := cmd.Args()
	name := strings.ToLower(cmd.Name())
	key := 1
	if name == "evalsha" || name == "eval" || name == "fcall" {
		key = 3
	}
	if len(args) > key {
		if s, ok := args[key].(string); ok {
			if i := strings.IndexByte(s, '{'); i >= 0 {
				s = s[:i+1]
			}
			return name + " " + s
		}
	}
	return name
}

// Take returns the commands and pipelines counted since the last Take and
// starts again from zero.
func (c *Counter) Take() (cmds, pipes int64) { return c.cmds.Swap(0), c.pipes.Swap(0) }

// RoundTrips returns the commands plus pipelines counted so far.
func (c *Counter) RoundTrips() int64 { return c.cmds.Load() + c.pipes.Load() }

// Kinds returns the round trips counted so far by kind (see kind), one
// "kind=count" per element, most frequent first.
func (c *Counter) Kinds() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.kinds))
	for k, n := range c.kinds {
		out = append(out, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Slice(out, func(i, j int) bool {
		var a, b int64
		fmt.Sscan(out[i][strings.LastIndexByte(out[i], '=')+1:], &a)
		fmt.Sscan(out[j][strings.LastIndexByte(out[j], '=')+1:], &b)
		return a > b
	})
	return out
}

// CommandCalls returns the server's count of calls of each command since
// its last CONFIG RESETSTAT (INFO commandstats), by lower-case name
// ("evalsha", "fcall", ...).
func CommandCalls(t testing.TB, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		out[name] = n
	}
	return out
}
