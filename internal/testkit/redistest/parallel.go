package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
)

// Parallel runs f(t, i) for i in [0, n) in n goroutines and waits for all.
// A Fatal inside f fails t and ends only its own goroutine.
func Parallel(t testing.TB, n int, f func(t testing.TB, i int)) {
	t.Helper()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			f(goroutineTB{t}, i)
		}(i)
	}
	wg.Wait()
}

// goroutineTB reports a Fatal with Errorf, which is safe off the test's
// goroutine, and then ends the calling goroutine.
type goroutineTB struct{ testing.TB }

func (g goroutineTB) Fatalf(format string, args ...any) {
	g.TB.Errorf(format, args...)
	runtime.Goexit()
}
func (g goroutineTB) Fatal(args ...any) { g.Fatalf("%s", fmt.Sprint(args...)) }
func (g goroutineTB) FailNow() {
	g.TB.Fail()
	runtime.Goexit()
}

// Child returns a command running the test function named test of this test
// binary in a new process, with env added to the environment. The child's
// TestMain reaches the same servers (Main exported them). The race
// detector's one-second pause at exit is turned off.
func Child(test string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	return cmd
}
