package taskrl

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmePolicies: every YAML example in the README is a policy this
// package accepts: a whole policy as written, a list of rules under rules:,
// a top-level section beside a rule. Docs that drift from the parser fail
// here.
func TestReadmePolicies(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)\n( *)```yaml\n(.*?)\n *```").FindAllStringSubmatch(string(b), -1)
	if len(blocks) < 6 {
		t.Fatalf("found %d YAML examples in README.md; expected at least 6", len(blocks))
	}
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
		if _, err := ParsePolicy([]byte(doc)); err != nil {
			t.Errorf("README example %d:\n%s\nis refused: %v", i+1, doc, err)
		}
	}
}
