package script

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// counterMain keeps a per-call cache in the library's state, as
// quotas/lua/booked.lua does, and returns how many keys the call saw and
// the cache's size: a function whose caches outlived a call would answer
// more.
const counterMain = `
local seen
local function run_call()
  seen = {}
  for i = 1, #KEYS do seen[KEYS[i]] = call('INCR', KEYS[i]) end
  local n = 0
  for _ in pairs(seen) do n = n + 1 end
  return {n, tonumber(ARGV[1])}
end

return run_call()
`

func run(t *testing.T, p *Program, c redis.UniversalClient, keys []string, arg int) []any {
	t.Helper()
	cmd := p.Head(len(keys))
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	v, err := p.Run(context.Background(), c, append(cmd, arg)).Slice()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestProgramAsFunction: on Redis 7 a program runs as a function, loaded by
// its first call and again after FUNCTION FLUSH; its caches start empty on
// every call; a second version of the library loads beside the first.
func TestProgramAsFunction(t *testing.T) {
	c := redistest.StartServer(t).Client(t) // its own: the test flushes functions
	ctx := context.Background()
	p := NewProgram(counterMain, "gcra")
	for i := range 3 {
		if v := run(t, p, c, []string{"a", "b"}, i); v[0].(int64) != 2 || v[1].(int64) != int64(i) {
			t.Fatalf("call %d: %v", i, v)
		}
	}
	st := redistest.CommandCalls(t, c)
	if st["fcall"] != 4 || st["function|load"] != 1 || st["evalsha"]+st["eval"] != 0 {
		t.Fatalf("commands %v: want 4 FCALL (one refused before the load), 1 FUNCTION LOAD, no script", st)
	}
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v := run(t, p, c, []string{"c"}, 7); v[0].(int64) != 1 {
		t.Fatalf("after FUNCTION FLUSH: %v", v)
	}
	other := NewProgram("-- another version\n"+counterMain, "gcra")
	if other.fn == p.fn {
		t.Fatal("two versions of a program share a library name")
	}
	run(t, other, c, []string{"d"}, 1)
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil || len(libs) != 2 {
		t.Fatalf("libraries %v %v, want both versions", libs, err)
	}
	if c.Get(ctx, "a").Val() != "3" || c.Get(ctx, "c").Val() != "1" {
		t.Fatalf("a=%s c=%s", c.Get(ctx, "a").Val(), c.Get(ctx, "c").Val())
	}
}

// TestProgramWithoutFunctions: a server where FCALL is an unknown command
// (Redis 6; here renamed away) runs the program as a script from the first
// call on, and loads it again after SCRIPT FLUSH.
func TestProgramWithoutFunctions(t *testing.T) {
	c := redistest.StartServer(t, "--rename-command", "FCALL", "").Client(t)
	ctx := context.Background()
	p := NewProgram(counterMain, "gcra")
	for i := range 3 {
		if v := run(t, p, c, []string{"a", "b"}, i); v[0].(int64) != 2 {
			t.Fatalf("call %d: %v", i, v)
		}
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	run(t, p, c, []string{"a"}, 0)
	if h := p.Head(1); h[0] != "evalsha" {
		t.Fatalf("head %v after FCALL was refused", h)
	}
	st := redistest.CommandCalls(t, c)
	if st["evalsha"] != 4 || st["eval"] != 2 {
		t.Fatalf("commands %v: want 4 EVALSHA (2 met NOSCRIPT) and 2 EVAL", st)
	}
}

// TestProgramOnCluster: the library is loaded on every master, so keys in
// every slot run it.
func TestProgramOnCluster(t *testing.T) {
	c := redistest.Cluster(t)
	p := NewProgram(counterMain, "gcra")
	prefix := redistest.Prefix(t)
	for i := range 30 {
		k := prefix + string(rune('a'+i%26)) + strings.Repeat("x", i)
		if v := run(t, p, c, []string{k}, i); v[0].(int64) != 1 {
			t.Fatalf("key %s: %v", k, v)
		}
	}
}

func TestNewProgramNeedsRunCall(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("a main without run_call accepted")
		}
	}()
	NewProgram("return 1", "gcra")
}

// TestProgramWithoutFunctionLoad: a user whose ACL grants FCALL but not
// FUNCTION LOAD (or neither) gets the program as a script.
func TestProgramWithoutFunctionLoad(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client(t)
	ctx := context.Background()
	for _, rules := range [][]string{{"-function"}, {"-function", "-fcall"}} {
		user := "limited" + strings.Join(rules, "")
		if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", user, "on", ">pw", "~*", "+@all"}, toAny(rules)...)...).Err(); err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: user, Password: "pw"})
		t.Cleanup(func() { c.Close() })
		p := NewProgram(counterMain, "gcra")
		for i := range 2 {
			if v := run(t, p, c, []string{"a"}, i); v[0].(int64) != 1 {
				t.Fatalf("%v: call %d: %v", rules, i, v)
			}
		}
		if h := p.Head(1); h[0] != "evalsha" {
			t.Fatalf("%v: head %v", rules, h)
		}
	}
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, x := range s {
		out[i] = x
	}
	return out
}
