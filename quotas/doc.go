// Package quotas decides sets of rate and quota rules atomically against
// Redis: a request is admitted only if every rule of its Set admits it, and
// then every rule is charged; if any denies, none is, and the Decision names
// the rule with the longest wait.
//
// Rule kinds:
//   - GCRA: a rate with a burst (the arithmetic of package gcra);
//   - FixedWindow: Limit per window aligned to the Unix epoch;
//   - CalendarWindow: Limit per cron-defined window in an IANA time zone,
//     such as a day resetting at midnight in the vendor's zone;
//   - SlidingWindow: Limit in any interval, an exact log;
//   - Concurrency: at most Max holders, with leases, renewal, fencing tokens
//     and a reserve for critical work; or, Adaptive, a number of holders
//     learned from the latency each release reports (Lease.Outcome).
//
// Reserve books the earliest moment every rule admits a request, for work
// that will run then (a rescheduled task). A booking takes each rule's
// capacity at its own moment only: a GCRA rule places it in its own
// interval of the rule's virtual time (see GCRA), a window counts it in the
// window of its moment, a sliding window in the windows around it; so a
// request booked far ahead, because another rule (its entity's own rate)
// held it back until then, leaves the capacity before it to other
// requests, and no rule admits more than its limit in any span of time.
//
// A request costs Request.Cost units of every rule but concurrency rules,
// or Request.Costs per rule. Limiter.Settle changes an admitted or booked
// charge to what the request actually cost, per rule: the difference is
// given back as a refund would give it, or charged at once.
//
// Every rule applies to one key per entity: Request.Keys gives, per rule,
// the entity ("" for the rule's global key). Keys are built as
// PREFIX "q:{" ENTITY "}:" RULE ":" KIND, where ENTITY is the entity id
// escaped or hashed so that any bytes are safe, and every key expires when
// its state no longer matters.
//
// Time is the Redis server's TIME, read inside the script; worker clocks
// never decide. Calendar windows are computed in Go around the expected
// server time and checked by the script against the server's clock.
//
// On a single Redis a decision is one script call. Concurrent decisions of
// one Limiter share calls: while a few calls are in flight, the requests
// that arrive wait and go together in the next one, each still decided
// atomically and in order (Config.MaxBatch). On Redis Cluster the
// keys of one entity share a hash tag; rules on different entities (a
// global vendor key and a per-business key) are decided per slot in one
// parallel round trip and undone on denial, which never over-admits.
package quotas
