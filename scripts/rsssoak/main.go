// Command rsssoak starts `pagoda serve`, drives it with a mixed load
// (sampled completions, streamed chat, JSON-object and JSON-schema
// replies, per-request KV policies, clients that leave mid-stream) and
// prints the server's RSS (VmRSS) every period as a markdown table, with
// the requests and errors so far. Linux only (it reads /proc/PID/status).
//
//	go run ./scripts/rsssoak -pagoda /tmp/pagoda -m ../shared/models/gguf/stories260K.gguf -dur 5m
//
// Arguments after the flags go to `pagoda serve` as they are.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"pagoda/scripts/internal/proc"
)

func main() {
	bin := flag.String("pagoda", "", "pagoda binary (default: build ./cmd/pagoda)")
	modelPath := flag.String("m", "../shared/models/gguf/stories260K.gguf", "model")
	dur := flag.Duration("dur", 5*time.Minute, "load time")
	every := flag.Duration("every", 15*time.Second, "RSS sampling period")
	conc := flag.Int("c", 4, "concurrent clients")
	gctrace := flag.Bool("gctrace", false, "run the server with GODEBUG=gctrace=1 (its collections and heap goals on stderr)")
	flag.IntVar(&enumN, "enum", 0, "also send JSON schemas of an enum of this many fresh random strings (each compiled anew: garbage for the collector)")
	flag.Parse()
	if *bin == "" {
		b, cleanup, err := proc.BuildPagoda(os.Stderr)
		if err != nil {
			log.Fatal(err)
		}
		defer cleanup()
		*bin = b
	}
	port, err := proc.FreePort()
	if err != nil {
		log.Fatal(err)
	}
	args := append([]string{"serve", "-m", *modelPath, "--host", "127.0.0.1", "--port", strconv.Itoa(port)}, flag.Args()...)
	cmd := exec.Command(*bin, args...)
	cmd.Stderr = os.Stderr
	if *gctrace {
		cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	}
	srv, err := proc.Start(cmd)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := srv.WaitHealthy(base, time.Minute); err != nil {
		log.Fatal(err)
	}
	var reqs, errs atomic.Int64
	var firstErr sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for w := range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for time.Since(start) < *dur {
				err := request(base, rng)
				reqs.Add(1)
				if err != nil {
					errs.Add(1)
					firstErr.Do(func() { log.Printf("first error: %v", err) })
				}
			}
		}()
	}
	fmt.Printf("| t | RSS MiB | requests | errors |\n|---|---|---|---|\n")
	sample := func() {
		fmt.Printf("| %v | %.1f | %d | %d |\n", time.Since(start).Round(time.Second), float64(rss(srv.Pid()))/(1<<20), reqs.Load(), errs.Load())
	}
	sample()
	for t := time.NewTicker(*every); time.Since(start) < *dur; {
		<-t.C
		sample()
	}
	wg.Wait()
	sample()
}

func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return -1
}

var prompts = []string{
	"Once upon a time, there was a little girl named Lily. She loved to play outside",
	"Tim and Sue went to the store",
	"One day, a big bear",
	"The cat sat on the mat and looked at the bird",
	"Once upon a time, there was a little boy named Ben. He had a red ball",
}

var policies = []string{`"streaming:sinks=4,window=64"`, `"quest:budget=64"`, `"snapkv:capacity=48,window=8"`, `"h2o:heavy=0.2,recent=0.2"`}

const schema = `{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":20}},"required":["name","age"]}`

// enumN is the -enum flag.
var enumN int

// enumSchema is an enum of enumN random words, new each time, so no
// compiled-schema cache can answer it.
func enumSchema(rng *rand.Rand) string {
	words := make([]string, enumN)
	for i := range words {
		w := make([]byte, 4+rng.IntN(8))
		for j := range w {
			w[j] = byte('a' + rng.IntN(26))
		}
		words[i] = string(w)
	}
	b, _ := json.Marshal(map[string]any{"enum": words})
	return string(b)
}

// request sends one request of a random kind; a non-200 answer or a
// stream without [DONE] is an error.
func request(base string, rng *rand.Rand) error {
	p, _ := json.Marshal(prompts[rng.IntN(len(prompts))])
	chat := `"messages":[{"role":"user","content":` + string(p) + `}]`
	sampled := fmt.Sprintf(`,"temperature":0.9,"seed":%d`, rng.IntN(1<<20))
	leave := 0
	var path, body string
	kinds := 6
	if enumN > 0 {
		kinds++
	}
	switch rng.IntN(kinds) {
	case 0:
		path, body = "/v1/completions", `{"prompt":`+string(p)+`,"max_tokens":64`+sampled+`}`
	case 1:
		path, body = "/v1/chat/completions", `{`+chat+`,"max_tokens":48,"stream":true`+sampled+`}`
	case 2:
		path, body = "/v1/chat/completions", `{`+chat+`,"max_tokens":60,"response_format":{"type":"json_object"}`+sampled+`}`
	case 3:
		path, body = "/v1/chat/completions", `{`+chat+`,"max_tokens":100,"response_format":{"type":"json_schema","json_schema":{"name":"pet","schema":`+schema+`}}`+sampled+`}`
	case 4:
		path, body = "/v1/completions", `{"prompt":`+string(p)+`,"max_tokens":64,"kv_policy":`+policies[rng.IntN(len(policies))]+sampled+`}`
	case 5:
		path, body, leave = "/v1/chat/completions", `{`+chat+`,"max_tokens":100,"stream":true`+sampled+`}`, 1+rng.IntN(6)
	case 6:
		path, body = "/v1/chat/completions", `{`+chat+`,"max_tokens":20,"response_format":{"type":"json_schema","json_schema":{"name":"e","schema":`+enumSchema(rng)+`}}`+sampled+`}`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	if !strings.Contains(body, `"stream":true`) {
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	}
	sc := bufio.NewScanner(resp.Body)
	for n := 0; sc.Scan(); {
		if data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			if string(data) == "[DONE]" {
				return nil
			}
			if n++; leave > 0 && n >= leave {
				return nil // the deferred cancel drops the connection
			}
		}
	}
	if leave > 0 {
		return nil
	}
	return fmt.Errorf("%s: stream ended without [DONE]: %v", path, sc.Err())
}
