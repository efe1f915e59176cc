package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// headsTrainers are the kinds `pagoda heads train --kind K` builds, each
// registered by the file that implements it.
var headsTrainers = map[string]func(args []string) error{}

func init() {
	register("heads", "train speculation heads for a target: Medusa heads or an EAGLE draft layer (heads train --kind medusa|eagle -m TARGET)", cmdHeads)
}

// cmdHeads runs `pagoda heads SUBCOMMAND`: speculation heads trained for
// a target (Medusa heads, an EAGLE draft layer).
func cmdHeads(args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fs := flag.NewFlagSet("heads", flag.ContinueOnError)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "Usage of heads:\n  pagoda heads train --kind %s -m TARGET -o OUT.gguf [flags]\n  (pagoda heads train --kind KIND -h lists a kind's flags)\n", strings.Join(headKinds(), "|"))
		}
		return fs.Parse(args)
	}
	if len(args) == 0 || args[0] != "train" {
		return fmt.Errorf("usage: pagoda heads train --kind %s -m TARGET [flags]", strings.Join(headKinds(), "|"))
	}
	args = args[1:]
	kind := ""
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--kind" || a == "-kind":
			if i+1 >= len(args) {
				return fmt.Errorf("--kind needs a value (%s)", strings.Join(headKinds(), ", "))
			}
			kind = args[i+1]
			i++
		case strings.HasPrefix(a, "--kind="), strings.HasPrefix(a, "-kind="):
			kind = a[strings.Index(a, "=")+1:]
		default:
			rest = append(rest, a)
		}
	}
	train, ok := headsTrainers[kind]
	if !ok {
		return fmt.Errorf("heads train: --kind %q: want one of %s", kind, strings.Join(headKinds(), ", "))
	}
	return train(rest)
}

func headKinds() []string {
	var ks []string
	for k := range headsTrainers {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
