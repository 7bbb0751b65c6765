// Package e2e holds the end-to-end test of the product as a user runs it:
// the real worker and enqueue binaries, built from this module, against a
// real redis-server and a strict stand-in for a third-party API
// (internal/testkit/fakeapi). It has no code of its own.
//
// The tests whose load is light (tens of calls a second, bars on the
// limits rather than on the machine's speed) call t.Parallel and run three
// at a time (TestMain sets go test's -parallel to 3 unless it is given)
// once the others, which measure throughput, the simulator's agreement,
// failover timing, a learner's pace, how soon an operator's pause reaches
// every worker or fair shares of slots, have run alone.
//
// Test support: only tests, imported by nothing.
package e2e
