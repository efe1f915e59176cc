package main

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"time"
)

// limit is the allowed range of one numeric flag, inclusive. Durations
// are in seconds. hi = +Inf means no upper bound.
type limit struct {
	name   string
	lo, hi float64
}

// annotateLimits appends each flag's range to its help text, so -h shows
// what checkLimits enforces. Call it before parsing.
func annotateLimits(fs *flag.FlagSet, limits []limit) {
	for _, l := range limits {
		if f := fs.Lookup(l.name); f != nil {
			f.Usage += " (" + l.describe(f) + ")"
		}
	}
}

// checkLimits refuses any flag outside its range, naming the flag and the
// range: a negative thread count or a zero block size is a typo to report,
// not a value to silently replace or crash on later.
func checkLimits(fs *flag.FlagSet, limits []limit) error {
	for _, l := range limits {
		f := fs.Lookup(l.name)
		if f == nil {
			return fmt.Errorf("internal error: no flag -%s to check", l.name)
		}
		var v float64
		switch x := f.Value.(flag.Getter).Get().(type) {
		case int:
			v = float64(x)
		case int64:
			v = float64(x)
		case float64:
			v = x
		case time.Duration:
			v = x.Seconds()
		default:
			return fmt.Errorf("internal error: flag -%s is not numeric", l.name)
		}
		// Written so that NaN fails too.
		if !(v >= l.lo && v <= l.hi) {
			return fmt.Errorf("-%s %s is out of range: must be %s", l.name, f.Value, l.describe(f))
		}
	}
	return nil
}

// describe is the range, e.g. "0 to 65535" or "≥ 1", in the flag's units.
func (l limit) describe(f *flag.Flag) string {
	num := func(x float64) string {
		if _, ok := f.Value.(flag.Getter).Get().(time.Duration); ok {
			return time.Duration(x * float64(time.Second)).String()
		}
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	if math.IsInf(l.hi, 1) {
		return "≥ " + num(l.lo)
	}
	return num(l.lo) + " to " + num(l.hi)
}

// Common bounds.
const (
	maxThreads = 4096
	maxCtx     = 1 << 24 // tokens; well past any published model's context
)

var inf = math.Inf(1)

// parseFlags parses args into fs and range-checks the limited flags.
func parseFlags(fs *flag.FlagSet, args []string, limits []limit) error {
	annotateLimits(fs, limits)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return checkLimits(fs, limits)
}
