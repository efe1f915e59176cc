//go:build !linux

package main

import "syscall"

// spinnerAttr puts a competing process in its own group.
func spinnerAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
