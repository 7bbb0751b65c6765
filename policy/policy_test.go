package policy

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
	"github.com/taskrl/taskrl/limits"
	"github.com/taskrl/taskrl/quotas"
)

// doc returns a valid one-rule document with its limit line replaced: the rule
// named "a" starts on line 2, its limit is on line 4.
func doc(limit string) string {
	return "rules:\n  - name: a\n    match: {type: \"http:call\"}\n    " + limit + "\n"
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, doc, want string
	}{
		{"yaml syntax", "rules: [", `policy: line 1: YAML: `},
		{"empty document", "# nothing\n", `policy: the document is empty`},
		{"two documents", "rules: []\n---\nrules: []\n", `policy: line 3: more than one YAML document`},
		{"top level not a mapping", "- a\n- b\n", `policy: line 1: must be a mapping, got a list`},
		{"unknown top-level field", "version: 2\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 1: version: unknown field; expected rules, redis_unavailable, critical, throttle, overrides, http or shed`},
		{"throttle not a list", "throttle: a\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 1: throttle: must be a list of rule names such as [per-business], got the string "a"`},
		{"throttle unknown rule", "throttle:\n  - a\n  - vendor\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 3: throttle[2]: no rule is named "vendor"`},
		{"throttle not a name", "throttle: [{a: 1}]\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 1: throttle[1]: must be a string, got a mapping`},
		{"critical not a list", "critical: {queue: c}\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 1: critical: must be a list of matchers such as - {queue: critical}, got a mapping`},
		{"critical empty matcher", "critical:\n  - {queue: c}\n  - {}\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 3: critical[2]: needs a task type (type: ...) or a queue`},
		{"critical bad glob", "critical:\n  - {type: \"pay:[\"}\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 2: critical[1].type: bad pattern "pay:[": syntax error in pattern`},
		{"critical unknown field", "critical:\n  - {queue: c, color: red}\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 2: critical[1].color: unknown field; expected type or queue`},
		{"critical numeric queue", "critical:\n  - queue: 5\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 2: critical[1].queue: must be a string, got the integer 5 (quote it)`},
		{"rules missing", "redis_unavailable: open\n", `policy: rules: missing; a policy needs a list of rules`},
		{"rules empty", "rules: []\n", `policy: line 1: rules: empty; a policy needs at least one rule`},
		{"rules null", "rules:\n", `rules: empty; a policy needs at least one rule`},
		{"rules not a list", "rules: {a: 1}\n", `policy: line 1: rules: must be a list of rules, got a mapping`},
		{"bad redis_unavailable", "redis_unavailable: maybe\n" + doc("gcra: {rate: 1, per: 1s}"), `policy: line 1: redis_unavailable: must be open, closed or local, got "maybe"`},
		{"rule not a mapping", "rules: [5]\n", `policy: line 1: rule 1: must be a mapping, got the integer 5`},
		{"unknown rule field", doc("gcra: {rate: 1, per: 1s}\n    limit: 5"), `policy: line 5: rule "a": limit: unknown field; expected name, match, key, default_key, fair, tier, priority, tiers, mode, soft, borrow, prefetch, cost, default_cost, gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency`},
		{"adaptive concurrency min 0", doc("adaptive_concurrency: {min: 0, max: 64, lease: 30s}"), `policy: line 4: rule "a": adaptive_concurrency.min: must be between 1 and max (64), got 0`},
		{"adaptive concurrency max too large", doc("adaptive_concurrency: {max: 2000000, lease: 30s}"), `policy: line 4: rule "a": adaptive_concurrency.max: must be at most 1000000 for an adaptive limit, got 2000000`},
		{"adaptive concurrency min above max", doc("adaptive_concurrency: {min: 80, max: 64, lease: 30s}"), `policy: line 4: rule "a": adaptive_concurrency.min: must be between 1 and max (64), got 80`},
		{"adaptive concurrency no lease", doc("adaptive_concurrency: {max: 64}"), `policy: line 4: rule "a": adaptive_concurrency.lease: missing; adaptive_concurrency needs max and lease`},
		{"adaptive concurrency short lease", doc("adaptive_concurrency: {max: 64, lease: 1s}"), `policy: line 4: rule "a": adaptive_concurrency.lease: must be at least 30s, asynq's own task lease`},
		{"adaptive concurrency reserved", doc("adaptive_concurrency: {max: 64, lease: 30s, reserved: 2}"), `policy: line 4: rule "a": adaptive_concurrency.reserved: unknown field; expected min, max or lease`},
		{"adaptive concurrency fair", doc("adaptive_concurrency: {max: 64, lease: 30s}\n    fair: \"{{.b}}\""), `policy: line 5: rule "a": fair: an adaptive concurrency rule learns one number of slots for all its tasks; it cannot be shared fairly (remove fair, or use concurrency)`},
		{"adaptive concurrency prefetch", doc("adaptive_concurrency: {max: 64, lease: 30s}\n    prefetch: 1s"), `policy: line 5: rule "a": prefetch: is not for an adaptive concurrency rule: each slot's call teaches it`},
		{"adaptive concurrency beside concurrency", doc("adaptive_concurrency: {max: 64, lease: 30s}\n    concurrency: {max: 3, lease: 30s}"), `policy: line 5: rule "a": has both adaptive_concurrency and concurrency; a rule has exactly one limit`},
		{"soft concurrency", doc("concurrency: {max: 2, lease: 30s}\n    soft: 10%"), `policy: line 5: rule "a": soft: only a gcra rate, a fixed quota window or a sliding window can be soft; this rule's limit is 2 at once, lease 30s (concurrency)`},
		{"soft adaptive", doc("adaptive: {max: 40, per: 1s}\n    soft: 0.1"), `policy: line 5: rule "a": soft: only a gcra rate, a fixed quota window or a sliding window can be soft; this rule's limit is learned 0.4-40 per 1s (adaptive)`},
		{"soft negative", doc("gcra: {rate: 1, per: 1s}\n    soft: -5%"), `policy: line 5: rule "a": soft: must be a share between 0 and 1000% (10), got -0.05`},
		{"soft too much", doc("gcra: {rate: 1, per: 1s}\n    soft: 20"), `policy: line 5: rule "a": soft: must be a share between 0 and 1000% (10), got 20`},
		{"soft not a share", doc("gcra: {rate: 1, per: 1s}\n    soft: lots%"), `policy: line 5: rule "a": soft: must be a share like 10% or 0.1, got "lots%"`},
		{"prefetch fair", doc("gcra: {rate: 1000, per: 1s, burst: 50}\n    fair: \"{{.b}}\"\n    prefetch: 5ms"), `policy: line 6: rule "a": prefetch: is not for a fair rule: each request of a fair rule is decided in turn with the other flows'`},
		{"prefetch past the burst", doc("gcra: {rate: 1000, per: 1s, burst: 5}\n    prefetch: 5ms"), `policy: line 5: rule "a": prefetch: 5ms takes 5 units of 1000/1s burst 5 (GCRA) ahead: the burst must be above that`},
		{"prefetch too long", doc("gcra: {rate: 1000, per: 1s, burst: 500}\n    prefetch: 1s"), `policy: line 5: rule "a": prefetch: must be between 1µs and 100ms, got 1s`},
		{"prefetch no unit", doc("gcra: {rate: 1000, per: 1s, burst: 500}\n    prefetch: 5"), `policy: line 5: rule "a": prefetch: 5 needs a unit, e.g. 5s (Go duration syntax: ms, s, m, h) (or off)`},
		{"prefetch negative", doc("quota: {limit: 500, every: 1s}\n    prefetch: -1ms"), `policy: line 5: rule "a": prefetch: must be between 1µs and 100ms, or off, got -1ms`},
		{"soft a list", doc("gcra: {rate: 1, per: 1s}\n    soft: [1]"), `policy: line 5: rule "a": soft: must be a number, got a list`},
		{"prefetch fair concurrency", doc("concurrency: {max: 40, lease: 30s}\n    fair: \"{{.b}}\"\n    prefetch: 5ms"), `policy: line 6: rule "a": prefetch: is not for a fair rule: each request of a fair rule is decided in turn with the other flows'`},
		{"fair window", doc("quota: {limit: 5, every: 1s}\n    fair: \"{{.b}}\""), `policy: line 5: rule "a": fair: only a gcra rate or a concurrency cap can be shared fairly; this rule's limit is 5 per 1s (fixed window)`},
		{"fair bad template", doc("gcra: {rate: 1, per: 1s}\n    fair: \"{{.b | x}}\""), `policy: line 5: rule "a": fair: bad template "{{.b | x}}": only field references such as {{.business_id}}`},
		{"fair not a string", doc("gcra: {rate: 1, per: 1s}\n    fair: [b]"), `policy: line 5: rule "a": fair: must be a string, got a list`},
		{"priority adaptive concurrency", doc("adaptive_concurrency: {min: 1, max: 20, lease: 30s}\n    priority: \"{{.p}}\""), `policy: line 5: rule "a": priority: orders the tasks waiting for a gcra rate or a concurrency cap; this rule's limit is`},
		{"priority window", doc("quota: {limit: 5, every: 1s}\n    priority: 1"), `policy: line 5: rule "a": priority: orders the tasks waiting for a gcra rate or a concurrency cap; this rule's limit is 5 per 1s (fixed window)`},
		{"priority zero", doc("gcra: {rate: 1, per: 1s}\n    priority: 0"), `policy: line 5: rule "a": priority: must be a level from 1 (first) to 5 (last) or a template such as "{{.priority}}", got "0"`},
		{"priority six", doc("gcra: {rate: 1, per: 1s}\n    priority: {level: 6}"), `policy: line 5: rule "a": priority: must be a level from 1 (first) to 5 (last) or a template such as "{{.priority}}", got "6"`},
		{"priority with text", doc("gcra: {rate: 1, per: 1s}\n    priority: \"p{{.p}}\""), `policy: line 5: rule "a": priority: a template of the level is one field such as "{{.priority}}", with no text around it, got "p{{.p}}"`},
		{"priority bad template", doc("gcra: {rate: 1, per: 1s}\n    priority: \"{{.p | x}}\""), `policy: line 5: rule "a": priority: bad template "{{.p | x}}": only field references such as {{.business_id}}`},
		{"priority empty block", doc("gcra: {rate: 1, per: 1s}\n    priority: {aging: 5s}"), `policy: line 5: rule "a": priority: gives no level: give level: "{{.priority}}" (or a level from 1 to 5), queues: {QUEUE: LEVEL}, or both`},
		{"priority queue level", doc("gcra: {rate: 1, per: 1s}\n    priority:\n      queues:\n        emails: 1\n        bulk: 9"), `policy: line 8: rule "a": priority.queues.bulk: must be a level from 1 (first) to 5 (last), got 9`},
		{"priority queue not a number", doc("gcra: {rate: 1, per: 1s}\n    priority: {queues: {emails: first}}"), `policy: line 5: rule "a": priority.queues.emails: must be a number, got the string "first"`},
		{"priority queues a list", doc("gcra: {rate: 1, per: 1s}\n    priority: {queues: [emails]}"), `policy: line 5: rule "a": priority.queues: must be a mapping of names, got a list`},
		{"priority aging short", doc("gcra: {rate: 1, per: 1s}\n    priority:\n      level: 2\n      aging: 10us"), `policy: line 7: rule "a": priority.aging: must be between 1ms and 1h0m0s, got 10µs`},
		{"priority unknown field", doc("gcra: {rate: 1, per: 1s}\n    priority: {level: 2, boost: 1}"), `policy: line 5: rule "a": priority.boost: unknown field; expected level, queues or aging`},
		{"priority prefetch", doc("gcra: {rate: 1000, per: 1s, burst: 50}\n    priority: 2\n    prefetch: 5ms"), `policy: line 6: rule "a": prefetch: a rule with priority decides each task in turn with the others waiting; remove prefetch or priority`},
		{"fair weight without key", doc("gcra: {rate: 1, per: 1s}\n    fair: {weight: 2}"), `policy: line 5: rule "a": fair.key: is required: the template of the values the rule is shared among, such as "{{.business_id}}"`},
		{"fair weight zero", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weight: 0}"), `policy: line 5: rule "a": fair.weight: must be a whole number from 1 to 100 or a template such as "{{.weight}}", got "0"`},
		{"fair weight too big", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weight: 101}"), `policy: line 5: rule "a": fair.weight: must be a whole number from 1 to 100 or a template such as "{{.weight}}", got "101"`},
		{"fair weight bad template", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weight: \"{{.w | x}}\"}"), `policy: line 5: rule "a": fair.weight: bad template "{{.w | x}}": only field references such as {{.business_id}}`},
		{"fair weight with text", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weight: \"x{{.w}}\"}"), `policy: line 5: rule "a": fair.weight: a template of the weight is one field such as "{{.weight}}", with no text around it, got "x{{.w}}"`},
		{"fair weight not whole", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weight: 2.5}"), `policy: line 5: rule "a": fair.weight: must be a whole number or a template of one, got 2.5`},
		{"fair unknown field", doc("gcra: {rate: 1, per: 1s}\n    fair: {key: \"{{.b}}\", weights: 2}"), `policy: line 5: rule "a": fair.weights: unknown field; expected key or weight`},
		{"fair weight on a window", doc("quota: {limit: 5, every: 1s}\n    fair: {key: \"{{.b}}\", weight: 2}"), `policy: line 5: rule "a": fair: only a gcra rate or a concurrency cap can be shared fairly; this rule's limit is 5 per 1s (fixed window)`},
		{"unknown limit field", doc("gcra: {rate: 1, per: 1s, brust: 2}"), `policy: line 4: rule "a": gcra.brust: unknown field; expected rate, per or burst`},
		{"unknown match field", "rules:\n  - name: a\n    match: {tpye: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 3: rule "a": match.tpye: unknown field; expected type or queue`},
		{"two limits", doc("gcra: {rate: 1, per: 1s}\n    quota: {limit: 5, every: 1s}"), `policy: line 5: rule "a": has both gcra and quota; a rule has exactly one limit`},
		{"no limit", "rules:\n  - name: a\n    match: {type: x}\n", `policy: line 2: rule "a": no limit; add one of gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency`},
		{"adaptive missing max", doc("adaptive: {per: 1s}"), `policy: line 4: rule "a": adaptive.max: missing; adaptive needs max and per`},
		{"adaptive min above max", doc("adaptive: {max: 5, min: 6, per: 1s}"), `policy: line 4: rule "a": adaptive.min: must be between 0 and max (5), got 6`},
		{"adaptive start", doc("adaptive: {max: 40, start: 0.1, per: 1s}"), `policy: line 4: rule "a": adaptive.start: must be between min (0.4) and max (40), got 0.1`},
		{"adaptive bare per", doc("adaptive: {max: 40, per: 1}"), `policy: line 4: rule "a": adaptive.per: 1 needs a unit, e.g. 1s (Go duration syntax: ms, s, m, h)`},
		{"adaptive unknown field", doc("adaptive: {max: 40, per: 1s, rate: 3}"), `policy: line 4: rule "a": adaptive.rate: unknown field; expected max, min, start, per or burst`},
		{"adaptive fair", doc("adaptive: {max: 40, per: 1s}\n    fair: \"{{.b}}\""), `policy: line 5: rule "a": fair: only a gcra rate or a concurrency cap can be shared fairly; this rule's limit is learned 0.4-40 per 1s (adaptive)`},
		{"negative rate", doc("gcra: {rate: -1, per: 1s, burst: 1}"), `policy: line 4: rule "a": gcra.rate: must be a positive number, got -1`},
		{"zero rate", doc("gcra: {rate: 0, per: 1s}"), `policy: line 4: rule "a": gcra.rate: must be a positive number, got 0`},
		{"nan rate", doc("gcra: {rate: .nan, per: 1s}"), `rule "a": gcra.rate: must be a finite number, got .nan`},
		{"string rate", doc(`gcra: {rate: "18", per: 1s}`), `policy: line 4: rule "a": gcra.rate: must be a number, got the string "18"`},
		{"missing rate", doc("gcra: {per: 1s}"), `policy: line 4: rule "a": gcra.rate: missing; gcra needs rate and per`},
		{"unitless per", doc("gcra: {rate: 1, per: 1}"), `policy: line 4: rule "a": gcra.per: 1 needs a unit, e.g. 1s`},
		{"unitless per string", doc(`gcra: {rate: 1, per: "10"}`), `rule "a": gcra.per: "10" needs a unit, e.g. 10s`},
		{"not a duration", doc(`gcra: {rate: 1, per: fast}`), `rule "a": gcra.per: "fast" is not a duration`},
		{"zero per", doc("gcra: {rate: 1, per: 0s}"), `policy: line 4: rule "a": gcra.per: must be positive, got 0s`},
		{"negative per", doc("gcra: {rate: 1, per: -1s}"), `rule "a": gcra.per: must be positive, got -1s`},
		{"burst zero", doc("gcra: {rate: 1, per: 1s, burst: 0}"), `policy: line 4: rule "a": gcra.burst: must be at least 1, got 0`},
		{"burst fraction", doc("gcra: {rate: 1, per: 1s, burst: 1.5}"), `rule "a": gcra.burst: must be a whole number, got 1.5`},
		{"rate too high", doc("gcra: {rate: 2000000, per: 1s}"), `rule "a": gcra: per/rate is below one microsecond, got 2e+06/1s burst 1`},
		{"burst too long", doc("gcra: {rate: 1, per: 1s, burst: 9000000000}"), `policy: line 4: rule "a": gcra: burst × per/rate exceeds 35 years, got 1/1s burst 9000000000`},
		{"quota limit zero", doc("quota: {limit: 0, every: 10s}"), `policy: line 4: rule "a": quota.limit: must be at least 1, got 0`},
		{"quota every and cron", doc(`quota: {limit: 5, every: 10s, cron: "@daily"}`), `policy: line 4: rule "a": quota: has both every and cron`},
		{"quota neither", doc(`quota: {limit: 5}`), `policy: line 4: rule "a": quota: needs every (a fixed window`},
		{"tz without cron", doc(`quota: {limit: 5, every: 10s, tz: UTC}`), `policy: line 4: rule "a": quota.tz: only allowed with cron`},
		{"unknown tz", doc(`quota: {limit: 5, cron: "0 0 * * *", tz: Mars/Base}`), `policy: line 4: rule "a": quota.tz: unknown time zone "Mars/Base"`},
		{"bad cron", doc(`quota: {limit: 5, cron: "0 0 * *"}`), `policy: line 4: rule "a": quota.cron: bad cron spec "0 0 * *": expected exactly 5 fields, found 4`},
		{"every cron", doc(`quota: {limit: 5, cron: "@every 1m"}`), `rule "a": quota.cron: bad cron spec "@every 1m": @every is not a calendar schedule`},
		{"calendar limit zero", doc(`quota: {limit: 0, cron: "@daily"}`), `rule "a": quota.limit: must be at least 1, got 0`},
		{"window too short", doc(`quota: {limit: 5, every: 100us}`), `rule "a": quota.every: must be at least 1ms, got 100µs`},
		{"sliding too large", doc(`sliding: {limit: 200000, every: 1m}`), `rule "a": sliding.limit: 200000 exceeds 100000`},
		{"sliding missing every", doc(`sliding: {limit: 5}`), `rule "a": sliding.every: missing; sliding needs limit and every`},
		{"sliding limit zero", doc(`sliding: {limit: 0, every: 1m}`), `policy: line 4: rule "a": sliding.limit: must be at least 1, got 0`},
		{"sliding window too long", doc(`sliding: {limit: 5, every: 900000h}`), `policy: line 4: rule "a": sliding.every: must be at most 100 years, got 900000h0m0s`},
		{"calendar never fires", doc(`quota: {limit: 5, cron: "0 0 30 2 *", tz: Europe/Paris}`), `policy: line 4: rule "a": quota.cron: bad cron spec "0 0 30 2 *": never fires`},
		{"local tz", doc(`quota: {limit: 5, cron: "@daily", tz: Local}`), `policy: line 4: rule "a": quota.tz: time zone "Local" is not allowed`},
		{"calendar limit before tz", doc(`quota: {limit: 0, cron: "@daily", tz: Mars/Base}`), `policy: line 4: rule "a": quota.limit: must be at least 1, got 0`},
		{"concurrency reserved", doc(`concurrency: {max: 2, lease: 30s, reserved: 2}`), `rule "a": concurrency.reserved: must be between 0 and max-1 (1), got 2`},
		{"concurrency lease", doc(`concurrency: {max: 2, lease: 500ms}`), `rule "a": concurrency.lease: must be at least 30s, asynq's own task lease (a shorter one could free the slot of a task still running on a stalled worker), got 500ms`},
		{"concurrency max", doc(`concurrency: {max: 0, lease: 30s}`), `rule "a": concurrency.max: must be at least 1, got 0`},
		{"concurrency lease too long", doc(`concurrency: {max: 2, lease: 200h}`), `policy: line 4: rule "a": concurrency.lease: must be at most 7 days, got 200h0m0s`},
		{"concurrency reserved negative", doc(`concurrency: {max: 2, lease: 30s, reserved: -1}`), `policy: line 4: rule "a": concurrency.reserved: must be between 0 and max-1 (1), got -1`},
		{"limit not a mapping", doc(`gcra: 5`), `policy: line 4: rule "a": gcra: must be a mapping, got the integer 5`},
		{"bad glob", "rules:\n  - name: a\n    match: {type: \"http:[\"}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 3: rule "a": match.type: bad pattern "http:[": syntax error in pattern`},
		{"empty match", "rules:\n  - name: a\n    match: {}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 3: rule "a": match: needs a task type (type: ...) or a queue`},
		{"missing match", "rules:\n  - name: a\n    gcra: {rate: 1, per: 1s}\n", `policy: line 2: rule "a": match: needs a task type`},
		{"match not a mapping", "rules:\n  - name: a\n    match: http:call\n    gcra: {rate: 1, per: 1s}\n", `policy: line 3: rule "a": match: must be a mapping, got the string "http:call"`},
		{"numeric queue", "rules:\n  - name: a\n    match: {queue: 5}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 3: rule "a": match.queue: must be a string, got the integer 5 (quote it)`},
		{"template pipeline", doc("gcra: {rate: 1, per: 1s}\n    key: \"{{.a | upper}}\""), `policy: line 5: rule "a": key: bad template "{{.a | upper}}": only field references such as {{.business_id}}`},
		{"template function", doc("gcra: {rate: 1, per: 1s}\n    key: 'x-{{printf \"%s\" .a}}'"), `rule "a": key: bad template "x-{{printf \"%s\" .a}}": "{{printf \"%s\" .a}}": only field references`},
		{"template if", doc("gcra: {rate: 1, per: 1s}\n    key: \"{{if .a}}x{{end}}\""), `rule "a": key: bad template "{{if .a}}x{{end}}"`},
		{"template dot", doc("gcra: {rate: 1, per: 1s}\n    key: \"{{.}}\""), `rule "a": key: bad template "{{.}}": the whole payload cannot be a key`},
		{"template unclosed", doc("gcra: {rate: 1, per: 1s}\n    key: \"{{.a\""), `rule "a": key: bad template "{{.a": unclosed "{{"`},
		{"template stray close", doc("gcra: {rate: 1, per: 1s}\n    key: \"a}}\""), `rule "a": key: bad template "a}}": "}}" without "{{"`},
		{"template trim", doc("gcra: {rate: 1, per: 1s}\n    key: \"{{- .a -}}\""), `rule "a": key: bad template "{{- .a -}}": trim markers are not allowed`},
		{"default_key without field", doc("gcra: {rate: 1, per: 1s}\n    default_key: x"), `policy: line 5: rule "a": default_key: set, but key references no payload field`},
		{"duplicate names", doc("gcra: {rate: 1, per: 1s}") + "  - name: a\n    match: {queue: q}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 5: rule 2: name: "a" is already the name of rule 1`},
		{"bad name", "rules:\n  - name: a b\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 2: rule 1: name: "a b" contains ' '`},
		{"long name", "rules:\n  - name: " + strings.Repeat("x", 65) + "\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n", `rule 1: name: "xxxx`},
		{"missing name", doc("gcra: {rate: 1, per: 1s}") + "  - match: {type: x}\n    gcra: {rate: 1, per: 1s}\n  - match: {type: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 7: rule 3: name: missing; every rule needs a name`},
		{"numeric name", "rules:\n  - name: 5\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 2: rule 1: name: must be a string, got the integer 5 (quote it)`},
		{"tag", doc("gcra: {rate: !!str 5, per: 1s}"), `rule "a": gcra.rate: YAML tags (!!str) are not supported`},
		{"bool for number", doc("gcra: {rate: true, per: 1s}"), `rule "a": gcra.rate: must be a number, got the boolean true`},
		{"list for duration", doc("gcra: {rate: 1, per: [1s]}"), `rule "a": gcra.per: must be a duration such as 1s, 10m or 24h, got a list`},
		{"alias before anchor", "critical: [*m]\nrules:\n  - name: a\n    match: &m {type: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 1: critical[1]: alias *m refers to no anchor defined before it`},
		{"anchor twice", "critical: [&m {queue: q}]\nrules:\n  - name: a\n    match: &m {type: x}\n    gcra: {rate: 1, per: 1s}\n", `policy: line 4: rule 1: match: anchor &m is defined twice; give each anchor its own name`},
		{"null limit", doc("gcra: ~"), `policy: line 4: rule "a": gcra: must be a mapping, got null (an empty value)`},
		{"throttle and a rule not read", "throttle: [a]\nrules:\n  - name: a\n    match: 5\n    gcra: {rate: 1, per: 1s}\n", `policy: line 4: rule "a": match: must be a mapping, got the integer 5`},
		{"merged unknown field", doc("gcra: {rate: 1, per: 1s, <<: {brust: 2}}"), `policy: line 4: rule "a": gcra.brust: unknown field; expected rate, per or burst`},
		{"huge integer", doc("quota: {limit: 100000000000000000000, every: 1s}"), `rule "a": quota.limit: out of range (at most 9007199254740992 in magnitude), got 100000000000000000000`},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if seen[c.doc] {
				t.Fatalf("duplicate document")
			}
			seen[c.doc] = true
			p, err := Parse([]byte(c.doc))
			if err == nil {
				t.Fatalf("parsed:\n%s", c.doc)
			}
			if p != nil {
				t.Errorf("a policy with an error is not nil")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error\n  %v\nwants\n  %s\ndocument:\n%s", err, c.want, c.doc)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Errorf("error %T is not a *Error", err)
			}
		})
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
}

// Every wrong rule is reported, each on its own line.
func TestParseReportsEveryRule(t *testing.T) {
	src := `rules:
  - name: a
    match: {type: x}
    gcra: {rate: -1, per: 1s}
  - name: b
    match: {type: x}
    gcra: {rate: 1, per: 1s}
  - name: c
    match: {type: x}
    quota: {limit: 5, every: 1}
`
	_, err := Parse([]byte(src))
	if err == nil {
		t.Fatal("parsed")
	}
	want := "policy: line 4: rule \"a\": gcra.rate: must be a positive number, got -1\n" +
		"policy: line 10: rule \"c\": quota.every: 1 needs a unit, e.g. 1s (Go duration syntax: ms, s, m, h)"
	if err.Error() != want {
		t.Errorf("got\n%v\nwant\n%s", err, want)
	}
	var pe *Error
	if !errors.As(err, &pe) || pe.Line != 4 || pe.Rule != "a" || pe.Index != 1 || pe.Field != "gcra.rate" {
		t.Errorf("first error: %+v", pe)
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(doc("gcra: {rate: -1, per: 1s}")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(bad)
	if want := "policy " + bad + `: line 4: rule "a": gcra.rate: must be a positive number, got -1`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	missing := filepath.Join(dir, "missing.yaml")
	_, err = LoadFile(missing)
	if want := "policy " + missing + ": cannot open: "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want prefix %s", err, want)
	}
	p, err := LoadFile("testdata/design.yaml")
	if err != nil || len(p.Rules()) != 5 {
		t.Fatalf("design policy: %v", err)
	}
}

func TestRedisUnavailable(t *testing.T) {
	for doc, want := range map[string]FailureMode{
		"":                            FailClosed,
		"redis_unavailable:\n":        FailClosed,
		"redis_unavailable: open\n":   FailOpen,
		"redis_unavailable: closed\n": FailClosed,
		"redis_unavailable: local\n":  FailLocal,
	} {
		p, err := Parse([]byte(doc + "rules: [{name: a, match: {type: x}, gcra: {rate: 1, per: 1s}}]"))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if got := p.FailureMode(); got != want {
			t.Errorf("%q: got %q, want %q", doc, got, want)
		}
	}
	p, err := New(Rule{Name: "a", Match: Match{Type: "x"}, Limit: limits.FixedWindow{Limit: 1, Every: time.Second}})
	if err != nil || p.FailureMode() != FailClosed {
		t.Fatalf("New: %v %v", err, p.FailureMode())
	}
	q, err := p.WithFailureMode(FailLocal)
	if err != nil || q.FailureMode() != FailLocal || p.FailureMode() != FailClosed || len(q.Rules()) != 1 {
		t.Errorf("WithFailureMode: %v", err)
	}
	if _, err := p.WithFailureMode("sometimes"); err == nil || !strings.Contains(err.Error(), `redis_unavailable: must be open, closed or local, got "sometimes"`) {
		t.Errorf("bad mode: %v", err)
	}
	if (*Policy)(nil).FailureMode() != FailClosed || (&Policy{}).FailureMode() != FailClosed {
		t.Errorf("zero policy does not fail closed")
	}
}

// The README's example policy, parsed, bound and keyed.
func TestDesignPolicy(t *testing.T) {
	p, err := LoadFile("testdata/design.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Name: "vendor-peak", Match: Match{Type: "http:call"}, Limit: limits.GCRA{Rate: 18, Period: time.Second, Burst: 3}},
		{Name: "vendor-window", Match: Match{Type: "http:call"}, Limit: limits.FixedWindow{Limit: 190, Every: 10 * time.Second}},
		{Name: "vendor-daily", Match: Match{Type: "http:call"}, Limit: limits.CalendarWindow{Limit: 10000, Cron: "0 0 * * *", TZ: "America/Los_Angeles"}},
		{Name: "per-business", Match: Match{Type: "http:call"}, Key: "{{.business_id}}", Limit: limits.GCRA{Rate: 1.8, Period: time.Second, Burst: 1}},
		{Name: "business-concurrency", Match: Match{Type: "http:call"}, Key: "{{.business_id}}", Limit: limits.Concurrency{Max: 2, Lease: 30 * time.Second}},
	}
	if got := p.Rules(); !reflect.DeepEqual(got, want) {
		t.Fatalf("rules\n%+v\nwant\n%+v", got, want)
	}
	if p.FailureMode() != FailClosed {
		t.Errorf("mode %q", p.FailureMode())
	}
	b := p.Bind("http:call", "default")
	if b == nil {
		t.Fatal("no binding")
	}
	if got := names(b); got != "vendor-peak vendor-window vendor-daily per-business business-concurrency" {
		t.Errorf("bound %s", got)
	}
	keys, err := b.Keys([]byte(`{"url": "http://x", "method": "POST", "business_id": "b7", "body": {"a": [1, 2]}}`))
	if err != nil || !reflect.DeepEqual(keys, []string{"", "", "", "b7", "b7"}) {
		t.Errorf("keys %q, %v", keys, err)
	}
	if b := p.Bind("other", "q"); b != nil {
		t.Errorf("other task bound to %s", names(b))
	}
	if p.Bind("http:call", "critical") != b {
		t.Errorf("pairs with the same rules do not share a binding")
	}
	// The round trip: the rules build an equal policy.
	q, err := New(p.Rules()...)
	if err != nil || !reflect.DeepEqual(q.Rules(), want) {
		t.Errorf("round trip: %v", err)
	}
}

func names(b *Binding) string {
	var ns []string
	for _, r := range b.Rules() {
		ns = append(ns, r.Name)
	}
	return strings.Join(ns, " ")
}

func TestBindMatching(t *testing.T) {
	p, err := Parse([]byte(`
redis_unavailable: local
rules:
  - name: http-all
    match: {type: "http:*"}
    gcra: {rate: 10, per: 1s}
  - name: bulk
    match: {queue: bulk}
    sliding: {limit: 100, every: 1m}
  - name: email-bulk
    match: {type: "email:[ab]*", queue: bulk}
    quota: {limit: 5, every: 1h}
  - name: any-critical
    match: {type: "*", queue: critical}
    concurrency: {max: 3, lease: 1m, reserved: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ typ, queue, want string }{
		{"http:call", "default", "http-all"},
		{"http:call", "bulk", "http-all bulk"},
		{"http:", "default", "http-all"},
		{"https:call", "default", ""},
		{"http:call/x", "default", ""}, // '*' does not match '/'
		{"email:all", "bulk", "bulk email-bulk"},
		{"email:all", "default", ""},
		{"email:cc", "bulk", "bulk"},
		{"report", "critical", "any-critical"},
		{"http:call", "critical", "http-all any-critical"},
		{"report", "bulkier", ""},
	} {
		b := p.Bind(c.typ, c.queue)
		got := ""
		if b != nil {
			got = names(b)
		}
		if got != c.want {
			t.Errorf("Bind(%q, %q) = %q, want %q", c.typ, c.queue, got, c.want)
		}
		if again := p.Bind(c.typ, c.queue); again != b {
			t.Errorf("Bind(%q, %q) not cached", c.typ, c.queue)
		}
	}
	var nilPolicy *Policy
	if nilPolicy.Bind("x", "y") != nil || (&Policy{}).Bind("x", "y") != nil || nilPolicy.Rules() != nil {
		t.Errorf("zero policy binds")
	}
	var nb *Binding
	if k, err := nb.Keys([]byte("x")); k != nil || err != nil || nb.Rules() != nil {
		t.Errorf("nil binding")
	}
}

func TestBindDoesNotAllocateWhenCached(t *testing.T) {
	p, err := LoadFile("testdata/design.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p.Bind("http:call", "default")
	p.Bind("other", "default")
	if n := testing.AllocsPerRun(100, func() {
		p.Bind("http:call", "default")
		p.Bind("other", "default")
	}); n != 0 {
		t.Errorf("%v allocations per cached Bind", n)
	}
}

func TestBindCacheIsBounded(t *testing.T) {
	p, err := New(Rule{Name: "a", Match: Match{Type: "t*"}, Limit: limits.FixedWindow{Limit: 1, Every: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range maxBindings + 100 {
		if b := p.Bind(fmt.Sprintf("t%d", i), "q"); b == nil || names(b) != "a" {
			t.Fatalf("Bind %d: %v", i, b)
		}
	}
	if len(p.bound) > maxBindings || len(p.subsets) != 1 {
		t.Errorf("cache holds %d pairs, %d subsets", len(p.bound), len(p.subsets))
	}
}

func TestBindConcurrent(t *testing.T) {
	p, err := Parse([]byte(`rules:
  - {name: a, match: {type: "t:*"}, gcra: {rate: 1, per: 1s}}
  - {name: b, match: {queue: q1}, quota: {limit: 5, every: 1s}}
  - {name: c, match: {type: "t:1*", queue: q2}, key: "{{.id}}", concurrency: {max: 1, lease: 30s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([][]*Binding, 16)
	for g := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				typ := fmt.Sprintf("t:%d", i%20)
				q := fmt.Sprintf("q%d", i%3)
				b := p.Bind(typ, q)
				if b != nil {
					if _, err := b.Keys([]byte(`{"id": 1}`)); err != nil {
						t.Error(err)
					}
				}
				results[g] = append(results[g], b)
			}
		}()
	}
	wg.Wait()
	for g := 1; g < len(results); g++ {
		for i := range results[g] {
			if results[g][i] != results[0][i] {
				t.Fatalf("goroutine %d call %d got a different binding", g, i)
			}
		}
	}
	if b := p.Bind("t:12", "q2"); b == nil || names(b) != "a c" {
		t.Errorf("t:12 on q2: %v", b)
	}
}

func TestKeys(t *testing.T) {
	rules := []Rule{
		{Name: "global", Match: Match{Type: "*"}, Limit: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}},
		{Name: "nested", Match: Match{Type: "*"}, Key: "{{ .account.id }}", Limit: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}},
		{Name: "composite", Match: Match{Type: "*"}, Key: "tenant-{{.t}}-{{.region}}", DefaultKey: "tenant-unknown", Limit: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}},
		{Name: "literal", Match: Match{Type: "*"}, Key: "fixed", Limit: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}},
	}
	p, err := New(rules...)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("x", "q")
	for _, c := range []struct {
		payload string
		want    []string
		err     string
	}{
		{`{"account": {"id": 12345678901}, "t": "acme", "region": "eu"}`, []string{"", "12345678901", "tenant-acme-eu", "fixed"}, ""},
		{`{"account": {"id": "a\"b\u00e9"}, "t": true, "region": 1.50}`, []string{"", `a"bé`, "tenant-true-1.50", "fixed"}, ""},
		{`{"account": {"id": -1e3}, "t": false, "region": 0}`, []string{"", "-1e3", "tenant-false-0", "fixed"}, ""},
		{`  {"account": {"id": 9007199254740993}}  `, []string{"", "9007199254740993", "tenant-unknown", "fixed"}, ""},
		{`{"account": {"id": 1}, "t": "acme"}`, []string{"", "1", "tenant-unknown", "fixed"}, ""},
		{`{"account": {}}`, nil, `taskrl: rule "nested": payload has no field "account.id"`},
		{`{}`, nil, `taskrl: rule "nested": payload has no field "account.id"`},
		{`{"account": {"id": null}}`, nil, `taskrl: rule "nested": payload field "account.id" is null; a key needs a string, number or boolean`},
		{`{"account": {"id": [1]}}`, nil, `taskrl: rule "nested": payload field "account.id" is an array`},
		{`{"account": {"id": {"x": 1}}}`, nil, `taskrl: rule "nested": payload field "account.id" is an object`},
		{`{"account": "a1"}`, nil, `taskrl: rule "nested": payload field "account" is a string, not an object, so "account.id" cannot be read`},
		{`{"account": {"id": 1}, "t": null}`, nil, `taskrl: rule "composite": payload field "t" is null`},
		{`[1, 2]`, nil, `taskrl: rule "nested": payload is not a JSON object: payload is an array`},
		{`"x"`, nil, `taskrl: rule "nested": payload is not a JSON object: payload is a string`},
		{`null`, nil, `taskrl: rule "nested": payload is not a JSON object: payload is null`},
		{``, nil, `taskrl: rule "nested": payload is not a JSON object: empty payload`},
		{`{"account": `, nil, `taskrl: rule "nested": payload is not a JSON object: unexpected EOF`},
		{`{"account": {"id": 1}} {}`, nil, `taskrl: rule "nested": payload is not a JSON object: data after the JSON object`},
		{`not json`, nil, `taskrl: rule "nested": payload is not a JSON object: payload is not JSON`},
	} {
		keys, err := b.Keys([]byte(c.payload))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || keys != nil {
				t.Errorf("%s: got %q, %v; want error %s", c.payload, keys, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(keys, c.want) {
			t.Errorf("%s: got %q, %v; want %q", c.payload, keys, err, c.want)
		}
	}

	var mf *MissingFieldError
	_, err = b.Keys([]byte(`{"t": "x"}`))
	if !errors.As(err, &mf) || *mf != (MissingFieldError{Rule: "nested", Field: "account.id"}) {
		t.Errorf("missing field error: %#v", err)
	}
	if got := (&MissingFieldError{Rule: "per-business", Field: "business_id"}).Error(); got != `taskrl: rule "per-business": payload has no field "business_id"` {
		t.Errorf("Error() = %s", got)
	}
}

// Only global (and literal) rules: the payload is never decoded.
func TestKeysWithoutTemplatesIgnoresPayload(t *testing.T) {
	p, err := Parse([]byte(`rules:
  - {name: a, match: {type: x}, gcra: {rate: 1, per: 1s}}
  - {name: b, match: {type: x}, key: static, quota: {limit: 1, every: 1s}}
`))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := p.Bind("x", "q").Keys([]byte(`{this is not JSON`))
	if err != nil || !reflect.DeepEqual(keys, []string{"", "static"}) {
		t.Errorf("got %q, %v", keys, err)
	}
}

func TestNewErrors(t *testing.T) {
	g := limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}
	for _, c := range []struct {
		rules []Rule
		want  string
	}{
		{nil, "policy: rules: a policy needs at least one rule"},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}}}, `policy: rule "a": no limit`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: (*limits.GCRA)(nil)}}, `policy: rule "a": no limit`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: limits.GCRA{Rate: -1, Period: time.Second, Burst: 1}}}, `policy: rule "a": gcra.rate: must be a positive number, got -1`},
		{[]Rule{{Name: "a", Limit: g}}, `policy: rule "a": match: needs a task type`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Key: "{{.a}", Limit: g}}, `policy: rule "a": key: bad template "{{.a}": unclosed "{{"`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: g}, {Name: "a", Match: Match{Type: "y"}, Limit: g}}, `policy: rule 2: name: "a" is already the name of rule 1`},
		{[]Rule{{Name: "", Match: Match{Type: "x"}, Limit: g}}, `policy: rule 1: name: missing`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: limits.CalendarWindow{Limit: 1, Cron: "@daily", TZ: "Nowhere/Land"}}}, `policy: rule "a": quota.tz: unknown time zone "Nowhere/Land"`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: limits.GCRA{Rate: math.NaN(), Period: time.Second, Burst: 1}}}, `policy: rule "a": gcra.rate: must be a positive number, got NaN`},
		{[]Rule{{Name: "a", Match: Match{Type: "x"}, Limit: &limits.SlidingWindow{Limit: 5}}}, `policy: rule "a": sliding.every: must be at least 1ms, got 0s`},
		{[]Rule{{Name: "a b", Match: Match{Type: "x"}, Limit: g}}, `policy: rule 1: name: "a b" contains ' '; allowed are letters, digits, '_', '.' and '-'`},
	} {
		p, err := New(c.rules...)
		if err == nil || p != nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %s", c.rules, err, c.want)
		}
	}
	// Pointer limits are accepted and stored as values.
	lim := &limits.Concurrency{Max: 2, Lease: time.Minute}
	p, err := New(Rule{Name: "a", Match: Match{Queue: "q"}, Limit: lim})
	if err != nil {
		t.Fatal(err)
	}
	lim.Max = 0
	if got := p.Rules()[0].Limit; got != (limits.Concurrency{Max: 2, Lease: time.Minute}) {
		t.Errorf("stored limit %#v", got)
	}
}

