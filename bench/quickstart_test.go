package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// ranLine is the quickstart summary's first line: "Ran 600 tasks in 37.2s
// from the first vendor call to the last; ideal under the policy 36.34s
// (+2.5%); ...". The ideal is computed by internal/testkit/ideal from the
// vendor's published limits, not from taskrl's code.
var ranLine = regexp.MustCompile(`ideal under the policy [0-9.]+s \(([+-][0-9.]+)%\)`)

// TestQuickstartFigure runs the README's first command as a newcomer does,
// the whole campaign of 600 tasks, on the embedded server and on this
// run's redis-server (REDIS_URL), and checks the run's time over the ideal
// schedule against the figures examples/README.md quotes, measured on 2
// cores: medians +0.9 % on the embedded server and +0.9 % on Redis (runs up
// to +3.0 % and +1.2 %). The bars are 5 % and 4 %: the goal on the
// embedded server, twice the ~2 % asked of Redis. (Before the pacer put
// due tasks at the head of the pending list, CI runs on the embedded
// server measured up to +8.6 %: docs/design.md 1.9.) A run over its bar is run twice more and the median of the three
// counts. About 80 s; skipped with -short.
func TestQuickstartFigure(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the full quickstart takes about 40 s a run")
	}
	bin := filepath.Join(t.TempDir(), "quickstart")
	build := exec.Command("go", "build", "-o", bin, "./examples/quickstart")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/quickstart: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name, redisURL string
		bar            float64
	}{
		{"embedded", "", 5},
		{"redis-server", "redis://" + env.Client.Options().Addr + "/0", 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			over := []float64{quickstartOver(t, bin, c.redisURL)}
			if over[0] > c.bar {
				over = append(over, quickstartOver(t, bin, c.redisURL), quickstartOver(t, bin, c.redisURL))
				slices.Sort(over)
			}
			t.Logf("%s: over the ideal: %v %%", c.name, over)
			if m := over[len(over)/2]; m > c.bar {
				t.Errorf("quickstart on %s: median %+.1f %% over the ideal (runs %v), bar %+.1f %%", c.name, m, over, c.bar)
			}
		})
	}
}

// quickstartOver runs the quickstart binary once and returns its time over
// the ideal, in percent. The run must exit 0: every task exactly once, no
// 429, nothing archived or failed.
func quickstartOver(t *testing.T, bin, redisURL string) float64 {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "REDIS_URL="+redisURL)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
	m := ranLine.FindSubmatch(out)
	if m == nil {
		t.Fatalf("quickstart: no summary line\n%s", out)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
