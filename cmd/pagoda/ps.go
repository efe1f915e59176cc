package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"pagoda/progress"
)

func init() {
	register("ps", "show what a running pagoda serve holds: model, memory, KV cache use, requests", runPS)
}

// psModel is one model of GET /api/ps (ollama's shape).
type psModel struct {
	Name          string `json:"name"`
	Size          int64  `json:"size"`
	ContextLength int    `json:"context_length"`
	Details       struct {
		Format            string `json:"format"`
		Family            string `json:"family"`
		ParameterSize     string `json:"parameter_size"`
		QuantizationLevel string `json:"quantization_level"`
	} `json:"details"`
}

// psEngine is the part of GET /api/engine that ps shows.
type psEngine struct {
	Running, Waiting int
	InFlight         int64 `json:"in_flight"`
	KV               struct {
		Blocks    int     `json:"blocks"`
		BlockSize int     `json:"block_size"`
		Used      int     `json:"used"`
		Cached    int     `json:"cached"`
		Usage     float64 `json:"usage"`
	} `json:"kv"`
}

func runPS(args []string) error {
	fs := flag.NewFlagSet("ps", flag.ContinueOnError)
	host := fs.String("host", "", "the server (default $PAGODA_HOST, else http://127.0.0.1:8000)")
	apiKey := fs.String("api-key", "", "the server's API key (default $PAGODA_API_KEY)")
	if err := parseFlags(fs, args, nil); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("ps takes no arguments (the server is --host)")
	}
	base := strings.TrimSuffix(cmp.Or(*host, os.Getenv("PAGODA_HOST"), "http://127.0.0.1:8000"), "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	key := cmp.Or(*apiKey, os.Getenv("PAGODA_API_KEY"))
	var ps struct{ Models []psModel }
	if err := getJSON(base+"/api/ps", key, &ps); err != nil {
		return err
	}
	var eng *psEngine
	var e psEngine
	if err := getJSON(base+"/api/engine", key, &e); err == nil {
		eng = &e // an embeddings-only server has no engine view
	}
	return writePS(os.Stdout, ps.Models, eng)
}

// getJSON GETs url into v, with the API key when there is one.
func getJSON(url, key string, v any) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("no server answered at %s (start one with pagoda serve, or give --host): %w", strings.TrimSuffix(url, "/api/ps"), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// writePS prints the models a server holds and, when it has an engine
// view, its KV cache and requests.
func writePS(w io.Writer, models []psModel, eng *psEngine) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPARAMS\tQUANT\tSIZE\tCONTEXT\tKV CACHE\tREQUESTS")
	for _, m := range models {
		kv, reqs := "-", "-"
		if eng != nil {
			kv = fmt.Sprintf("%d/%d blocks of %d tokens in use (%.0f%%), %d cached", eng.KV.Used, eng.KV.Blocks, eng.KV.BlockSize, 100*eng.KV.Usage, eng.KV.Cached)
			reqs = fmt.Sprintf("%d running, %d waiting", eng.Running, eng.Waiting)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.Name, cmp.Or(m.Details.ParameterSize, "-"), cmp.Or(m.Details.QuantizationLevel, "-"),
			progress.Bytes(m.Size), m.ContextLength, kv, reqs)
	}
	return tw.Flush()
}
