package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseLogitBias reads "ID:BIAS" or "LO-HI:BIAS" items separated by
// commas, e.g. "0-258:-100" (ban the control and byte tokens of a Llama
// vocabulary, as the reference runs do).
func ParseLogitBias(s string) (map[int]float64, error) {
	out := map[int]float64{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		ids, bias, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("bench: logit bias %q: want ID:BIAS or LO-HI:BIAS", item)
		}
		b, err := strconv.ParseFloat(bias, 64)
		if err != nil || b < -100 || b > 100 {
			return nil, fmt.Errorf("bench: logit bias %q: bias must be a number in [-100, 100]", item)
		}
		loS, hiS, isRange := strings.Cut(ids, "-")
		lo, err := strconv.Atoi(loS)
		if err != nil || lo < 0 {
			return nil, fmt.Errorf("bench: logit bias %q: bad token id %q", item, loS)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(hiS); err != nil || hi < lo {
				return nil, fmt.Errorf("bench: logit bias %q: bad range end %q", item, hiS)
			}
			if hi-lo > 1<<20 {
				return nil, fmt.Errorf("bench: logit bias %q: range too large", item)
			}
		}
		for id := lo; id <= hi; id++ {
			out[id] = b
		}
	}
	return out, nil
}

// ParseRate reads a request rate: a positive number of requests/s, or
// "inf" for all at once (returned as 0, which Config reads as infinite).
func ParseRate(s string) (float64, error) {
	if strings.EqualFold(strings.TrimSpace(s), "inf") {
		return 0, nil
	}
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || r <= 0 {
		return 0, fmt.Errorf("bench: request rate %q: want a positive number or inf", s)
	}
	return r, nil
}
