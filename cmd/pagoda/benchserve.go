package main

import "fmt"

func runBenchServe(args []string) error { return fmt.Errorf("bench serve: not wired yet") }
