//go:build unix && !linux

package redistest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group. Outside Linux there
// is no parent-death signal, so servers are only stopped by the normal
// cleanup paths.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func killGroup(cmd *exec.Cmd) {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = cmd.Process.Kill()
	}
}
