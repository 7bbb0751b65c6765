package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// TestSweepWorkersKilled: the backlog of TestNoHeadOfLineBlocking (5,000
// calls of one business under 1.8/s) on 6 worker processes, two of them
// killed with SIGKILL as soon as the backlog is in the queue, while the
// fleet sets it aside (a sweeper killed holding a queue's lock holds it
// 2 s at most; each move is one script, so none is half done). The other
// businesses' 30 calls, one every 100 ms, still start within 1 s of their
// enqueue at p99; nothing is lost: every one of the 5,000 was called or
// waits in asynq (a task a killed worker was running stays active until
// asynq's lease, 30 s, gives it back), none twice, no 429.
func TestSweepWorkersKilled(t *testing.T) {
	const noisy, quiet, killed = 5000, 30, 2
	// A redis-server of its own: the killed workers' tasks stay active
	// for asynq's lease, and a shared server's queue could not be deleted.
	r := startOn(t, fakeapi.Limits{Global: apiGlobal, PerBusiness: apiBusiness}, noisyPolicy, 6, own, "--task-check-interval", "100ms")
	r.enqueue("--url", r.url+"/v1/charge", "--count", fmt.Sprint(noisy), "--businesses", "1")
	for _, w := range r.workers[:killed] {
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-w.done
	}
	r.workers = r.workers[killed:]
	lat := r.behind(quiet)
	// A task a killed worker held may have been called and still be
	// active; b1 runs at 1.8/s.
	made, info := r.accounted(noisy, killed*10+2)
	waiting := info.Pending + info.Scheduled + info.Active + info.Retry
	p99 := lat[len(lat)*99/100-1]
	t.Logf("2 of 6 workers killed; the others' calls started after p50 %v p99 %v; the first business: %d made, %d waiting (pending %d, scheduled %d, active %d, retry %d)",
		lat[len(lat)/2], p99, made, waiting, info.Pending, info.Scheduled, info.Active, info.Retry)
	if p99 > time.Second {
		t.Errorf("p99 start latency %v, over 1 s", p99)
	}
	if info.Archived != 0 {
		t.Errorf("%d archived", info.Archived)
	}
	r.stop()
}
