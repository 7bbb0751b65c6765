package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"testing"
)

// TestCLIDocumented: every flag that enqueue --help prints is in
// docs/cli.md, as --name.
func TestCLIDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, stdio{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}); code != 0 {
		t.Fatalf("enqueue --help: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	names := regexp.MustCompile(`(?m)^  -([a-z][a-z-]+)`).FindAllStringSubmatch(out.String(), -1)
	if len(names) < 20 {
		t.Fatalf("found %d flags in enqueue --help:\n%s", len(names), out.String())
	}
	for _, m := range names {
		if !regexp.MustCompile(`--` + m[1] + `([^a-z-]|$)`).Match(doc) {
			t.Errorf("enqueue --help prints -%s, which docs/cli.md does not list as --%s", m[1], m[1])
		}
	}
}
