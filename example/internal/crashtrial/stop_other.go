//go:build unix && !linux

package main

import (
	"os"
	"syscall"
)

// stopSelf stops the whole process with SIGSTOP. Without tgkill the
// caller may run on for a moment before the stop takes it: the trials
// that pause a server run on Linux only.
func stopSelf() {
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
}
