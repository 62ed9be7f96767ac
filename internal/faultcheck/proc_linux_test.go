package faultcheck_test

import "syscall"

// instanceProcAttr makes an instance die with the test binary, even when
// the binary itself is killed before it can stop it.
func instanceProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
