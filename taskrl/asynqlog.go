package taskrl

import (
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

// parkedSet remembers the tasks this process parked in the last minute:
// asynq's write after the handler that parked one (Done, MarkAsComplete)
// finds it no longer active, as it must, and asynq logs that as a warning
// ("Could not remove task id=... NOT FOUND; Will retry syncing") and once
// more as an error when it shuts down. The logger ServerConfig installs
// drops those lines for these tasks, and only for them.
type parkedSet struct {
	mu  sync.Mutex
	ids map[string]time.Time // when parked
}

// parkedKeep is how long a parked task's asynq warnings are dropped.
const parkedKeep = time.Minute

func (s *parkedSet) add(id string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[string]time.Time{}
	}
	if len(s.ids) >= 1024 {
		for k, t := range s.ids {
			if now.Sub(t) > parkedKeep {
				delete(s.ids, k)
			}
		}
	}
	s.ids[id] = now
}

// expected reports whether msg is asynq's complaint about a task this
// process parked a moment ago.
func (s *parkedSet) expected(msg string) bool {
	if !strings.HasPrefix(msg, "Could not ") || !strings.Contains(msg, "NOT FOUND") {
		return false
	}
	_, rest, ok := strings.Cut(msg, " task id=")
	if !ok {
		return false
	}
	id, _, _ := strings.Cut(rest, " ")
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.ids[id]
	return ok && time.Since(t) <= parkedKeep
}

// asynqLogger passes asynq's log lines on to next, less those about tasks
// the middleware parked (parkedSet).
type asynqLogger struct {
	next   asynq.Logger
	parked *parkedSet
}

func (l asynqLogger) keep(args []any) bool {
	return len(args) != 1 || !l.parked.expected(fmt.Sprint(args[0]))
}

func (l asynqLogger) Debug(args ...any) { l.next.Debug(args...) }
func (l asynqLogger) Info(args ...any)  { l.next.Info(args...) }
func (l asynqLogger) Fatal(args ...any) { l.next.Fatal(args...) }
func (l asynqLogger) Warn(args ...any) {
	if l.keep(args) {
		l.next.Warn(args...)
	}
}
func (l asynqLogger) Error(args ...any) {
	if l.keep(args) {
		l.next.Error(args...)
	}
}

// stderrLogger writes as asynq's default logger does, for a Config without
// a Logger of its own.
type stderrLogger struct{ l *log.Logger }

func newStderrLogger() stderrLogger {
	return stderrLogger{log.New(os.Stderr, fmt.Sprintf("asynq: pid=%d ", os.Getpid()), log.Ldate|log.Ltime|log.Lmicroseconds|log.LUTC)}
}

func (s stderrLogger) Debug(args ...any) { s.l.Print(append([]any{"DEBUG: "}, args...)...) }
func (s stderrLogger) Info(args ...any)  { s.l.Print(append([]any{"INFO: "}, args...)...) }
func (s stderrLogger) Warn(args ...any)  { s.l.Print(append([]any{"WARN: "}, args...)...) }
func (s stderrLogger) Error(args ...any) { s.l.Print(append([]any{"ERROR: "}, args...)...) }
func (s stderrLogger) Fatal(args ...any) {
	s.l.Print(append([]any{"FATAL: "}, args...)...)
	os.Exit(1)
}
