package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"testing"
)

// TestCLIDocumented: every flag that worker --help, worker limits --help
// and worker status --help print is in docs/cli.md, as --name.
func TestCLIDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	flagName := regexp.MustCompile(`(?m)^\s+(?:-h, )?--([a-z][a-z-]+)`)
	listed := regexp.MustCompile(`--([a-z][a-z-]+)`)
	for _, args := range [][]string{{"--help"}, {"limits", "--help"}, {"status", "--help"}} {
		var out, errOut bytes.Buffer
		if code := cli(context.Background(), args, func(string) string { return "" }, &out, &errOut); code != 0 {
			t.Fatalf("worker %v: exit %d\n%s%s", args, code, out.String(), errOut.String())
		}
		// A flag line starts with its name; the "--redis URL, --redis-cluster
		// NODES, ..." lines of the subcommands list several.
		names := flagName.FindAllString(out.String(), -1)
		for _, m := range regexp.MustCompile(`(?m)^  --redis URL, .*(?:\n  --redis-tls-ca FILE)?`).FindAllString(out.String(), -1) {
			names = append(names, m)
		}
		if len(names) < 3 {
			t.Fatalf("worker %v: found %d flags in the help:\n%s", args, len(names), out.String())
		}
		for _, l := range names {
			for _, f := range listed.FindAllStringSubmatch(l, -1) {
				if !regexp.MustCompile(`--` + f[1] + `([^a-z-]|$)`).Match(doc) {
					t.Errorf("worker %v prints --%s, which docs/cli.md does not list", args, f[1])
				}
			}
		}
	}
}
