package gguf

import (
	"fmt"
	"strconv"
	"strings"
)

// Limits of Value.String, which serves listings (pagoda inspect), not
// serialisation.
const (
	maxShownElems = 8
	maxShownRunes = 120
)

// String formats the value for humans: scalars as Go literals (strings
// quoted, long ones cut), arrays as "[n]type{first elements, …}".
func (v Value) String() string {
	if v.Type != Array {
		return formatScalar(v.V)
	}
	n, _ := arrayLen(v.V)
	var b strings.Builder
	fmt.Fprintf(&b, "[%d]%s{", n, v.Elem)
	shown := min(n, maxShownElems)
	for i := 0; i < shown; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		switch a := v.V.(type) {
		case []string:
			b.WriteString(formatScalar(a[i]))
		case []Value:
			b.WriteString(a[i].String())
		case []uint8:
			b.WriteString(strconv.FormatUint(uint64(a[i]), 10))
		default:
			b.WriteString(formatScalar(elemAt(v.V, i)))
		}
	}
	if n > shown {
		b.WriteString(", …")
	}
	b.WriteString("}")
	return b.String()
}

func formatScalar(x any) string {
	switch x := x.(type) {
	case string:
		r := []rune(x)
		if len(r) > maxShownRunes {
			return strconv.Quote(string(r[:maxShownRunes])) + "…"
		}
		return strconv.Quote(x)
	case float32:
		return strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case nil:
		return "<nil>"
	}
	return fmt.Sprint(x)
}
