package taskrl

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/taskrl/taskrl/policy"
)

// TestDocPolicies: every YAML example in README.md and docs/*.md is a
// policy this package accepts: a whole policy as written, a list of rules
// under rules:, a top-level section beside a rule. Docs that drift from
// the parser fail here.
func TestDocPolicies(t *testing.T) {
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md"}, files...)
	total := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks := regexp.MustCompile("(?s)\n( *)```yaml\n(.*?)\n *```").FindAllStringSubmatch(string(b), -1)
		total += len(blocks)
		for i, m := range blocks {
			var lines []string
			for _, l := range strings.Split(m[2], "\n") {
				lines = append(lines, strings.TrimPrefix(l, m[1]))
			}
			doc := strings.Join(lines, "\n") + "\n"
			switch {
			case strings.HasPrefix(doc, "- "):
				doc = "rules:\n  " + strings.ReplaceAll(strings.TrimSuffix(doc, "\n"), "\n", "\n  ") + "\n"
			case !strings.Contains(doc, "\nrules:") && !strings.HasPrefix(doc, "rules:"):
				doc += "rules:\n  - {name: other, match: {queue: other}, gcra: {rate: 1, per: 1s}}\n"
			}
			if _, err := policy.Parse([]byte(doc)); err != nil {
				t.Errorf("%s, YAML example %d:\n%s\nis refused: %v", filepath.Base(f), i+1, doc, err)
			}
		}
	}
	if total < 6 {
		t.Fatalf("found %d YAML examples in README.md and docs/*.md; expected at least 6", total)
	}
}

// TestDocLinks: every relative link in README.md, BENCHMARKS.md,
// examples/README.md, examples/redis-acl/README.md and docs/*.md names a file of the repository, and
// its #anchor, if any, a heading of that file (as GitHub makes anchors of
// headings). Links inside code are not links.
func TestDocLinks(t *testing.T) {
	files, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../README.md", "../BENCHMARKS.md", "../examples/README.md", "../examples/redis-acl/README.md"}, files...)
	fence := regexp.MustCompile("(?s)```.*?```")
	code := regexp.MustCompile("`[^`\n]*`")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		a := map[string]bool{}
		for _, l := range strings.Split(fence.ReplaceAllString(string(b), ""), "\n") {
			if !strings.HasPrefix(l, "#") {
				continue
			}
			slug := githubAnchor(strings.TrimLeft(l, "# "))
			for n := 0; ; n++ { // a repeated heading gets -1, -2, ...
				s := slug
				if n > 0 {
					s += "-" + strconv.Itoa(n)
				}
				if !a[s] {
					a[s] = true
					break
				}
			}
		}
		anchors[path] = a
		return a
	}
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := code.ReplaceAllString(fence.ReplaceAllString(string(b), ""), "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: link %q: no such file %s", f, target, resolved)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(resolved, ".md") && !anchorsOf(resolved)[anchor] {
				t.Errorf("%s: link %q: %s has no heading with that anchor", f, target, resolved)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d relative links found: the pattern is broken", checked)
	}
}

// githubAnchor is the anchor GitHub gives a heading: lower case, without
// punctuation but hyphens and underscores, spaces as hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
