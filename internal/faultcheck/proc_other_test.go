//go:build !linux

package idempotency_test

import "syscall"

// instanceProcAttr: only Linux can tie a child's life to its parent's; the
// test's cleanup stops the instances elsewhere.
func instanceProcAttr() *syscall.SysProcAttr { return nil }
