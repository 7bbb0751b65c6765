// Package script holds the Lua library shared by the Redis scripts of gcra,
// quotas and taskrl (lua/gcra.lua: the GCRA arithmetic and the helpers every
// script uses), so that it is written once, and builds scripts and
// programs from it. A package's own Lua lives in that package.
//
// Foundation layer, imported by gcra, quotas and taskrl.
package script

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var files embed.FS

// Source returns the embedded library file lua/<name>.lua. It panics if the
// file does not exist, which is a programming error caught by every test.
func Source(name string) string {
	b, err := files.ReadFile("lua/" + name + ".lua")
	if err != nil {
		panic("script: no embedded Lua library " + name)
	}
	return string(b)
}

// Text concatenates the named library files and main, in that order, into
// the text of one script.
func Text(main string, libs ...string) string {
	var b strings.Builder
	for _, l := range libs {
		b.WriteString(Source(l))
		b.WriteByte('\n')
	}
	b.WriteString(main)
	return b.String()
}

// New returns the script Text(main, libs...). go-redis runs it with EVALSHA
// and falls back to EVAL on NOSCRIPT.
func New(main string, libs ...string) *redis.Script {
	return redis.NewScript(Text(main, libs...))
}
