package quotas

import (
	"embed"
	"regexp"
	"strconv"
	"strings"

	"github.com/taskrl/taskrl/internal/script"
)

// The protocol between the Limiter and its scripts (lua/quotas.lua decides
// rule sets, lua/lease.lua renews and releases leases) is defined here
// once: the op codes, the positions of a request's and a lease's
// arguments, the rule kinds, the reply statuses and layout are Go
// constants. The Lua names them OP.ALLOW, ARG.NOW, KIND.GCRA, ST.DENIED,
// REPLY.HEAD, LEASE.RENEW, LARG.TOKEN (protocolConsts),
// and luaText replaces each name by its value when it composes a script,
// so the script compares with literals, as fast as before, and a name Go
// does not define fails every test (luaText panics). TestProtocolConstants
// checks that no op, kind, status or argument position is written in the
// Lua as a bare number.

// Ops of a request of the set script (its argument ARG.OP).
const (
	opAllow      = iota
	opReserve    // book the earliest moment every rule but concurrency admits
	opRefund     // undo a charge
	opStatus     // every rule's state, nothing charged
	opBlock      // admit nothing until a time
	opHeld       // whether a charge's booking is still its own
	opEarliest   // a reserve's moment, nothing charged (Cluster)
	opReserveAt  // a reserve of exactly p.notBefore, or nothing (Cluster)
	opAllowAfter // an allow at the previous request's now, if it was admitted then (ReserveAndAllow)
	opSettle     // a charge becomes its actual cost (Settle)
)

// Positions of one request's arguments in the argv args builds, whose
// element 0 is the call's number of requests: the script reads argument
// argX of the request whose arguments follow ARGV[a0] as ARGV[a0 + ARG.X].
const (
	argOp       = iota + 1
	argNow      // explicit now, µs, or -1 for the server's TIME
	argFloor    // TTL floor, ms
	argCost     // the cost of every rule, or one per rule joined by commas
	argHorizon  // reserve horizon, µs; refund, held, settle: when the charge was decided
	argHolder   // holder id (concurrency)
	argCritical // 1: the request is critical
	argNonce    // names the request's GCRA bookings and sliding-window entries
	argAt       // refund, held, settle: the charge's time; reserve: not before; block: until
	argRules    // the number of rules, then each rule's kind and parameters (specAt)
)

// Rule kinds: the first argument of a rule's parameters (compiled.args).
const (
	kindGCRA = iota + 1
	kindFixed
	kindCalendar
	kindSliding
	kindConcurrency
	kindAdaptive // only in the script's arguments: a GCRA rule with learn
)

// Statuses: the first element of a request's reply.
const (
	stDenied   = 0  // denied, not booked, not held
	stAdmitted = 1  // admitted, booked, refunded, settled, blocked, held
	stNoTicks  = -2 // a calendar rule's ticks do not cover the server's now
	stSkipped  = -3 // an allow after whose previous request was not admitted at its now
)

// The layout of a request's reply: a head of replyHead fields (status,
// wait, rule, now, t), then, except for ST.NO_TICKS, ST.SKIPPED and held
// replies, replyRule fields per rule (used, remaining, reset_after, u1,
// u2, em).
const (
	replyHead = 5
	replyRule = 6
)

// Ops of the lease program (a lease's argument LARG.OP).
const (
	leaseRenew = iota
	leaseRelease
	leaseDrop // release whatever the token: a kept slot's holder whose call failed
)

// Positions of one lease's arguments in a call of the lease program, from
// the lease's first (ARGV[a + LARG.X]); leaseArgs of them per lease.
const (
	largOp     = iota
	largNow    // explicit now, µs, or -1 for the server's TIME
	largFloor  // TTL floor, ms
	largHolder // holder id
	largToken  // fencing token
	largLength // renew: new lease length, µs
	largKeys   // the lease's number of keys
	largAmin   // an adaptive rule's Min, else 0
	largAmax   // an adaptive rule's Max, else 0
	largLat    // release: the call's latency, µs (0: none)
	largOver   // release: 1 if the call reported overload
	leaseArgs
)

