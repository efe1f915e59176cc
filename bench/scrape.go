package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// scrape reads the server's Prometheus text exposition and sums each
// metric over its label sets (name → value). Histogram and summary series
// keep their _bucket/_sum/_count names.
func scrape(ctx context.Context, c *Config) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.BaseURL+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: scraping /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("bench: scraping /metrics: status %d", resp.StatusCode)
	}
	return parseMetrics(io.LimitReader(resp.Body, 64<<20))
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var name, rest string
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, rest = line[:i], line[j+1:]
		} else {
			sp := strings.IndexAny(line, " \t")
			if sp < 0 {
				continue
			}
			name, rest = line[:sp], line[sp:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	return out, sc.Err()
}

// serverExtras derives the prefix-cache hit rate over the run and picks
// the KV-cache figures Pagoda exports.
func (r *Result) serverExtras(before, after map[string]float64) {
	if after == nil {
		return
	}
	delta := func(name string) (float64, bool) {
		a, ok := after[name]
		if !ok {
			return 0, false
		}
		return a - before[name], true
	}
	hits, okH := delta("vllm:prefix_cache_hits_total")
	queries, okQ := delta("vllm:prefix_cache_queries_total")
	if okH && okQ && queries > 0 {
		rate := hits / queries
		r.PrefixCacheHitRate = &rate
	}
	filled, okF := delta("pagoda:kv_slots_filled_total")
	reserved, okR := delta("pagoda:kv_slots_reserved_total")
	if okF && okR && filled+reserved > 0 {
		w := reserved / (filled + reserved)
		r.KVWaste = &w
	}
	drafts, okD := delta("vllm:spec_decode_num_drafts")
	draftToks, okT := delta("vllm:spec_decode_num_draft_tokens")
	accepted, okA := delta("vllm:spec_decode_num_accepted_tokens")
	if okD && okT && okA && drafts > 0 && draftToks > 0 {
		rate, length := accepted/draftToks, 1+accepted/drafts
		r.SpecAcceptanceRate, r.SpecAcceptanceLength = &rate, &length
		r.SpecDrafts, r.SpecDraftTokens, r.SpecAccepted = drafts, draftToks, accepted
	}
	m := map[string]float64{}
	for name, v := range after {
		switch {
		case name == "vllm:prefix_cache_hits_total", name == "vllm:prefix_cache_queries_total",
			name == "vllm:num_preemptions_total":
			d, _ := delta(name)
			m[name] = d
		case strings.HasPrefix(name, "pagoda:spec_ctl_") && strings.HasSuffix(name, "_total"):
			// The speculation controller's measured steps by arm.
			d, _ := delta(name)
			m[name] = d
		case strings.HasPrefix(name, "pagoda:kv_"):
			if strings.HasSuffix(name, "_total") {
				d, _ := delta(name)
				m[name] = d
			} else {
				m[name] = v
			}
		}
	}
	if len(m) > 0 {
		r.ServerMetrics = m
	}
}
