// Package examplekit is what the runnable examples (examples/...) share, so
// that each example's file holds what is particular to its use case. The
// wiring a user copies (the policy parsed with policy.Parse,
// taskrl.New, mw.ServerConfig, mux.Use(mw.Handler), a handler turning
// a 429 into taskrl.Throttled) is written out in full in
// examples/quickstart; the other examples use this package's helpers for
// it.
//
//   - Redis: Open picks the Redis an example runs against: the real one at
//     REDIS_URL when it is set, otherwise an embedded Redis-compatible
//     server (github.com/alicebob/miniredis/v2) started in this process, so
//     that "go run ./examples/NAME" needs no setup. Namespace and Cleanup
//     give each run its own queues and keys and delete them afterwards, so
//     that a run against a shared Redis never touches anyone else's data
//     (and never FLUSHDBs).
//   - Env bundles a run's Redis, its stand-in API (internal/testkit/fakeapi) and
//     its namespace; Env.Close tears all of it down.
//   - Env.StartWorkers starts a Fleet: several asynq servers, each with its
//     own Redis client and its own taskrl middleware, as separate worker
//     processes would be; Fleet.Stop shuts the servers down, then closes
//     the middlewares.
//   - Caller is the handler of a task that calls a rate-limited HTTP API:
//     Idempotency-Key = the asynq task ID, X-Business-ID from the payload,
//     and a 429 turned into taskrl.Throttled.
//   - Problems, CheckQueue and Answered build an example's verdict; Main
//     runs an example and exits 1 when it fails.
//
// miniredis is good enough for a demonstration (taskrl's scripts and asynq
// run on it unchanged), but it is not what taskrl's correctness is proven
// against: the test suite runs against real redis-server processes.
//
// Example support, imported by the programs under examples/.
package examplekit
