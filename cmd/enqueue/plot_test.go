package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "TestREADMEPlot: write docs/schedule.svg afresh")

// readmeCommand is the command README.md says made docs/schedule.svg, run
// from the repository's root.
var readmeCommand = []string{"--dry-run", "--policy", "examples/policy.yaml", "--url", "https://api.vendor.example/v1/send",
	"--count", "1000", "--businesses", "20", "--start", "2026-05-04T09:00:00Z", "--plot", "docs/schedule.svg"}

// TestREADMEPlot runs the command README.md quotes for its schedule plot
// (no Redis: idle limits) and fails when docs/schedule.svg is not what it
// writes; go test ./cmd/enqueue -run TestREADMEPlot -update writes it.
func TestREADMEPlot(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	quoted := "enqueue " + strings.Join(readmeCommand, " ")
	if !bytes.Contains(readme, []byte(quoted)) || !bytes.Contains(readme, []byte("](docs/schedule.svg)")) {
		t.Errorf("README.md does not show docs/schedule.svg made by `%s`", quoted)
	}
	out := filepath.Join(t.TempDir(), "schedule.svg")
	args := slicesReplace(readmeCommand, map[string]string{"examples/policy.yaml": "../../examples/policy.yaml", "docs/schedule.svg": out})
	code, stdout, stderr := enqueue(context.Background(), nil, args...)
	if code != 0 || !strings.Contains(stdout, "binding rule:") || stderr != "" {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(got, new(struct{})); err != nil {
		t.Fatalf("the plot does not parse: %v", err)
	}
	const committed = "../../docs/schedule.svg"
	if *update {
		if err := os.WriteFile(committed, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(committed)
	if err != nil {
		t.Fatalf("%v (write it with go test ./cmd/enqueue -run TestREADMEPlot -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/schedule.svg is not what the README's command writes now: go test ./cmd/enqueue -run TestREADMEPlot -update")
	}
}

func slicesReplace(s []string, by map[string]string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = v
		if r, ok := by[v]; ok {
			out[i] = r
		}
	}
	return out
}

// TestPlotFlag: --plot writes the chart of --dry-run and --simulate
// beside their tables, only with them, and reports a file it cannot write.
func TestPlotFlag(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(dryPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--url", "http://x", "--count", "3", "--plot", "a.svg"}, "--plot: only used with --dry-run or --simulate"},
		{[]string{"--url", "http://x", "--count", "3", "--cron", "@daily", "--plot", "a.svg"}, "--plot: only used with --dry-run or --simulate"},
		{[]string{"--dry-run", "--policy", policy, "--url", "http://x", "--count", "3", "--plot", " "}, "--plot: needs a file name"},
	} {
		code, _, errOut := enqueue(ctx, nil, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%q: exit %d, %q; want 2, %q", c.args, code, errOut, c.want)
		}
	}

	svg := filepath.Join(dir, "dry.svg")
	code, out, errOut := enqueue(ctx, nil, "--dry-run", "--policy", policy, "--url", "http://x", "--count", "1000", "--businesses", "1000",
		"--start", "2026-05-04T09:00:00Z", "--plot", svg)
	if code != 0 || !strings.Contains(out, "estimated duration:              9.90s") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte(`id="finish" data-seconds="9.9"`)) {
		t.Errorf("dry-run plot: %v\n%.600s", err, b)
	}

	svg = filepath.Join(dir, "sim.svg")
	code, out, errOut = enqueue(ctx, nil, "--simulate", "--policy", policy, "--vendor", "20/s for 10s, 5/s", "--duration", "20s", "--interval", "5s", "--plot", svg)
	if code != 0 || !strings.Contains(out, "total:") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte(`class="limit-line"`)) {
		t.Errorf("simulate plot: %v\n%.600s", err, b)
	}

	code, out, errOut = enqueue(ctx, nil, "--dry-run", "--policy", policy, "--url", "http://x", "--count", "3", "--plot", filepath.Join(dir, "none", "x.svg"))
	if code != 1 || !strings.Contains(errOut, "--plot "+filepath.Join(dir, "none", "x.svg")) || !strings.Contains(out, "binding rule:") {
		t.Errorf("unwritable --plot: exit %d\n%s%s", code, out, errOut)
	}
	// A directory in the way: the chart is written, then cannot replace it.
	sub := filepath.Join(dir, "sub")
	if err := os.MkdirAll(filepath.Join(sub, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = enqueue(ctx, nil, "--dry-run", "--policy", policy, "--url", "http://x", "--count", "3", "--plot", sub)
	if code != 1 || !strings.Contains(errOut, "--plot "+sub+": ") {
		t.Errorf("--plot over a directory: exit %d\n%s", code, errOut)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
