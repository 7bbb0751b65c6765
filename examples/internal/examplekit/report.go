package examplekit

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/taskrl/taskrl/internal/testkit/fakeapi"
)

// Problems are what a run found wrong, one sentence each; none means the
// run passed.
type Problems []string

// Addf adds a problem.
func (p *Problems) Addf(format string, args ...any) {
	*p = append(*p, fmt.Sprintf(format, args...))
}

// CheckQueue adds a problem when the queue cannot be inspected or asynq
// archived or failed any of its tasks, and returns the queue's info (zero
// when it cannot be inspected or does not exist: no task reached it).
func (p *Problems) CheckQueue(ins *asynq.Inspector, queue string) *asynq.QueueInfo {
	if qs, err := ins.Queues(); err == nil && !slices.Contains(qs, queue) {
		return &asynq.QueueInfo{} // no task ever reached it
	}
	info, err := ins.GetQueueInfo(queue)
	if err != nil {
		p.Addf("cannot inspect queue %s: %v", queue, err)
		return &asynq.QueueInfo{}
	}
	if info.Archived > 0 || info.Failed > 0 {
		p.Addf("asynq archived %d and failed %d tasks", info.Archived, info.Failed)
	}
	return info
}

// Verdict prints the run's last line and returns its error: "FAILED: " and
// the problems joined by "; ", and an error saying the same; or, when there
// are none, "OK: " and ok, and nil.
func (p Problems) Verdict(out io.Writer, ok string) error {
	if len(p) > 0 {
		fmt.Fprintln(out, "FAILED:", strings.Join(p, "; "))
		return errors.New(strings.Join(p, "; "))
	}
	fmt.Fprintln(out, "OK:", ok)
	return nil
}

// Answered counts, of the idempotency keys ids, those the API never
// answered 200 and those it answered 200 more than once: a task that never
// ran, and a task that ran twice.
func Answered(api *fakeapi.API, ids []string) (never, repeated int) {
	okPerKey := map[string]int{}
	for _, c := range api.Calls() {
		if c.Status == http.StatusOK {
			okPerKey[c.Key]++
		}
	}
	for _, id := range ids {
		switch n := okPerKey[id]; {
		case n == 0:
			never++
		case n > 1:
			repeated++
		}
	}
	return never, repeated
}

// Indent indents every line of s (a policy file, say) by two spaces, for
// printing; trailing newlines are dropped.
func Indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}
