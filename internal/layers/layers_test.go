package layers

import (
	"encoding/json"
	"io"
	"os"
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
	// Everything in internal/ is a foundation or test support.
	{"internal/", "", []string{"gcra", "quotas", "taskrl", "cmd/", "examples/"}},
	{"limits", "", []string{"gcra", "quotas", "taskrl", "cmd/", "examples/"}},
	{"gcra", "", []string{"quotas", "taskrl", "cmd/", "examples/"}},
	{"policy", "", []string{"gcra", "quotas", "taskrl", "cmd/", "examples/"}},
	{"quotas", "", []string{"taskrl", "cmd/", "examples/"}},
	{"taskrl", "", []string{"cmd/", "examples/"}},
}

// TestImportsRunOneWay lists every package of the module with go list and
// fails on an import that goes up a layer.
func TestImportsRunOneWay(t *testing.T) {
	pkgs := modulePackages(t)
	for _, p := range pkgs {
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
}

// pure lists the packages that must not depend on Redis or asynq, even
// through another package: the rule vocabulary and the policy language.
var pure = []string{"limits", "policy"}

// TestPureLanguage fails when a package of pure depends, directly or not,
// on go-redis or asynq.
func TestPureLanguage(t *testing.T) {
	for _, p := range pure {
		out, err := exec.Command("go", "list", "-deps", module+p).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", p, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 5 {
			t.Fatalf("go list -deps %s listed %d packages", p, len(deps))
		}
		for _, d := range deps {
			if strings.HasPrefix(d, "github.com/redis/") || strings.HasPrefix(d, "github.com/hibiken/asynq") {
				t.Errorf("%s depends on %s", p, d)
			}
		}
	}
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// modulePackages lists the module's packages with their non-test imports.
func modulePackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list listed %d packages; want the whole module", len(pkgs))
	}
	return pkgs
}

// TestDesignTable checks docs/design.md's table of package layers against
// go list: every package of the module has a row, and each package's
// imports within the module are the ones its row names ("none": none).
func TestDesignTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "| layer | package | imports within the module |")
	if start < 0 {
		t.Fatal("design.md has no layer table")
	}
	type row struct {
		pkgs    []string
		imports map[string]bool
		none    bool
		tests   bool // test files only: not checked
	}
	var rows []row
	for _, line := range strings.Split(text[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("layer table row %q: want 3 cells", line)
		}
		r := row{imports: map[string]bool{}}
		for _, f := range strings.Split(unparen(cells[1]), "`") {
			if f = strings.TrimSpace(f); f != "" && !strings.ContainsAny(f, ", ") {
				r.pkgs = append(r.pkgs, f)
			}
		}
		imp := strings.TrimSpace(unparen(cells[2]))
		r.none = imp == "none" || strings.HasPrefix(imp, "none:")
		r.tests = strings.HasPrefix(imp, "test files only")
		for _, w := range strings.FieldsFunc(imp, func(c rune) bool { return c == ',' || c == ';' || c == ':' || c == ' ' }) {
			r.imports[w] = true
		}
		rows = append(rows, r)
	}
	find := func(pkg string) *row {
		for i, r := range rows {
			for _, p := range r.pkgs {
				if p == pkg || strings.HasSuffix(p, "/*") && strings.HasPrefix(pkg, strings.TrimSuffix(p, "*")) && !strings.Contains(strings.TrimPrefix(pkg, strings.TrimSuffix(p, "*")), "/") {
					return &rows[i]
				}
			}
		}
		return nil
	}
	for _, p := range modulePackages(t) {
		rel := strings.TrimPrefix(p.ImportPath, module)
		r := find(rel)
		if r == nil {
			t.Errorf("design.md's layer table has no row for %s", rel)
			continue
		}
		if r.tests {
			continue
		}
		for _, imp := range p.Imports {
			dep, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			name := dep[strings.LastIndex(dep, "/")+1:]
			if r.none || !r.imports[name] {
				t.Errorf("%s imports %s, which its row in design.md's layer table does not name", rel, dep)
			}
		}
	}
}

// unparen drops what is in parentheses.
func unparen(s string) string {
	var b strings.Builder
	depth := 0
	for _, c := range s {
		switch {
		case c == '(':
			depth++
		case c == ')' && depth > 0:
			depth--
		case depth == 0:
			b.WriteRune(c)
		}
	}
	return b.String()
}
