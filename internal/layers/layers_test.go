package layers

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/taskrl/taskrl/"

// above lists, for a package path prefix, the module's paths it must not
// import (non-test imports).
var above = []struct {
	pkg     string
	exclude string // a path under pkg the rule does not cover yet
	forbid  []string
}{
	// internal/examples is the examples' support, to move under
	// examples/ (issue 27); everything else in internal/ is a foundation.
	{"internal/", "internal/examples/", []string{"gcra", "quotas", "taskrl", "cmd/", "examples/", "internal/examples/"}},
	{"gcra", "", []string{"quotas", "taskrl", "cmd/", "examples/"}},
	{"quotas", "", []string{"taskrl", "cmd/", "examples/"}},
	{"taskrl", "", []string{"cmd/", "examples/"}},
}

// TestImportsRunOneWay lists every package of the module with go list and
// fails on an import that goes up a layer.
func TestImportsRunOneWay(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	seen := 0
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		seen++
		rel := strings.TrimPrefix(p.ImportPath, module)
		for _, r := range above {
			if !strings.HasPrefix(rel, r.pkg) || r.exclude != "" && strings.HasPrefix(rel, r.exclude) {
				continue
			}
			for _, imp := range p.Imports {
				dep, ok := strings.CutPrefix(imp, module)
				if !ok {
					continue
				}
				for _, f := range r.forbid {
					if dep == strings.TrimSuffix(f, "/") || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
						t.Errorf("%s imports %s, a layer above it", rel, dep)
					}
				}
			}
		}
	}
	if seen < 20 {
		t.Fatalf("go list listed %d packages; want the whole module", seen)
	}
}
