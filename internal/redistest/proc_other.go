//go:build !linux

package redistest

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
