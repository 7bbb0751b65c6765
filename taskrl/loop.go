package taskrl

import (
	"sync"
	"time"
)

// loop runs a background pass of the middleware's (the pacer's, the
// sweeper's) in one goroutine, started on first use: at once, whenever
// woken, and when the wait the last pass returned has passed (0 or less:
// only when woken). Safe for concurrent use.
type loop struct {
	pass func() time.Duration
	wake chan struct{}
	stop chan struct{}
	once sync.Once
	done sync.WaitGroup
}

func newLoop(pass func() time.Duration) *loop {
	return &loop{pass: pass, wake: make(chan struct{}, 1), stop: make(chan struct{})}
}

// start starts the loop unless it runs.
func (l *loop) start() {
	l.once.Do(func() {
		l.done.Add(1)
		go l.run()
	})
}

// poke starts the loop unless it runs and wakes it.
func (l *loop) poke() {
	l.start()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *loop) run() {
	defer l.done.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-timer.C:
		}
		if wait := l.pass(); wait > 0 {
			timer.Reset(wait)
		}
	}
}

// close stops the loop and waits for it.
func (l *loop) close() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.done.Wait()
}
