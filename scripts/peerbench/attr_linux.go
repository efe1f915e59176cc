package main

import "syscall"

// spinnerAttr puts a competing process in its own group and kills it
// when peerbench dies, so an interrupted run leaves no busy loop behind
// to skew the next one.
func spinnerAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