// protocolConsts names the constants above in Lua, by table.
var protocolConsts = []struct {
	table, name string
	value       int
}{
	{"OP", "ALLOW", opAllow}, {"OP", "RESERVE", opReserve}, {"OP", "REFUND", opRefund},
	{"OP", "STATUS", opStatus}, {"OP", "BLOCK", opBlock}, {"OP", "HELD", opHeld},
	{"OP", "EARLIEST", opEarliest}, {"OP", "RESERVE_AT", opReserveAt},
	{"OP", "ALLOW_AFTER", opAllowAfter}, {"OP", "SETTLE", opSettle},
	{"ARG", "OP", argOp}, {"ARG", "NOW", argNow}, {"ARG", "FLOOR", argFloor},
	{"ARG", "COST", argCost}, {"ARG", "HORIZON", argHorizon}, {"ARG", "HOLDER", argHolder},
	{"ARG", "CRITICAL", argCritical}, {"ARG", "NONCE", argNonce}, {"ARG", "AT", argAt},
	{"ARG", "RULES", argRules},
	{"KIND", "GCRA", kindGCRA}, {"KIND", "FIXED", kindFixed}, {"KIND", "CALENDAR", kindCalendar},
	{"KIND", "SLIDING", kindSliding}, {"KIND", "CONCURRENCY", kindConcurrency},
	{"KIND", "ADAPTIVE", kindAdaptive},
	{"ST", "DENIED", stDenied}, {"ST", "ADMITTED", stAdmitted}, {"ST", "NO_TICKS", stNoTicks},
	{"ST", "SKIPPED", stSkipped},
	{"REPLY", "HEAD", replyHead}, {"REPLY", "RULE", replyRule},
	{"LEASE", "RENEW", leaseRenew}, {"LEASE", "RELEASE", leaseRelease}, {"LEASE", "DROP", leaseDrop},
	{"LARG", "OP", largOp}, {"LARG", "NOW", largNow}, {"LARG", "FLOOR", largFloor}, {"LARG", "HOLDER", largHolder},
	{"LARG", "TOKEN", largToken}, {"LARG", "LENGTH", largLength}, {"LARG", "KEYS", largKeys},
	{"LARG", "AMIN", largAmin}, {"LARG", "AMAX", largAmax}, {"LARG", "LAT", largLat}, {"LARG", "OVER", largOver}, {"LARG", "N", leaseArgs},
}

//go:embed lua/*.lua
var luaFiles embed.FS

// protocolName is a protocol constant's name in the Lua.
var protocolName = regexp.MustCompile(`\b(OP|ARG|KIND|ST|REPLY|LEASE|LARG)\.([A-Za-z_]\w*)`)

// luaText returns the text of the package's Lua files lua/<name>.lua, in
// order, with every protocol constant the code (not a comment) names
// replaced by its value: one script's text, composed after the shared
// internal/script libraries. It panics on a name protocolConsts does not
// define, a programming error every test catches.
func luaText(names ...string) string {
	values := map[string]string{}
	for _, c := range protocolConsts {
		// A negative value in parentheses: "a - -2" would start a comment.
		v := strconv.Itoa(c.value)
		if c.value < 0 {
			v = "(" + v + ")"
		}
		values[c.table+"."+c.name] = v
	}
	var b strings.Builder
	for i, n := range names {
		src, err := luaFiles.ReadFile("lua/" + n + ".lua")
		if err != nil {
			panic("quotas: no embedded Lua file " + n)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		for line := range strings.Lines(string(src)) {
			code, comment, found := strings.Cut(line, "--")
			b.WriteString(protocolName.ReplaceAllStringFunc(code, func(name string) string {
				v, ok := values[name]
				if !ok {
					panic("quotas: lua/" + n + ".lua names " + name + ", which is no protocol constant")
				}
				return v
			}))
			if found {
				b.WriteString("--" + comment)
			}
		}
	}
	return b.String()
}

var (
	// setProgram decides rule sets; Redis runs it as a function where it
	// can (script.Program): its library is large.
	setProgram = script.NewProgram(luaText("booked", "rules", "learn", "quotas"), "gcra")
	// leaseProgram renews, releases and drops leases, a function too: a
	// script call would run rules.lua's definitions for each lease.
	leaseProgram = script.NewProgram(luaText("rules", "lease"), "gcra")
)
