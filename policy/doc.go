// Package policy is taskrl's policy language: which rules of package limits
// apply to which asynq tasks, and which entity of each a task counts
// against. It imports neither Redis nor asynq; package taskrl runs a
// Policy in asynq workers.
//
// A Policy is a validated list of Rules. Each rule has a name, a Match (task
// type glob and/or queue), optional key templates that pick from the task's
// JSON payload the entity it limits ("{{.business_id}}"), the flow a fair
// rule shares its capacity among, and the units a task costs, and exactly
// one limit. Build one in Go with New, or from the YAML policy file the
// worker reads with Parse or LoadFile (docs/policy.md is the file's
// reference). A policy that is wrong in any way is refused whole, with a
// *Error per fault naming the line, the rule, the field and what is
// wrong.
//
// Policy.Bind returns the rules that apply to a (task type, queue) as a
// Binding: the rules as one quotas.Set decides them (Rules) and Request,
// which renders a payload into the limits.Request of a decision. Bindings
// are cached, so binding a task is one map lookup; tasks no rule matches
// bind to nil. Overrides (Policy.WithOverrides) give single keys limits of
// their own; Binding.ForKeys applies them.
//
// A Policy is immutable (the With methods return copies) and safe for
// concurrent use.
package policy
