package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Counter is a go-redis hook that counts the commands and the pipelines a
// client sends: add it with client.AddHook. Safe for concurrent use.
type Counter struct{ cmds, pipes atomic.Int64 }

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.pipes.Add(1)
		return next(ctx, cmds)
	}
}

// Take returns the commands and pipelines counted since the last Take and
// starts again from zero.
func (c *Counter) Take() (cmds, pipes int64) { return c.cmds.Swap(0), c.pipes.Swap(0) }

// RoundTrips returns the commands plus pipelines counted so far.
func (c *Counter) RoundTrips() int64 { return c.cmds.Load() + c.pipes.Load() }
