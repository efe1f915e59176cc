// Command pagoda is the Pagoda inference engine's command line.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
)

type command struct {
	run   func(args []string) error
	brief string
}

var commands = map[string]command{}

func register(name, brief string, run func([]string) error) {
	commands[name] = command{run, brief}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: pagoda <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].brief)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'pagoda <command> -h' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	if os.Args[1] == "--version" || os.Args[1] == "-version" || os.Args[1] == "-v" {
		os.Args[1] = "version"
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "pagoda: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	err := c.run(os.Args[2:])
	if errors.Is(err, flag.ErrHelp) {
		// The flag set has printed the usage; asking for it is no failure.
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pagoda %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
