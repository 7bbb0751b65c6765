//go:build linux

package redistest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts redis-server in its own process group (so a terminal ^C
// reaches only the test process) and makes the kernel SIGKILL it when the
// process that started it dies, even by SIGKILL or a test timeout panic.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func killGroup(cmd *exec.Cmd) {
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		_ = cmd.Process.Kill()
	}
}