// Anchors, aliases and merge keys work; the lines still point at the value.
func TestParseAnchors(t *testing.T) {
	p, err := Parse([]byte(`rules:
  - &vendor
    name: vendor-peak
    match: &http {type: "http:call"}
    gcra: {rate: 18, per: 1s, burst: 3}
  - <<: *vendor
    name: vendor-peak-2
    gcra: {rate: 5, per: 1s}
  - name: other
    match: *http
    quota: {limit: 1, every: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := p.Rules()
	if len(rs) != 3 || rs[1].Match.Type != "http:call" || rs[1].Limit != (limits.GCRA{Rate: 5, Period: time.Second, Burst: 1}) || rs[2].Match.Type != "http:call" {
		t.Errorf("rules %+v", rs)
	}
	_, err = Parse([]byte("rules:\n  - &r\n    name: a\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n  - <<: *r\n"))
	if err == nil || !strings.Contains(err.Error(), `rule 2: name: "a" is already the name of rule 1`) {
		t.Errorf("merged duplicate: %v", err)
	}
	_, err = Parse([]byte("rules:\n  - &r\n    name: a\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n    <<: *r\n"))
	if err == nil || !strings.Contains(err.Error(), "line 6: rule 1: <<: alias *r is inside the value it refers to") {
		t.Errorf("self-merge: %v", err)
	}
	// Keys written override those merged, wherever the merge key is.
	p, err = Parse([]byte("rules:\n  - &r\n    name: a\n    match: {type: x}\n    gcra: {rate: 1, per: 1s}\n  - name: b\n    <<: *r\n"))
	if err != nil || p.Rules()[1].Name != "b" {
		t.Errorf("merge after a key: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	design, err := os.ReadFile("testdata/design.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(design)
	f.Add([]byte(doc("gcra: {rate: -1, per: 1s}")))
	f.Add([]byte("redis_unavailable: local\nrules:\n  - &a {name: a, match: {queue: q}, key: 'x-{{.a.b}}', default_key: d, sliding: {limit: 5, every: 1m}}\n  - <<: *a\n    name: b\n"))
	f.Add([]byte(doc(`quota: {limit: 5, cron: "0 9 * * 1", tz: Europe/Paris}`)))
	f.Add([]byte(doc(`concurrency: {max: 3, lease: 1m, reserved: 1}`)))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if p != nil {
				t.Fatal("policy and error")
			}
			if !strings.HasPrefix(err.Error(), "policy: ") {
				t.Fatalf("error without prefix: %v", err)
			}
			return
		}
		q, err := New(p.Rules()...)
		if err != nil {
			t.Fatalf("rules of a parsed policy do not validate: %v", err)
		}
		if !reflect.DeepEqual(q.Rules(), p.Rules()) {
			t.Fatal("round trip changed the rules")
		}
		for _, r := range p.Rules() {
			b := p.Bind(r.Match.Type, r.Match.Queue)
			if b == nil {
				continue // a glob type need not match itself
			}
			if _, err := b.Keys(data); err != nil && !b.payload {
				t.Fatalf("keys without templates failed: %v", err)
			}
		}
	})
}

func TestCritical(t *testing.T) {
	p, err := Parse([]byte(`
critical:
  - {queue: critical}
  - {type: "payments:*"}
rules:
  - name: slots
    match: {type: "*:*"}
    concurrency: {max: 4, lease: 30s, reserved: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ, queue string
		want       bool
	}{
		{"http:call", "critical", true},
		{"http:call", "default", false},
		{"payments:charge", "default", true},
		{"payments:charge", "critical", true},
	} {
		b := p.Bind(c.typ, c.queue)
		if b == nil || b.Critical() != c.want || names(b) != "slots" {
			t.Errorf("Bind(%q, %q): critical %v, want %v", c.typ, c.queue, b.Critical(), c.want)
		}
	}
	if p.Bind("email", "critical") != nil || p.Bind("email", "critical").Critical() {
		t.Error("a task no rule matches has a binding")
	}
	// The failure mode and the critical list survive each other.
	q, err := p.WithFailureMode(FailOpen)
	if err != nil || !q.Bind("x:y", "critical").Critical() || len(q.Critical()) != 2 {
		t.Fatalf("WithFailureMode lost the critical list: %v", err)
	}
	q, err = q.WithCritical(Match{Queue: "vip"})
	if err != nil || q.FailureMode() != FailOpen || q.Bind("x:y", "critical").Critical() || !q.Bind("x:y", "vip").Critical() {
		t.Fatalf("WithCritical: %v", err)
	}
	for m, want := range map[Match]string{
		{}:              `policy: critical[1]: needs a task type (type: ...) or a queue`,
		{Type: "pay:["}: `policy: critical[1].type: bad pattern "pay:[": syntax error in pattern`,
	} {
		if _, err := p.WithCritical(m); err == nil || err.Error() != want && !strings.HasPrefix(err.Error(), want) {
			t.Errorf("WithCritical(%+v) = %v, want %s", m, err, want)
		}
	}
}

func TestThrottleList(t *testing.T) {
	p, err := Parse([]byte(`
throttle: [per-business]
rules:
  - name: vendor
    match: {type: "http:call"}
    gcra: {rate: 18, per: 1s}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Throttle(); len(got) != 1 || got[0] != "per-business" {
		t.Fatalf("Throttle() = %v", got)
	}
	if b := p.Bind("http:call", "q"); b == nil || b.throttle[0] || !b.throttle[1] {
		t.Fatalf("binding's throttle scope %v, want only per-business", b.throttle)
	}
	q, err := p.WithFailureMode(FailOpen)
	if err != nil || len(q.Throttle()) != 1 {
		t.Fatalf("WithFailureMode lost the throttle list: %v", err)
	}
	if _, err := p.WithThrottle("vendor", "nope"); err == nil || err.Error() != `policy: throttle[2]: no rule is named "nope"` {
		t.Fatalf("WithThrottle with an unknown rule: %v", err)
	}
}

// TestHTTPSkipped: the http section is the worker binary's; the library
// accepts it without reading it.
func TestHTTPSkipped(t *testing.T) {
	if _, err := Parse([]byte("http:\n  allow_hosts: [{a: 1}]\n  anything: else\n" + doc("gcra: {rate: 1, per: 1s}"))); err != nil {
		t.Fatal(err)
	}
}

func TestFairRequest(t *testing.T) {
	p, err := Parse([]byte(`
critical:
  - {queue: vip}
rules:
  - name: peak
    match: {type: "http:call"}
    fair: "{{.business_id}}"
    gcra: {rate: 18, per: 1s, burst: 3}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 2, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("http:call", "default")
	if rs := b.Rules(); !rs[0].Fair || rs[1].Fair {
		t.Fatalf("fair flags: %+v", rs)
	}
	for payload, want := range map[string][2]string{
		`{"business_id": "b7"}`:   {"b7", "b7"},
		`{"business_id": 12}`:     {"12", "12"},
		`{"business_id": "b{1}"}`: {"b{1}", "b{1}"},
	} {
		req, err := b.Request([]byte(payload))
		if err != nil || req.Fair[0] != want[0] || req.Keys[1] != want[1] || req.Fair[1] != "" || req.Keys[0] != "" || req.Critical {
			t.Errorf("Request(%s) = %+v, %v", payload, req, err)
		}
	}
	// A flow that cannot be rendered is "": fairness is no reason to refuse
	// a task; the key's missing field still is.
	only := mustNew(t, Rule{Name: "peak", Match: Match{Type: "x"}, Fair: "{{.b}}", Limit: limits.GCRA(gcra.PerSecond(1))}).Bind("x", "q")
	for _, payload := range []string{`{}`, `{"b": null}`, `not json`} {
		if req, err := only.Request([]byte(payload)); err != nil || req.Fair[0] != "" {
			t.Errorf("Request(%s) = %+v, %v", payload, req, err)
		}
	}
	if _, err := b.Request([]byte(`{}`)); err == nil {
		t.Error("a missing key field was accepted")
	}
	if req, _ := p.Bind("http:call", "vip").Request([]byte(`{"business_id": "b1"}`)); !req.Critical {
		t.Error("a critical task's request is not critical")
	}
	if req, _ := b.Request([]byte(`{"business_id": "b1"}`)); req.Weights != nil {
		t.Errorf("without a weight: Weights %v, want nil", req.Weights)
	}
}

// TestFairWeight: fair: {key, weight} weighs a flow by its payload's
// weight, or a literal; a weight missing or not a whole number is 1, one
// above limits.MaxWeight is MaxWeight; rules without one weigh 1.
func TestFairWeight(t *testing.T) {
	p, err := Parse([]byte(`
rules:
  - name: peak
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}", weight: "{{.weight}}"}
    gcra: {rate: 12, per: 1s}
  - name: fixed
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}", weight: 3}
    gcra: {rate: 12, per: 1s}
  - name: plain
    match: {type: "http:call"}
    fair: {key: "{{.business_id}}"}
    gcra: {rate: 12, per: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := p.Bind("http:call", "default")
	if rs := b.Rules(); !rs[0].Fair || !rs[1].Fair || !rs[2].Fair {
		t.Fatalf("fair flags: %+v", rs)
	}
	for payload, want := range map[string]int{
		`{"business_id": "b1", "weight": 3}`:     3,
		`{"business_id": "b1", "weight": "2"}`:   2,
		`{"business_id": "b1"}`:                  1,
		`{"business_id": "b1", "weight": 0}`:     1,
		`{"business_id": "b1", "weight": 2.5}`:   1,
		`{"business_id": "b1", "weight": "abc"}`: 1,
		`{"business_id": "b1", "weight": 1000}`:  limits.MaxWeight,
		`not json`:                               1,
	} {
		req, err := b.Request([]byte(payload))
		if err != nil || len(req.Weights) != 3 || req.Weights[0] != want || req.Weights[1] != 3 || req.Weights[2] != 0 {
			t.Errorf("Request(%s) = %+v, %v; want weights [%d 3 0]", payload, req, err, want)
		}
		if payload != `not json` && req.Fair[0] != "b1" {
			t.Errorf("Request(%s): flow %q", payload, req.Fair[0])
		}
	}
}

// TestPriority checks how a task's level at a prioritized rule is found:
// the payload's (a whole number from 1 to 5), else its queue's, else 0
// (the default level); a literal level for all; a prioritized rule
// without fair is decided as a fair one of one flow, with its aging
// (default DefaultAging); a rule without priority has level 0 and no
// aging; a concurrency rule takes its level from its queue.
func TestPriority(t *testing.T) {
	p, err := Parse([]byte(`
rules:
  - name: vendor
    match: {type: "http:call"}
    fair: "{{.business_id}}"
    priority: {level: "{{.priority}}", queues: {emails: 1, newsletters: 5}, aging: 5s}
    gcra: {rate: 12, per: 1s}
  - name: search
    match: {type: "http:call"}
    priority: 2
    gcra: {rate: 12, per: 1s}
  - name: plain
    match: {type: "http:call"}
    gcra: {rate: 12, per: 1s}
  - name: smtp
    match: {type: "http:call"}
    priority: {queues: {emails: 1, newsletters: 5}, aging: 2s}
    concurrency: {max: 20, lease: 30s}
`))
	if err != nil {
		t.Fatal(err)
	}
	rs := p.Bind("http:call", "default").Rules()
	if !rs[0].Fair || rs[0].Aging != 5*time.Second || !rs[1].Fair || rs[1].Aging != DefaultAging || rs[2].Fair || rs[2].Aging != 0 || !rs[3].Fair || rs[3].Aging != 2*time.Second {
		t.Fatalf("rules: %+v", rs)
	}
	for _, c := range []struct {
		queue, payload string
		want           int
	}{
		{"default", `{"business_id": "b1", "priority": 1}`, 1},
		{"default", `{"business_id": "b1", "priority": "4"}`, 4},
		{"default", `{"business_id": "b1"}`, 0},
		{"default", `{"business_id": "b1", "priority": 9}`, 0},
		{"default", `{"business_id": "b1", "priority": 1.5}`, 0},
		{"emails", `{"business_id": "b1"}`, 1},
		{"emails", `{"business_id": "b1", "priority": 3}`, 3},
		{"newsletters", `{"business_id": "b1"}`, 5},
		{"newsletters", `not json`, 5},
	} {
		req, err := p.Bind("http:call", c.queue).Request([]byte(c.payload))
		queue := map[string]int{"emails": 1, "newsletters": 5}[c.queue]
		if err != nil || !slices.Equal(req.Priorities, []int{c.want, 2, 0, queue}) {
			t.Errorf("queue %s, %s: priorities %v (%v), want [%d 2 0 %d]", c.queue, c.payload, req.Priorities, err, c.want, queue)
		}
		if c.payload != `not json` && (req.Fair[0] != "b1" || req.Fair[1] != "") {
			t.Errorf("queue %s, %s: flows %q", c.queue, c.payload, req.Fair)
		}
	}
	if req, _ := p.Bind("http:call", "emails").ForKeys([]string{"", "", "", ""}).Request(nil); req.Priorities[0] != 1 {
		t.Errorf("a variant lost the queue's level: %v", req.Priorities)
	}
}

// FuzzRequest renders key and fair templates over hostile payloads (deep
// nesting, huge numbers, invalid UTF-8, long strings): never a panic, and a
// payload that renders gives keys a Limiter accepts.
func FuzzRequest(f *testing.F) {
	p, err := Parse([]byte(`rules:
  - name: per-business
    match: {type: job}
    key: "{{.business_id}}:{{.region}}"
    default_key: none
    gcra: {rate: 10, per: 1s}
  - name: fair-peak
    match: {type: job}
    fair: "{{.account.id}}"
    gcra: {rate: 100, per: 1s, burst: 10}
`))
	if err != nil {
		f.Fatal(err)
	}
	b := p.Bind("job", "q")
	for _, s := range []string{
		`{"business_id": "b1", "region": "eu", "account": {"id": 7}}`,
		`{"business_id": 1e400}`, `{"business_id": 123456789012345678901234567890}`, `{"business_id": -0.0}`,
		"{\"business_id\": \"\xff\xfe\", \"region\": \"\\ud800\"}",
		`{"business_id": {"a": [1, 2, {"b": null}]}}`,
		`{"account": ` + strings.Repeat(`{"id":`, 1000) + `1` + strings.Repeat(`}`, 1001),
		`{"business_id": "` + strings.Repeat("x", 1<<16) + `"}`,
		`[]`, `null`, `"s"`, ``, `{"business_id": "a", "business_id": "b"}`,
	} {
		f.Add([]byte(s))
	}
	set, err := quotas.NewSet(b.Rules()...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		rq, err := b.Request(payload)
		if err != nil {
			return
		}
		if len(rq.Keys) != 2 || len(rq.Fair) != 2 {
			t.Fatalf("payload %q: request %+v", payload, rq)
		}
		if _, err := quotas.NewModel().AllowAt(time.Unix(1e9, 0), set, rq); err != nil {
			t.Fatalf("payload %q: keys %q: %v", payload, rq.Keys, err)
		}
	})
}

// TestCostPolicyErrors: cost and default_cost are checked
// like the rest of a rule, each error naming the line and the field.
func TestCostPolicyErrors(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"cost on concurrency", doc("concurrency: {max: 2, lease: 30s}\n    cost: \"{{.units}}\""), `policy: line 5: rule "a": cost: a concurrency rule takes one slot per task; only gcra, adaptive, quota and sliding rules have a cost`},
		{"cost zero", doc("gcra: {rate: 30, per: 1s, burst: 30}\n    cost: 0"), `policy: line 5: rule "a": cost: must be a whole number of at least 1, got 0`},
		{"cost above burst", doc("gcra: {rate: 30, per: 1s, burst: 30}\n    cost: 31"), `policy: line 5: rule "a": cost: 31 is above the rule's burst of 30: no task could ever pass`},
		{"cost above window", doc("quota: {limit: 10, every: 1m}\n    cost: \"11\""), `policy: line 5: rule "a": cost: 11 is above the rule's limit of 10: no task could ever pass`},
		{"cost literal text", doc("gcra: {rate: 30, per: 1s}\n    cost: three"), `policy: line 5: rule "a": cost: must be a whole number of at least 1 or a template over the payload such as "{{.units}}", got "three"`},
		{"cost bad template", doc("gcra: {rate: 30, per: 1s}\n    cost: \"{{units}}\""), `policy: line 5: rule "a": cost: bad template "{{units}}": only field references`},
		{"cost a list", doc("gcra: {rate: 30, per: 1s}\n    cost: [1]"), `policy: line 5: rule "a": cost: must be a string, got a list`},
		{"cost with prefetch", doc("gcra: {rate: 1000, per: 1s, burst: 100}\n    prefetch: 5ms\n    cost: 2"), `policy: line 6: rule "a": cost: a rule with prefetch hands out one unit per task; remove prefetch or cost`},
		{"default_cost without cost", doc("gcra: {rate: 30, per: 1s}\n    default_cost: 1"), `policy: line 5: rule "a": default_cost: set, but the rule has no cost`},
		{"default_cost with a literal", doc("gcra: {rate: 30, per: 1s, burst: 5}\n    cost: 2\n    default_cost: 1"), `policy: line 6: rule "a": default_cost: set, but cost references no payload field that could be missing`},
		{"default_cost zero or less", doc("gcra: {rate: 30, per: 1s}\n    cost: \"{{.u}}\"\n    default_cost: -1"), `policy: line 6: rule "a": default_cost: must be a whole number of at least 1, got -1`},
		{"default_cost above burst", doc("gcra: {rate: 30, per: 1s, burst: 3}\n    cost: \"{{.u}}\"\n    default_cost: 4"), `policy: line 6: rule "a": default_cost: 4 is above the rule's burst of 3: no task could ever pass`},
		{"default_cost not whole", doc("gcra: {rate: 30, per: 1s}\n    cost: \"{{.u}}\"\n    default_cost: 1.5"), `policy: line 6: rule "a": default_cost: must be a whole number`},
		{"settle_header is the worker's", doc("gcra: {rate: 30, per: 1s}\n    cost: \"{{.u}}\"\n    settle_header: X-Cost"), `policy: line 6: rule "a": settle_header: unknown field; expected name, match, key, default_key, fair, tier, priority, tiers, mode, soft, borrow, prefetch, cost, default_cost, gcra, adaptive, quota, sliding, concurrency or adaptive_concurrency`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got  %v\nwant %s", err, tc.want)
			}
		})
	}
	// Go: the same checks, by field.
	_, err := New(Rule{Name: "c", Match: Match{Type: "x"}, Cost: "2", Limit: limits.Concurrency{Max: 2, Lease: time.Minute}})
	if err == nil || !strings.Contains(err.Error(), `rule "c": cost: a concurrency rule`) {
		t.Errorf("New: %v", err)
	}
}

// TestPrefetchOff: prefetch: off (or false) is NoPrefetch, which the
// binding's rules do not carry (a limits.Rule has no such value).
func TestPrefetchOff(t *testing.T) {
	for _, v := range []string{"off", "false"} {
		p, err := Parse([]byte(doc("quota: {limit: 500, every: 1s}\n    prefetch: " + v)))
		if err != nil {
			t.Fatalf("prefetch: %s: %v", v, err)
		}
		if got := p.Rules()[0].Prefetch; got != NoPrefetch {
			t.Errorf("prefetch: %s reads as %v, want NoPrefetch", v, got)
		}
		if got := p.Bind("http:call", "q").Rules()[0].Prefetch; got != 0 {
			t.Errorf("prefetch: %s: the bound rule has prefetch %v, want 0", v, got)
		}
	}
}

// TestAdaptiveConcurrency: adaptive_concurrency is a limits.Concurrency
// that learns, min 1 by default; a key makes one learned limit per key.
func TestAdaptiveConcurrency(t *testing.T) {
	p, err := Parse([]byte(`
rules:
  - name: search
    match: {type: "search:*"}
    key: "{{.endpoint}}"
    adaptive_concurrency: {max: 64, lease: 30s}
  - name: index
    match: {type: "index"}
    adaptive_concurrency: {min: 4, max: 8, lease: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		typ  string
		want limits.Concurrency
	}{
		{"search:q", limits.Concurrency{Adaptive: true, Min: 1, Max: 64, Lease: 30 * time.Second}},
		{"index", limits.Concurrency{Adaptive: true, Min: 4, Max: 8, Lease: time.Minute}},
	} {
		rules := p.Bind(c.typ, "default").Rules()
		if len(rules) != 1 || rules[0].Limit != c.want {
			t.Errorf("%s: %+v, want %+v", c.typ, rules, c.want)
		}
	}
	if got := (limits.Concurrency{Adaptive: true, Min: 4, Max: 8, Lease: time.Minute}).String(); got != "4-8 at once, learned, lease 1m0s (adaptive concurrency)" {
		t.Errorf("String: %q", got)
	}
	// An override or a plan keeps the kind of limit: adaptive or not.
	keyed := "rules:\n  - name: c\n    match: {type: job}\n    key: \"{{.b}}\"\n    fair: \"{{.f}}\"\n    concurrency: {max: 4, lease: 30s}\n"
	for _, c := range []struct{ doc, want string }{
		{keyed + "overrides:\n  - {rule: c, key: b1, adaptive_concurrency: {max: 9, lease: 30s}}\n",
			`overrides[1].adaptive_concurrency: is 1-9 at once, learned, lease 30s (adaptive concurrency); rule "c" is 4 at once, lease 30s (concurrency)`},
		{strings.Replace(keyed, "    concurrency:", "    tiers: {pro: {adaptive_concurrency: {max: 9, lease: 30s}}}\n    concurrency:", 1),
			`tiers.pro.adaptive_concurrency: is 1-9 at once, learned, lease 30s (adaptive concurrency); the rule is 4 at once, lease 30s (concurrency), and a plan keeps the kind of limit`},
	} {
		if _, err := Parse([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.doc, err, c.want)
		}
	}
}
