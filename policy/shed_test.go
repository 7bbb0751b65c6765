package policy

import (
	"fmt"
	"testing"
	"time"

	"github.com/taskrl/taskrl/limits"
)

func TestParseShed(t *testing.T) {
	p, err := Parse([]byte("critical: [{queue: vip}]\nshed:\n  above: 0.8\n  classes: [bulk, {type: \"report:*\"}]\n" + doc("gcra: {rate: 1, per: 1s}")))
	if err != nil {
		t.Fatal(err)
	}
	s, ok := p.Shed()
	want := Shed{Signal: ShedFleetBusy, Above: 0.8, Classes: []Match{{Queue: "bulk"}, {Type: "report:*"}}, Grace: 2 * time.Second, Ramp: 5 * time.Second, Window: 10 * time.Second}
	if !ok || fmt.Sprint(s) != fmt.Sprint(want) {
		t.Fatalf("Shed() = %+v, %v; want %+v", s, ok, want)
	}
	if k := p.ShedClass("x", "bulk"); k != 0 {
		t.Errorf("bulk: class %d", k)
	}
	if k := p.ShedClass("report:daily", "q"); k != 1 {
		t.Errorf("report: class %d", k)
	}
	if k := p.ShedClass("x", "q"); k != -1 {
		t.Errorf("no class: %d", k)
	}
	if k := p.ShedClass("x", "vip"); k != -1 {
		t.Errorf("critical: class %d, want never deferred", k)
	}
	if q, err := p.WithFailureMode(FailOpen); err != nil || !hasShed(q) {
		t.Fatalf("WithFailureMode lost the shed section: %v", err)
	}
	if _, ok := mustNew(t, Rule{Name: "a", Match: Match{Type: "x"}, Limit: limits.GCRA{Rate: 1, Period: time.Second, Burst: 1}}).Shed(); ok {
		t.Error("a policy without a shed section has one")
	}

	for _, c := range []struct{ doc, want string }{
		{"shed: [a]\n", `policy: line 1: shed: must be a mapping, got a list`},
		{"shed:\n  above: 0.8\n  classes: [bulk]\n  level: 3\n", `policy: line 4: shed.level: unknown field; expected signal, above, classes, grace, ramp or window`},
		{"shed:\n  signal: cpu\n  above: 0.8\n  classes: [bulk]\n", `policy: line 2: shed.signal: must be fleet_busy, upstream_errors or probe, got "cpu"`},
		{"shed:\n  above: 80%\n  classes: [bulk]\n", `policy: line 2: shed.above: must be a number, got the string "80%"`},
		{"shed:\n  above: 1\n  classes: [bulk]\n", `policy: line 2: shed.above: must be a share between 0 and 1 (exclusive), such as 0.8, got 1`},
		{"shed:\n  above: 0.8\n", `policy: line 2: shed.classes: needs at least one class, least important first, such as - {queue: bulk}`},
		{"shed:\n  above: 0.8\n  classes: bulk\n", `policy: line 3: shed.classes: must be a list of classes, least important first, such as [{queue: bulk}, {queue: default}], got the string "bulk"`},
		{"shed:\n  above: 0.8\n  classes:\n    - bulk\n    - {type: \"a[\"}\n", `policy: line 5: shed.classes[2].type: bad pattern "a[": syntax error in pattern (see path.Match)`},
		{"shed:\n  above: 0.8\n  classes: [{}]\n", `policy: line 3: shed.classes[1]: needs a task type (type: ...) or a queue (queue: ...) or both`},
		{"shed:\n  above: 0.8\n  classes: [bulk]\n  ramp: 100ms\n", `policy: line 4: shed.ramp: must be at least 500ms, got 100ms`},
		{"shed:\n  above: 0.8\n  classes: [bulk]\n  window: 5\n", `policy: line 4: shed.window: 5 needs a unit, e.g. 5s (Go duration syntax: ms, s, m, h)`},
	} {
		_, err := Parse([]byte(c.doc + doc("gcra: {rate: 1, per: 1s}")))
		if err == nil || err.Error() != c.want {
			t.Errorf("%q:\n got %v\nwant %s", c.doc, err, c.want)
		}
	}
	if _, err := p.WithShed(Shed{Above: 0.5, Classes: []Match{{Queue: "a"}, {Type: "["}}}); err == nil || err.Error() != `policy: shed.classes[2].type: bad pattern "[": syntax error in pattern (see path.Match)` {
		t.Errorf("WithShed with a bad class: %v", err)
	}
}

func hasShed(p *Policy) bool { _, ok := p.Shed(); return ok }

func mustNew(t testing.TB, rules ...Rule) *Policy {
	t.Helper()
	p, err := New(rules...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
