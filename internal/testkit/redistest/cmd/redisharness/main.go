// Command redisharness runs a command (normally "go test ...") with one set
// of real Redis servers shared by all test packages of the run:
//
//	go run ./internal/testkit/redistest/cmd/redisharness -- go test -race ./...
//
// It starts a standalone redis-server and a 3-master Redis Cluster with
// redistest.StartShared, passes them to the command through the
// TASKRL_REDISTEST environment variable (each test binary checks the
// servers' run_ids before using them), forwards SIGINT and SIGTERM to the
// command, stops the servers when the command ends, whatever the outcome,
// and exits with the command's exit status.
//
// If redis-server is not on PATH it prints how to install it and exits 1
// when CI=true; otherwise it runs the command without servers, and the tests
// that need Redis skip.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/taskrl/taskrl/internal/testkit/redistest"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: redisharness -- command [args...]   (e.g. redisharness -- go test -race ./...)")
		return 2
	}

	env := withoutVar(os.Environ(), redistest.EnvVar)
	value, stop, err := redistest.StartShared()
	switch {
	case errors.Is(err, redistest.ErrRedisNotFound):
		fmt.Fprintln(os.Stderr, err)
		if os.Getenv("CI") == "true" {
			return 1
		}
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 1
	default:
		defer stop() // also if something below panics
		env = append(env, redistest.EnvVar+"="+value)
	}

	code := runChild(args, env)
	if stop != nil {
		stop()
	}
	return code
}

// runChild runs the command with stdio passed through, forwarding SIGINT and
// SIGTERM, and returns its exit status (128+signal if it was killed).
func runChild(args, env []string) int {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "redisharness: %v\n", err)
		return 127
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if c := ee.ExitCode(); c > 0 {
			return c
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "redisharness: %v\n", err)
	return 1
}

func withoutVar(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
