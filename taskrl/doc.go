// Package taskrl is the asynq integration of the project: it binds named
// rate and quota rules (package quotas) to asynq tasks.
//
// The rules are a policy.Policy (package policy, the policy language): a
// validated list of rules, each with a name, a match (task type glob and/or
// queue), an optional key template that picks the entity it limits (a
// business id, a tenant) from the task's JSON payload, and exactly one limit
// of package limits. Build one in Go with policy.New, or from the YAML policy
// file the worker reads with policy.Parse or policy.LoadFile; a policy that
// is wrong in any way is refused whole, with errors naming the line, the
// rule, the field and what is wrong. policy.Policy.Bind returns the rules that
// apply to a (task type, queue), with the entity keys rendered from a
// payload; the middleware decides them atomically as one quotas.Set.
//
// Middleware applies a policy in asynq workers. A task no rule matches runs
// without a Redis call. Otherwise its rate and window rules book the
// earliest slot (quotas.Limiter.Reserve, one round trip): a slot within
// Config.MaxHold is waited for in the worker; a later one is booked and the
// task rescheduled to it, which frees the worker at once. A booking takes
// each rule's capacity at its slot only, so one entity's backlog booked far
// ahead leaves the time before it to the others; a fair rule (policy.Rule.Fair)
// also shares its rate evenly among the entities waiting, taking over the
// bookings of one ahead of its share, whose task then decides again before
// it runs. Tasks the policy's critical list selects may use reserved
// concurrency slots and come first at fair rules. Rescheduling
// parks the task in place: it becomes a scheduled task of asynq's again
// under the ID Enqueue returned, with its unique lock, retry count, options
// and headers, and the rule and moment it waits for as its LastErr. So
// asynq's guarantees hold while it waits (TaskID and Unique deduplication,
// Inspector.GetTaskInfo and DeleteTask by its ID, processed and failed
// counting real runs), and waiting for a limit never spends a retry, never
// archives a task (even with MaxRetry(0) or its retries spent) and never
// counts as a failure. asynq keeps scheduled tasks by whole seconds, so a
// pacer in every middleware moves each waiting task to pending at its
// booked slot, to the millisecond; it is also scheduled in asynq a little
// later, so it still runs if no pacer does. The handler never sees the
// middleware's taskrl-* headers; Booked tells it its slot. Concurrency rules are taken when the task
// runs, renewed while it runs and released when it returns or panics. A
// payload without a key field the policy needs is archived with the rule
// and field named.
//
// A handler whose remote side answered 429 returns Throttled(retryAfter,
// err): the middleware blocks the task's rate rules (those the policy's
// throttle list names, policy.Policy.WithThrottle) for every worker until then
// (new decisions through quotas.Limiter.Block, booked and waiting tasks
// through a marker they read before they run) and reschedules the task,
// without spending a retry. A handler whose call succeeded but spent the
// remote quota calls Pause to block the same rules without rescheduling.
//
// A rule with a Cost charges each task that many units of its limit,
// rendered from the payload ("{{.units}}"); a cost the rule can never
// admit is archived with the rule, the cost and the limit named. A
// handler that learns what its call really cost calls Settle (or
// SettleFromHeaders with the answer's headers): when it returns, the
// difference from the estimate is given back to, or charged to, every rule
// with a Cost, so that later tasks run that much sooner or later.
//
// When Redis cannot be reached, policy.Policy.FailureMode decides: policy.FailClosed
// (the default) keeps the task waiting in the worker, retrying with backoff,
// until Redis is back or the task's context ends (asynq itself needs Redis
// to hand out or finish tasks); policy.FailOpen runs it without limits; policy.FailLocal
// enforces every rule in this process at 1/Config.LocalShare of it
// (quotas.Model). After a failed call the middleware does not try Redis again for a
// second, so an outage costs each task nothing more than its mode's wait.
// No mode drops a task.
//
// Config.ThrottleBudget bounds how long a task may wait for its limits in
// all; a task that would wait longer is archived with a reason naming the
// budget. Config.Observer receives an Event per decision (outcome, rule,
// wait, each rule's remaining quota, Redis errors) for metrics.
package taskrl
