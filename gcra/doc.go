// Package gcra is a rate limiter implementing the Generic Cell Rate
// Algorithm over Redis, shared by every process that uses the same Redis.
//
// A Limit{Rate, Period, Burst} has an emission interval T = Period/Rate. From
// an idle key, Burst requests are allowed at once, then one every T. The
// limiter stores one number per key, the theoretical arrival time (TAT), in
// integer microseconds: a request of cost n is allowed at time now iff
// max(TAT, now) + n·T − Burst·T ≤ now, and then the TAT moves to
// max(TAT, now) + n·T. When it is denied, RetryAfter is exactly how long until
// it would be allowed. The key expires when it is back at its full burst.
//
// Time is the Redis server's TIME, read inside the script, so worker clocks
// never enter a decision; tests and simulations may pass an explicit clock.
//
// Model runs the same arithmetic in process and is what the Redis limiter is
// tested against.
package gcra
