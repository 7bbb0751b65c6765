// Package limits is the vocabulary of taskrl's limits: the kinds of limit
// (GCRA, Adaptive, FixedWindow, CalendarWindow, SlidingWindow,
// Concurrency), a named Rule, the checks every rule passes (Validate,
// RuleError) and the Request a caller makes of a set of rules. It holds
// values only and imports neither Redis nor asynq: the policy language
// (package policy) is written in it, and package quotas, which decides
// rules against Redis, names the same types (quotas.Rule is limits.Rule).
//
// Every type here is a plain value, safe to copy and share between
// goroutines.
package limits
