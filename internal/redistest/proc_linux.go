package redistest

import "syscall"

// childAttr makes a server die with the test binary, even when the binary
// itself is killed before it can clean up.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
