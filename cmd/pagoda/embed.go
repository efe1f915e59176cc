package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"time"

	"pagoda/encoder"
	"pagoda/engine"
	"pagoda/gguf"
	"pagoda/model"
	"pagoda/server"
	"pagoda/tokenizer"
)

func init() {
	register("embed", "print embeddings of texts (one per argument, or per stdin line) as JSON: BERT-family encoders or decoders", runEmbed)
}

// isEncoderFile says whether path is a GGUF file of an encoder
// architecture (bert).
func isEncoderFile(path string) bool {
	if !gguf.IsGGUF(path) {
		return false
	}
	f, err := gguf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return encoder.IsEncoder(f)
}

// embedModel is a loaded model with what the embedder needs.
type embedModel struct {
	run     engine.HiddenRunner
	tok     tokenizer.Tokenizer
	dim     int
	ctx     int
	pooling string
	close   func() error
}

func openEmbedModel(path, tokPath string, threads int) (*embedModel, error) {
	if isEncoderFile(path) {
		m, err := encoder.Load(path, encoder.Options{Threads: threads})
		if err != nil {
			return nil, err
		}
		return &embedModel{m, m.Tokenizer(), m.Config.NEmbd, m.Config.ContextLen, m.Config.Pooling.String(), m.Close}, nil
	}
	m, err := openModel(path, model.Options{Tokenizer: tokPath, Threads: threads})
	if err != nil {
		return nil, err
	}
	if m.Tokenizer() == nil {
		m.Close()
		return nil, fmt.Errorf("%s has no tokenizer; pass --tokenizer FILE", path)
	}
	return &embedModel{m, m.Tokenizer(), m.Config.NEmbd, m.Config.ContextLen, m.Config.Pooling, m.Close}, nil
}

func runEmbed(args []string) error {
	fs := flag.NewFlagSet("embed", flag.ContinueOnError)
	modelPath := fs.String("m", "", "model: a BERT-family encoder GGUF, or a decoder (default: the built-in stories260K)")
	tokPath := fs.String("tokenizer", "", "tokenizer file overriding a decoder's")
	pooling := fs.String("pooling", "", "mean, cls or last (default: the file's pooling_type; a decoder without one: last)")
	raw := fs.Bool("no-normalize", false, "print the pooled vectors as they are, not scaled to unit length")
	threads := fs.Int("threads", 0, "threads (0 = number of CPUs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	path, err := resolveModel(*modelPath)
	if err != nil {
		return err
	}
	texts := fs.Args()
	if len(texts) == 0 {
		b, err := readAllStdin()
		if err != nil {
			return err
		}
		texts = b
	}
	if len(texts) == 0 {
		return fmt.Errorf("no text: give texts as arguments or lines on stdin")
	}
	em, err := openEmbedModel(path, *tokPath, *threads)
	if err != nil {
		return err
	}
	defer em.close()
	p := em.pooling
	if *pooling != "" {
		p = *pooling
	}
	e, err := engine.NewEmbedder(em.run, engine.EmbedConfig{Dim: em.dim, ContextLen: em.ctx, Pooling: p})
	if err != nil {
		return fmt.Errorf("%v (choose one with --pooling)", err)
	}
	defer e.Close()
	inputs := make([][]int32, len(texts))
	for i, t := range texts {
		inputs[i] = em.tok.Encode(t, tokenizer.Options{AddSpecial: true, ParseSpecial: true})
	}
	vecs, err := e.Embed(context.Background(), inputs)
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	for i, v := range vecs {
		if !*raw {
			encoder.Normalize(v)
		}
		line := struct {
			Index     int       `json:"index"`
			Tokens    int       `json:"tokens"`
			Embedding []float32 `json:"embedding"`
		}{i, len(inputs[i]), v}
		if err := out.Encode(line); err != nil {
			return err
		}
	}
	return nil
}

// readAllStdin reads one text per non-empty line of stdin.
func readAllStdin() ([]string, error) {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []string
	for sc.Scan() {
		if l := strings.TrimRight(sc.Text(), "\r"); l != "" {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

// newEmbedder is the embedder serve gives the server for a decoder, nil
// (with a log line) when the model's pooling gives none.
func newEmbedder(m *model.Model) *engine.Embedder {
	c := m.Config
	e, err := engine.NewEmbedder(m, engine.EmbedConfig{Dim: c.NEmbd, ContextLen: c.ContextLen, Pooling: c.Pooling})
	if err != nil {
		log.Printf("pagoda: no embeddings: %v", err)
		return nil
	}
	return e
}

// serveEncoder serves an encoder GGUF: embeddings only.
func serveEncoder(path, name string, threads int, addr, apiKey string, grace time.Duration, o server.Options) error {
	m, err := encoder.Load(path, encoder.Options{Threads: threads})
	if err != nil {
		return err
	}
	defer m.Close()
	c := m.Config
	e, err := engine.NewEmbedder(m, engine.EmbedConfig{Dim: c.NEmbd, ContextLen: c.ContextLen, Pooling: c.Pooling.String()})
	if err != nil {
		return err
	}
	defer e.Close()
	b, err := server.NewEmbeddingBackend(m.Tokenizer(), name, c.ContextLen)
	if err != nil {
		return err
	}
	o.APIKey, o.Embedder = apiKey, e
	srv := server.New(b, o)
	ctx, _, stopSignals := drainSignals(srv.Abort)
	defer stopSignals()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("pagoda: serving embeddings of %s (%s, %d layers, width %d, %s pooling, %d positions) on http://%s",
		name, c.Arch, c.NLayer, c.NEmbd, c.Pooling, c.ContextLen, ln.Addr())
	err = srv.Serve(ctx, ln, grace)
	log.Printf("pagoda: stopped")
	return err
}
