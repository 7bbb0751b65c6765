package quotas

import (
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/taskrl/taskrl/gcra"
)

// TestProtocolConstants checks that the Lua of the package names the
// protocol's constants only as protocolConsts defines them (its comments
// too; luaText panics on an unknown name in code), that no op, kind,
// status or argument position is written as a bare number, and that the
// composed scripts have every name replaced by its value.
func TestProtocolConstants(t *testing.T) {
	defined := map[string]bool{}
	for _, c := range protocolConsts {
		name := c.table + "." + c.name
		if defined[name] {
			t.Errorf("%s is defined twice", name)
		}
		defined[name] = true
	}
	ref := regexp.MustCompile(`\b(OP|ARG|KIND|ST|REPLY|LEASE|LARG)\.([A-Za-z_]\w*)`)
	literals := []*regexp.Regexp{
		regexp.MustCompile(`\b(op|kind)\s*[=~]=\s*-?\d`),                 // an op or kind compared with a number
		regexp.MustCompile(`ARGV\[a0\s*\+\s*\d`),                         // an argument by its position
		regexp.MustCompile(`\{\s*-?\d+\s*,\s*-?\d+\s*,\s*\w+\s*,\s*now`), // a reply with a bare status
		regexp.MustCompile(`reply\(\s*q\s*,\s*-?\d`),                     // likewise
		regexp.MustCompile(`prev\[1\]\s*[=~]=\s*-?\d`),                   // the previous reply's status
	}
	names, err := fs.Glob(luaFiles, "lua/*.lua")
	if err != nil || len(names) == 0 {
		t.Fatalf("no embedded Lua: %v", err)
	}
	for _, name := range names {
		src, err := luaFiles.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "--")
			for _, m := range ref.FindAllStringSubmatch(line, -1) {
				if !defined[m[1]+"."+m[2]] {
					t.Errorf("%s:%d: %s.%s is not a protocol constant (protocolConsts)", name, i+1, m[1], m[2])
				}
			}
			for _, re := range literals {
				if re.MatchString(code) {
					t.Errorf("%s:%d: a bare protocol literal: %s", name, i+1, strings.TrimSpace(line))
				}
			}
		}
	}
	for _, text := range []string{setProgram.Text(), leaseProgram.Text()} {
		for line := range strings.Lines(text) {
			code, _, _ := strings.Cut(line, "--")
			if ref.MatchString(code) {
				t.Errorf("a protocol constant is left in a composed script: %s", strings.TrimSpace(line))
			}
		}
	}
	if want := fmt.Sprintf("if op == %d then", leaseRenew); !strings.Contains(luaText("lease"), want) {
		t.Errorf("the lease script has no %q", want)
	}
}

// TestArgsLayout checks that args puts a request's arguments where the
// protocol's positions say the script reads them.
func TestArgsLayout(t *testing.T) {
	s, err := NewSet(Rule{Name: "a", Limit: GCRA(gcra.Limit{Rate: 10, Period: time.Second, Burst: 5})}, Rule{Name: "b", Limit: FixedWindow{Limit: 3, Every: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	l := &Limiter{prefix: "p:"}
	req := Request{Holder: "h", Critical: true, Cost: 2}
	calls, err := l.bind(s, req, false)
	if err != nil {
		t.Fatal(err)
	}
	p := params{op: opReserve, req: req, n: 2, horizon: time.Second, nonce: "x:", notBefore: 7}
	_, argv, end := l.args(calls, p, timing{now: 42, floor: 5})
	want := map[int]any{0: 1, argOp: opReserve, argNow: int64(42), argFloor: int64(5), argCost: int64(2),
		argHorizon: int64(1000000), argHolder: "h", argCritical: 1, argNonce: "x:", argAt: int64(7), argRules: 2}
	for i, v := range want {
		if argv[i] != v {
			t.Errorf("argv[%d] = %#v, want %#v", i, argv[i], v)
		}
	}
	if argv[specAt+1] != kindGCRA || end != len(argv) {
		t.Errorf("rules' parameters: argv[%d:] = %v, end %d", specAt, argv[specAt:], end)
	}
}
