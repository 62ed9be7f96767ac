package main

import (
	"os"
	"syscall"
)

// stopSelf stops the whole process with SIGSTOP. The signal is aimed at
// the calling thread, which stops on its way back from the system call:
// one sent to the process may be taken by another thread while the caller
// runs on, into the very step it was meant to stop before.
func stopSelf() {
	syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
