package shopproc

import "syscall"

// childAttr makes a shop die with the test binary, even when the binary is
// killed (a -timeout panic) before its cleanups run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
