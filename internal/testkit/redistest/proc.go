package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	readyTimeout  = 10 * time.Second
	pollInterval  = 10 * time.Millisecond
	maxPortTries  = 10
	portRangeLow  = 20000
	portRangeHigh = 50000
	clusterBusInc = 10000
)

// errPortInUse marks a redis-server start that failed because its port (or
// cluster bus port) was taken by someone else in the meantime.
var errPortInUse = errors.New("port already in use")

// proc is one redis-server child process.
type proc struct {
	cmd     *exec.Cmd
	pid     int
	port    int
	dir     string
	logPath string
	logOff  int64 // size of the log file before this process started
	runID   string

	stderr lockedBuffer
	done   chan struct{} // closed once the process has exited and been reaped

	stopOnce sync.Once
}

func (p *proc) addr() string { return addrFor(p.port) }

func addrFor(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// baseArgs are the redis-server arguments every server gets; caller
// arguments are appended after them and therefore win.
func baseArgs(port int, dir, logPath string) []string {
	return []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--protected-mode", "no",
		"--daemonize", "no",
		"--loglevel", "warning",
		"--logfile", logPath,
	}
}

// launch starts redis-server on port with its working directory dir and
// waits until it answers. extra may start with a configuration file's path
// (a name ending in .conf), which is then passed first. On failure the process is gone when launch returns.
func launch(port int, dir string, extra []string) (*proc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrRedisNotFound
	}
	logPath := filepath.Join(dir, "redis.log")
	var off int64
	if fi, err := os.Stat(logPath); err == nil {
		off = fi.Size()
	}
	args := append(baseArgs(port, dir, logPath), extra...)
	if len(extra) > 0 && strings.HasSuffix(extra[0], ".conf") {
		// A configuration file must come first (a sentinel's does).
		args = append(append([]string{extra[0]}, baseArgs(port, dir, logPath)...), extra[1:]...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = sysProcAttr()
	p := &proc{cmd: cmd, port: port, dir: dir, logPath: logPath, logOff: off, done: make(chan struct{})}
	cmd.Stdout = &p.stderr
	cmd.Stderr = &p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	p.pid = cmd.Process.Pid
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := p.waitReady(); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

// waitReady polls the server until the process listening on p.port is our
// process (INFO server process_id == our pid) and it answers PING with PONG.
// Checking the pid matters: when two test packages race for a port, the other
// package's redis may answer on "our" port while ours is failing to bind.
func (p *proc) waitReady() error {
	deadline := time.Now().Add(readyTimeout)
	want := strconv.Itoa(p.pid)
	for {
		select {
		case <-p.done:
			out := p.logTail() + p.stderr.String()
			err := fmt.Errorf("redistest: redis-server on port %d exited during startup (%s); log:\n%s", p.port, p.cmd.ProcessState, out)
			if strings.Contains(out, "Address already in use") || strings.Contains(out, "Failed listening on port") {
				return fmt.Errorf("%w: %w", errPortInUse, err)
			}
			return err
		default:
		}
		if info, err := rawDo(p.addr(), 250*time.Millisecond, "INFO", "server"); err == nil && infoField(info, "process_id") == want {
			if pong, err := rawDo(p.addr(), 250*time.Millisecond, "PING"); err == nil && pong == "PONG" {
				p.runID = infoField(info, "run_id")
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on port %d not ready after %v; log:\n%s%s", p.port, readyTimeout, p.logTail(), p.stderr.String())
		}
		time.Sleep(pollInterval)
	}
}

// kill hard-stops the process (and its process group, which covers redis'
// own fork children) and waits until it has been reaped.
func (p *proc) kill() {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		killGroup(p.cmd)
		<-p.done
	})
}

// shutdown asks the server to exit with SHUTDOWN NOSAVE, falls back to
// killing it, and waits until it has exited.
func (p *proc) shutdown() {
	_, _ = rawDo(p.addr(), time.Second, "SHUTDOWN", "NOSAVE")
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
	p.kill()
}

// logTail returns the last part of what this process wrote to its log.
func (p *proc) logTail() string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 4096
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	start := p.logOff
	if fi.Size()-start > max {
		start = fi.Size() - max
	}
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// startOnFreePort launches redis-server on a random free loopback port,
// retrying with another port when the chosen one turns out to be taken.
// needBus also requires port+10000 (the cluster bus port) to be free.
// A leftover nodes.conf from a failed attempt is removed before each try.
func startOnFreePort(dir string, extra []string, needBus bool) (*proc, error) {
	var lastErr error
	for range maxPortTries {
		port, err := pickPort(needBus)
		if err != nil {
			lastErr = err
			continue
		}
		if needBus {
			_ = os.Remove(filepath.Join(dir, "nodes.conf"))
		}
		p, err := launch(port, dir, extra)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if !errors.Is(err, errPortInUse) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("redistest: no usable port after %d tries: %w", maxPortTries, lastErr)
}

// pickPort returns a random port in [20000, 50000) that (and, with needBus,
// whose +10000 companion) could be bound on 127.0.0.1 just now.
func pickPort(needBus bool) (int, error) {
	var lastErr error
	for range 50 {
		port := portRangeLow + rand.IntN(portRangeHigh-portRangeLow)
		if lastErr = portFree(port); lastErr != nil {
			continue
		}
		if needBus {
			if lastErr = portFree(port + clusterBusInc); lastErr != nil {
				continue
			}
		}
		return port, nil
	}
	return 0, fmt.Errorf("redistest: no free port found: %w", lastErr)
}

func portFree(port int) error {
	l, err := net.Listen("tcp", addrFor(port))
	if err != nil {
		return err
	}
	return l.Close()
}

// rawDo sends one command over a fresh connection using RESP2 and returns a
// simple/bulk/integer reply as a string. It is used for readiness probes,
// run_id checks and SHUTDOWN, where a full client would be overkill.
func rawDo(addr string, timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&buf, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(buf.Bytes()); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("redis error: %s", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redistest: bad bulk header %q", line)
		}
		if n < 0 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	default:
		return "", fmt.Errorf("redistest: unexpected reply %q", line)
	}
}

// infoField extracts "name:value" from an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimRight(line, "\r")
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// lockedBuffer is a bytes.Buffer safe for concurrent Write and String.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 64<<10 {
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
