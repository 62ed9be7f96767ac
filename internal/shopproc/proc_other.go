//go:build !linux

package shopproc

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
