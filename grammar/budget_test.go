package grammar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
)

func hostileEnum(n int, pad string) []byte {
	var sb strings.Builder
	sb.WriteString(`{"enum":[`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"%s%07d"`, pad, i)
	}
	sb.WriteString(`]}`)
	return []byte(sb.String())
}

func hostileObject(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"property_%06d":{"type":"string","maxLength":%d}`, i, 1+i%50)
	}
	sb.WriteString(`}}`)
	return []byte(sb.String())
}

func stringSizes(n int) []byte {
	var alts []string
	for i := range n {
		alts = append(alts, fmt.Sprintf(`{"type":"string","maxLength":%d}`, 999-i))
	}
	return []byte(`{"type":"array","items":{"anyOf":[` + strings.Join(alts, ",") + `]}}`)
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// TestHostileSchemasRefusedCheaply: schemas of up to 1 MiB whose grammar
// would be huge are refused before it is built. Before the budget the
// 85,000-value enum allocated about 960 MB (and took 1.7 s) to be refused.
// Allocation, not time, is asserted (timings are not tested).
func TestHostileSchemasRefusedCheaply(t *testing.T) {
	cases := map[string][]byte{
		"enum 85000":         hostileEnum(85000, "i"),
		"enum 40000 long":    hostileEnum(40000, "long-prefix-"),
		"object 20000 props": hostileObject(20000),
		"string sizes":       stringSizes(40),
	}
	for name, s := range cases {
		if len(s) > maxSchemaSize {
			t.Fatalf("%s: %d bytes, more than the schema size limit", name, len(s))
		}
		var err error
		var d time.Duration
		a := allocated(func() {
			t0 := time.Now()
			_, err = CompileSchema(s)
			d = time.Since(t0)
		})
		if err == nil {
			t.Errorf("%s: compiled, want refused", name)
			continue
		}
		t.Logf("%s (%d bytes): %v after %v, %d MB allocated", name, len(s), err, d, a>>20)
		if a > 64<<20 {
			t.Errorf("%s: refusing it allocated %d MB, want < 64", name, a>>20)
		}
	}
	// Ten in a row leave the live heap where it was.
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s := cases["enum 85000"]
	for range 10 {
		if _, err := CompileSchema(s); err == nil {
			t.Fatal("compiled")
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	if grow := int64(m1.HeapAlloc) - int64(m0.HeapAlloc); grow > 8<<20 {
		t.Errorf("live heap grew %d MB over ten refusals", grow>>20)
	}
}

func TestLimits(t *testing.T) {
	s := []byte(`{"type":"object","properties":{"a":{"type":"string","maxLength":200},"b":{"enum":["x","y","z"]}}}`)
	if _, err := Compile(context.Background(), s, "", "", Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lim  Limits
		want string
	}{
		{Limits{MaxStates: 100}, "more than 100 automaton states"},
		{Limits{MaxBytes: 10 << 10}, "needs more than 0 MiB"},
		{Limits{MaxTime: time.Nanosecond}, "took longer than 1ns"},
	} {
		_, err := Compile(context.Background(), s, "", "", c.lim)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.lim, err, c.want)
		}
	}
	// A client that left: compilation stops at its next check.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Compile(ctx, hostileObject(2000), "", "", Limits{})
	if err == nil || !strings.Contains(err.Error(), "stopped") || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Errorf("cancelled: err %v", err)
	}
	var se *SchemaError
	if !errors.As(err, &se) {
		t.Errorf("cancelled: %T is not a *SchemaError", err)
	}
	// A large schema within the limits still compiles.
	if _, err := CompileSchema(hostileEnum(5000, "v")); err != nil {
		t.Errorf("enum of 5000: %v", err)
	}
	if _, err := CompileSchema(hostileObject(500)); err != nil {
		t.Errorf("object of 500 properties: %v", err)
	}
}

// TestDecodeOrderedScanner: the fast scanner decodes as encoding/json's
// Decoder does.
func TestDecodeOrderedScanner(t *testing.T) {
	for _, doc := range []string{
		`{"a":1,"b":[true,false,null,-1.5e3,"x\"y\\z\u00e9\n"],"c":{"\u0041":{}},"a":2}`,
		` [ ] `, `"\ud83d\ude00"`, `{"enum":["a","b"],"z":{"y":[[[]]]}}`, `0`, `-0.0E+1`,
	} {
		d := json.NewDecoder(bytes.NewReader([]byte(doc)))
		d.UseNumber()
		want, err := decodeValue(d, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeOrdered([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: scanner %#v, decoder %#v", doc, got, want)
		}
	}
	if _, err := decodeOrdered([]byte(`{"a":}`)); err == nil {
		t.Error("invalid JSON decoded")
	}
}
