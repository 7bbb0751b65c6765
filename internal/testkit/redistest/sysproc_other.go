//go:build !unix

package redistest

import (
	"os/exec"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
