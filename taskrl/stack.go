package taskrl

// taskStack is how much stack growStack makes room for: enough for the
// middleware's decision (Limiter calls, prefetched units) and a handler
// such as http:call, which asynq runs on a new goroutine per task.
const taskStack = 8 << 10

// growStack makes room for taskStack bytes of stack below its caller, in
// one growth, while the goroutine's stack is still shallow. A task
// goroutine starts with a small stack (the average the runtime sees, most
// goroutines being idle) and otherwise doubles it two or three times deep
// in the decision and the handler, each time copying and adjusting every
// frame: a few µs per task (BENCHMARKS.md, session 15). Call it as
// growStack(0); i only keeps the compiler from dropping buf.
//
//go:noinline
func growStack(i int) byte {
	var buf [taskStack]byte
	return buf[i]
}
