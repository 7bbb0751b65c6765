package script

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// callMarker is the last line of a Program's main text: main defines a
// local function run_call that does one call's work and returns its reply.
const callMarker = "return run_call()"

// Program is a Lua program that Redis runs as a function where it can
// (Redis 7: the library is loaded once with FUNCTION LOAD, then each call is
// an FCALL), and as a script where it cannot (EVALSHA, then EVAL on
// NOSCRIPT). A script call runs the whole library's definitions before its
// work, about 20 µs of Redis time for quotas' set script, half a one-rule
// decision; a function's definitions run once, when its first call builds
// them.
//
// Its library is named taskrl_ and the first 12 hex digits of the SHA-1 of
// its text, so versions never collide and a fleet mid-upgrade runs each
// version's own code; a library outlives the processes that loaded it (as
// functions do: saved with the data, copied to replicas) and is loaded again
// when a server does not have it (a new Cluster master, FUNCTION FLUSH). The
// script form is used from the first reply that says FCALL is an unknown
// command (Redis 6) or not granted, or that refuses FUNCTION LOAD (an ACL
// without it), onwards. It is safe for concurrent use.
type Program struct {
	text    string        // the script form
	script  *redis.Script // its SHA-1
	lib     string        // the FUNCTION LOAD source
	fn      string        // the function's name
	scripts atomic.Bool   // the server has no functions: run as a script
}

// NewProgram returns the program Text(main, libs...), which must end with
// the line "return run_call()" (see Program). It panics otherwise, a
// programming error every test catches.
func NewProgram(main string, libs ...string) *Program {
	body := strings.TrimRight(main, "\n")
	if !strings.HasSuffix(body, callMarker) {
		panic("script: a program's main text must end with " + callMarker)
	}
	text := Text(main, libs...)
	sum := sha1.Sum([]byte(text))
	name := "taskrl_" + hex.EncodeToString(sum[:])[:12]
	// The library form: its top level may only register functions (Redis
	// runs it without the standard globals), so everything else is built
	// on the first call, in build, and KEYS and ARGV are the call's.
	lib := "#!lua name=" + name + "\n" +
		"local KEYS, ARGV\n" +
		"local function build()\n" + Text(strings.TrimSuffix(body, callMarker)+"return run_call\n", libs...) + "\nend\n" +
		"local run\n" +
		"redis.register_function('" + name + "', function(keys, args)\n" +
		"  KEYS, ARGV = keys, args\n" +
		"  if not run then run = build() end\n" +
		"  return run()\n" +
		"end)\n"
	return &Program{text: text, script: redis.NewScript(text), lib: lib, fn: name}
}

// NewScriptProgram returns the program Text(main, libs...) run as a script
// only (EVALSHA, EVAL on NOSCRIPT): for programs whose library is small.
func NewScriptProgram(main string, libs ...string) *Program {
	text := Text(main, libs...)
	p := &Program{text: text, script: redis.NewScript(text)}
	p.scripts.Store(true)
	return p
}

// Text returns the program's script form.
func (p *Program) Text() string { return p.text }

// Head returns the start of a command that runs the program with numKeys
// keys: FCALL or EVALSHA, the function or script, numKeys. Append the keys
// and the arguments and give it to Run.
func (p *Program) Head(numKeys int) []any {
	if p.scripts.Load() {
		return []any{"evalsha", p.script.Hash(), numKeys}
	}
	return []any{"fcall", p.fn, numKeys}
}

// Run sends cmd (built on Head) on c, loading the library or the script
// where the server lacks it, and returns the reply.
func (p *Program) Run(ctx context.Context, c redis.UniversalClient, cmd []any) *redis.Cmd {
	r := c.Do(ctx, cmd...)
	return p.Retry(ctx, c, cmd, r)
}

// Retry returns r, the reply to cmd, or, when r says the server lacks the
// program, the reply to cmd run again once it has it: for commands sent in a
// pipeline.
func (p *Program) Retry(ctx context.Context, c redis.UniversalClient, cmd []any, r *redis.Cmd) *redis.Cmd {
	err := r.Err()
	switch {
	case err == nil:
		return r
	case cmd[0] == "fcall" && redis.HasErrorPrefix(err, "Function not found"):
		if p.Load(ctx, c) == nil {
			return c.Do(ctx, cmd...)
		}
		// Not allowed to load it (an ACL without FUNCTION LOAD): scripts.
		fallthrough
	case cmd[0] == "fcall" && (redis.HasErrorPrefix(err, "unknown command") || redis.HasErrorPrefix(err, "NOPERM")):
		// Redis 6, or FCALL not granted: scripts from now on.
		p.scripts.Store(true)
		cmd[0], cmd[1] = "evalsha", p.script.Hash()
		return p.Retry(ctx, c, cmd, c.Do(ctx, cmd...))
	case cmd[0] == "evalsha" && redis.HasErrorPrefix(err, "NOSCRIPT"):
		cmd[0], cmd[1] = "eval", p.text
		r = c.Do(ctx, cmd...)
		cmd[0], cmd[1] = "evalsha", p.script.Hash()
		return r
	}
	return r
}

// Load loads the program on the server, or on every master of a Cluster
// or shard of a Ring, in the form it runs in; a library another process loaded meanwhile is no
// error. Calls load it themselves when they need to: Load only saves that
// round trip (a test that counts them).
func (p *Program) Load(ctx context.Context, c redis.UniversalClient) error {
	one := func(ctx context.Context, c redis.Cmdable) error {
		if p.scripts.Load() {
			return p.script.Load(ctx, c).Err()
		}
		err := c.FunctionLoad(ctx, p.lib).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	switch cc := c.(type) {
	case *redis.ClusterClient:
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return one(ctx, m) })
	case *redis.Ring:
		return cc.ForEachShard(ctx, func(ctx context.Context, m *redis.Client) error { return one(ctx, m) })
	}
	return one(ctx, c)
}
