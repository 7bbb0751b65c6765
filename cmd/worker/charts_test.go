package main

import (
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/cmd/internal/history"
	"github.com/taskrl/taskrl/internal/testkit/redistest"
	"github.com/taskrl/taskrl/policy"
)

const chartsPolicy = `rules:
  - name: sends
    match: {type: "http:call"}
    gcra: {rate: 10, per: 1s, burst: 2}
  - name: per-business
    match: {type: "http:call"}
    key: "{{.business_id}}"
    gcra: {rate: 8, per: 1s, burst: 1}
`

// TestLiveCharts runs a fleet of three workers, one serving the live page,
// through 150 calls under a global 10/s and 8/s per business (100 of them
// of one business), and looks at the page's charts in headless Chromium
// twice, a step apart: the charts moved, the limit line of the global rule
// is at 10/s on its axis, the busy business has a line of its own and the
// backlog shows as tasks waiting. Once every task ran and the workers
// stopped, the history counts each task admitted once, under both rules,
// and no step above the rate.
func TestLiveCharts(t *testing.T) {
	chrome := findChrome(t, "the charts are")
	a := newAPI(t)
	prefix := redistest.Prefix(t)
	policyFile := writePolicy(t, chartsPolicy)
	queue := redistest.Queue(t, redistest.Client(t), "charts")
	ctx, cancel := context.WithCancel(context.Background())
	var dones []chan struct{}
	addr := ""
	for w := 0; w < 3; w++ {
		logs := &logBuffer{}
		done := make(chan struct{})
		dones = append(dones, done)
		args := []string{"--redis", "redis://" + redistest.Addr(t), "--policy", policyFile, "--concurrency", "8", "--queues", queue, "--prefix", prefix}
		if w == 0 {
			args = append(args, "--metrics-addr", "127.0.0.1:0")
		}
		go func() {
			defer close(done)
			cli(ctx, args, noEnv, io.Discard, logs)
		}()
		if w == 0 {
			addr = logs.waitFor(t, regexp.MustCompile(`level=INFO msg="metrics listening" addr=(\S+)`), done)[1]
		}
		logs.waitFor(t, regexp.MustCompile(`msg="worker started"`), done)
	}
	done := false
	stop := func() {
		if !done {
			done = true
			cancel()
			for _, d := range dones {
				<-d
			}
		}
	}
	defer stop()
	client := asynq.NewClientFromRedisClient(redistest.Client(t))
	const tasks = 150
	for i := 0; i < tasks; i++ {
		business := "b1"
		if i%3 == 2 {
			business = fmt.Sprint("b", 2+i%4)
		}
		payload := fmt.Sprintf(`{"url": %q, "business_id": %q}`, a.URL+"/ok", business)
		if _, err := client.Enqueue(asynq.NewTask("http:call", []byte(payload)), asynq.Queue(queue)); err != nil {
			t.Fatal(err)
		}
	}

	// page renders / in Chromium: its DOM and a screenshot.
	page := func() (string, image.Image) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer ccancel()
		flags := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars", "--virtual-time-budget=3000"}
		dom, err := exec.CommandContext(cctx, chrome, append(flags, "--user-data-dir="+t.TempDir(), "--dump-dom", "http://"+addr+"/")...).Output()
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		// The charts alone (?charts): the table's times change at every
		// look.
		shot := t.TempDir() + "/page.png"
		if out, err := exec.CommandContext(cctx, chrome, append(flags, "--user-data-dir="+t.TempDir(), "--window-size=1100,560", "--screenshot="+shot, "http://"+addr+"/?charts")...).CombinedOutput(); err != nil {
			t.Fatalf("screenshot: %v\n%s", err, out)
		}
		f, err := os.Open(shot)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatal(err)
		}
		if keep := os.Getenv("TASKRL_CHARTS_SCREENSHOT"); keep != "" {
			// For docs/operations.md: TASKRL_CHARTS_SCREENSHOT=$PWD/docs/live-charts.png go test -run TestLiveCharts ./cmd/worker
			data, _ := os.ReadFile(shot)
			os.WriteFile(keep, data, 0o644)
		}
		return string(dom), img
	}
	// Two steps with calls, then the page; a step later, the page again.
	time.Sleep(2*history.Step + time.Second)
	dom1, img1 := page()
	time.Sleep(history.Step + time.Second)
	dom2, img2 := page()

	sends := regexp.MustCompile(`(?s)<figure data-rule="sends">.*?</figure>`)
	fig1, fig2 := sends.FindString(dom1), sends.FindString(dom2)
	if fig1 == "" || fig2 == "" {
		t.Fatalf("no chart of rule sends:\n%s", dom2)
	}
	level := regexp.MustCompile(`<svg[^>]*class="main".*?<polyline points="([^"]+)"[^>]*class="level"`)
	l1, l2 := level.FindStringSubmatch(fig1), level.FindStringSubmatch(fig2)
	if l1 == nil || l2 == nil || l1[1] == l2[1] {
		t.Errorf("the admitted line did not move between the two views:\n%s\n%s", fig1, fig2)
	}
	// The limit line sits at 10/s on the y axis: between the ticks at 0
	// and the top, where 10 falls.
	tick := regexp.MustCompile(`class="ytick" data-value="([^"]+)" data-y="([^"]+)"`)
	main := regexp.MustCompile(`<svg[^>]*class="main".*?</svg>`).FindString(fig2)
	ticks := tick.FindAllStringSubmatch(main, -1)
	limit := regexp.MustCompile(`<polyline points="([^"]+)"[^>]*class="limit" data-last="([^"]+)"`).FindStringSubmatch(main)
	if len(ticks) < 3 || limit == nil || limit[2] != "10" {
		t.Fatalf("the chart of sends has no y axis or no limit line at 10: %s", fig2)
	}
	y0, _ := strconv.ParseFloat(ticks[0][2], 64)
	top, _ := strconv.ParseFloat(ticks[len(ticks)-1][1], 64)
	yTop, _ := strconv.ParseFloat(ticks[len(ticks)-1][2], 64)
	pts := strings.Fields(limit[1])
	ly, _ := strconv.ParseFloat(strings.Split(pts[len(pts)-1], ",")[1], 64)
	if want := y0 + (yTop-y0)*10/top; ly < want-1 || ly > want+1 {
		t.Errorf("the limit line is at y %.1f, want %.1f (10 on an axis from 0 at %.1f to %v at %.1f)", ly, want, y0, top, yTop)
	}
	pb := regexp.MustCompile(`(?s)<figure data-rule="per-business">.*?</figure>`).FindString(dom2)
	if !strings.Contains(pb, "b1: admitted/s") || !regexp.MustCompile(`class="waiting" data-last="[1-9]`).MatchString(dom2) {
		t.Errorf("per-business has no line of b1, or no tasks waiting show:\n%s", pb)
	}
	if n := differing(img1, img2); n < 50 {
		t.Errorf("the two screenshots differ in %d pixels: the charts did not move", n)
	}

	// Every task ran; the workers stop and add their last counts, which
	// the history shows once their step is over.
	eventually(t, "150 calls", func() bool { return len(a.byPath("/ok")) >= tasks })
	stop()
	pol, err := policy.LoadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	stopped, err := redistest.Client(t).Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var h history.History
	for {
		if h, err = history.NewReader(redistest.Client(t), prefix).Read(context.Background(), pol); err != nil {
			t.Fatal(err)
		}
		if !h.Start.Add(time.Duration(h.Steps) * history.Step).Before(stopped) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	sum := func(v []float64) (n float64, peak float64) {
		for _, x := range v {
			n += x * h.Step
			peak = max(peak, x)
		}
		return n, peak
	}
	all, peak := sum(h.Rules[0].Series[0].Admitted)
	keyed, _ := sum(h.Rules[1].Series[0].Admitted)
	b1, b1peak := sum(h.Rules[1].Series[1].Admitted)
	t.Logf("history: %v admitted under sends (peak %v/s), %v under per-business, %v of b1 (peak %v/s)", all, peak, keyed, b1, b1peak)
	if all != tasks || keyed != tasks || h.Rules[1].Series[1].Key != "b1" || b1 != 100 {
		t.Errorf("the history counts %v tasks under sends, %v under per-business, %v of %s; want 150, 150, 100 of b1", all, keyed, b1, h.Rules[1].Series[1].Key)
	}
	// A step of 5 s admits at most 10/s plus the burst, 52 tasks (one more:
	// a task counts in the step its worker saw it admitted).
	if per := history.Step.Seconds(); peak > (10*per+2+1)/per || b1peak > (8*per+1+1)/per {
		t.Errorf("a step admitted above the limits: %v/s under sends, %v/s of b1", peak, b1peak)
	}
}

// differing counts the pixels where a and b differ.
func differing(a, b image.Image) int {
	n := 0
	r := a.Bounds().Intersect(b.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if a.At(x, y) != b.At(x, y) {
				n++
			}
		}
	}
	return n
}

// findChrome returns the path of Chromium, skipping the test (saying what
// goes unchecked) where it is not installed.
func findChrome(t *testing.T, what string) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("Chromium is not installed (Debian: apt-get install chromium; make test installs it as root): " + what + " not checked in a browser")
	return ""
}
