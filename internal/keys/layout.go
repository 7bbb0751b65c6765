package keys

import "strconv"

// The layout of every key the module writes, in one place. PREFIX is the
// configured prefix (default "taskrl:"); the part in braces is the key's
// Redis Cluster hash tag, so that every key one script touches is in one
// slot:
//
//	gcra.Limiter    PREFIX "gcra:{" Encode(key) "}"
//	quotas.Limiter  PREFIX "q:{" Tag(key) "}:" RULE ":" KIND...
//	block markers   PREFIX "block:{" Tag(key) "}:" RULE
//	pacer           PREFIX "pace:{" queue "}" (asynq's own tag for the
//	                queue's keys, like the sweep's; a minute past its last
//	                slot), that + ":moved" (ten minutes) and that +
//	                ":early" (ten minutes past its last slot)
//	sweep           PREFIX "sweep:{" queue "}" (asynq's own tag for the
//	                queue's keys, the slot its scripts share with them; a
//	                minute past its last estimated slot)
//	run started     PREFIX "ran:{" Encode(queue) "}:" Encode(ID "~" wait) (one minute)
//	live overrides  PREFIX "overrides:{o}" and that + ":version" (no TTL:
//	                configuration, kept until removed)
//	payload plans   PREFIX "plan:{" Tag(key) "}:" RULE (one day)
//	live history    PREFIX "hist:" STEP, that + ":s" (15m10s) and
//	                PREFIX "hist:sampler" (30 s unless renewed)

// Global is the hash tag of the keys of rules that limit no entity (an
// empty key): every worker's global rules share one slot.
const Global = "~g"

// Tag returns the hash tag of the keys of entity: Global for "", else
// Encode(entity).
func Tag(entity string) string {
	if entity == "" {
		return Global
	}
	return Encode(entity)
}

// GCRA returns the key of a gcra.Limiter's state for key.
func GCRA(prefix, key string) string { return prefix + "gcra:{" + Encode(key) + "}" }

// Rules is what follows PREFIX in the keys of quotas.Limiter, which
// appends "{" Tag(key) "}:" RULE ":" KIND... itself, in one allocation.
const Rules = "q:"

// Block returns the marker that blocks rule for entity after an upstream
// 429, in the slot of the rule's own keys.
func Block(prefix, rule, entity string) string {
	return prefix + "block:{" + Tag(entity) + "}:" + rule
}

// Pace returns the pacer's sorted set of the waiting tasks of queue. Its
// hash tag is asynq's for the queue's keys, as for Sweep: the scripts that
// park a task and move it back touch both.
func Pace(prefix, queue string) string { return prefix + "pace:{" + queue + "}" }

// Moved returns the ID of the task the pacer's last move of queue put
// deepest in asynq's pending list, in Pace's slot.
func Moved(prefix, queue string) string { return Pace(prefix, queue) + ":moved" }

// Early returns the sorted set of the tasks of queue the pacer moved to
// the tail of asynq's pending list ahead of their slots, in Pace's slot.
func Early(prefix, queue string) string { return Pace(prefix, queue) + ":early" }

// Sweep returns the hash of the sweep's lock and cursors for queue. Its
// hash tag is asynq's for the queue's keys ("asynq:{" queue "}:..."), raw
// as asynq writes it, because the sweep's scripts touch both: a prefix
// holds no brace (ValidatePrefix), so the tag is the same whatever the
// queue's name.
func Sweep(prefix, queue string) string { return prefix + "sweep:{" + queue + "}" }

// Ran returns the mark that the task with asynq task ID id in queue
// started its run after the wait that wait names.
func Ran(prefix, queue, id, wait string) string {
	return prefix + "ran:{" + Encode(queue) + "}:" + Encode(id+"~"+wait)
}

// Waiting returns the sorted set of the tasks waiting under rule for
// entity (asynq task ID -> when it is due, µs on the server's clock), in
// the slot of the rule's keys for entity: the index taskrl.Waiting reads.
func Waiting(prefix, rule, entity string) string {
	return prefix + "waiting:{" + Tag(entity) + "}:" + rule
}

// Busy returns the hash of the fleet's busy and total worker slots, one
// field per process, for the shed signal fleet_busy.
func Busy(prefix string) string { return prefix + "busy:{b}" }

// Overrides returns the hash of the live per-key overrides (worker limits)
// and the counter every change increments, in one slot.
func Overrides(prefix string) (hash, version string) {
	return prefix + "overrides:{o}", prefix + "overrides:{o}:version"
}

// History returns the live page's keys of one 5 s step (cmd/internal/
// history): the hash of the tasks counted in it and the string of its
// sample; HistorySampler the string naming the worker that samples. Each
// in a slot of its own: they are read and written in pipelines, never
// together in a script.
func History(prefix string, step int64) (counts, sample string) {
	counts = prefix + "hist:" + strconv.FormatInt(step, 10)
	return counts, counts + ":s"
}

// HistorySampler: see History.
func HistorySampler(prefix string) string { return prefix + "hist:sampler" }

// Plan returns the string naming the plan (policy.Rule.Tiers) a task's
// payload last put entity on under rule, for worker status.
func Plan(prefix, rule, entity string) string {
	return prefix + "plan:{" + Tag(entity) + "}:" + rule
}
