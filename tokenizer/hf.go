package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Hugging Face tokenizer.json: model BPE (byte-level or byte_fallback),
// normalizers, pre-tokenizers, decoders and added tokens, plus
// tokenizer_config.json for BOS/EOS and the chat template.

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         hfModel         `json:"model"`
}

type hfAddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type                    string            `json:"type"`
	Vocab                   map[string]int32  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
}

// hfNode is any normalizer / pre-tokenizer / decoder / post-processor object.
type hfNode struct {
	Type string `json:"type"`
	// Sequence
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`
	// Split, Replace
	Pattern  *hfPattern `json:"pattern"`
	Behavior string     `json:"behavior"`
	Invert   bool       `json:"invert"`
	Content  string     `json:"content"`
	// Prepend
	Prepend string `json:"prepend"`
	// ByteLevel, Metaspace
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
	Replacement    string `json:"replacement"`
	PrependScheme  string `json:"prepend_scheme"`
	Split          *bool  `json:"split"`
	// Digits, CharDelimiterSplit
	IndividualDigits bool   `json:"individual_digits"`
	Delimiter        string `json:"delimiter"`
	// Strip decoder / normalizer
	Start int  `json:"start"`
	Stop  int  `json:"stop"`
	Left  bool `json:"left"`
	Right bool `json:"right"`
	// TemplateProcessing
	Single []json.RawMessage `json:"single"`
}

type hfPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func hfParseNode(raw json.RawMessage) (*hfNode, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// LoadHF loads a Hugging Face tokenizer: path is a tokenizer.json (optionally
// gzip'd) or a directory holding tokenizer.json and, optionally,
// tokenizer_config.json (BOS/EOS, add_bos_token, chat template). A directory
// with GPT-2's encoder.json and vocab.bpe instead is loaded with LoadGPT2.
func LoadHF(path string) (Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	dir, file := path, ""
	if st.IsDir() {
		for _, name := range []string{"tokenizer.json", "tokenizer.json.gz"} {
			if _, err := os.Stat(filepath.Join(path, name)); err == nil {
				file = filepath.Join(path, name)
				break
			}
		}
		if file == "" {
			enc, bpe := filepath.Join(path, "encoder.json"), filepath.Join(path, "vocab.bpe")
			if _, err := os.Stat(enc); err == nil {
				return LoadGPT2(enc, bpe)
			}
			return nil, fmt.Errorf("tokenizer: %s: no tokenizer.json", path)
		}
	} else {
		dir, file = filepath.Dir(path), path
	}
	data, err := hfReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	var cfg []byte
	if b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json")); err == nil {
		cfg = b
	}
	tmpl := ""
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		tmpl = string(b)
	}
	var head struct {
		Model struct {
			Type string `json:"type"`
		} `json:"model"`
	}
	if json.Unmarshal(data, &head) == nil && head.Model.Type == "WordPiece" {
		t, err := hfWordPiece(data, cfg)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %w", file, err)
		}
		return t, nil
	}
	t, err := ParseHF(data, cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", file, err)
	}
	if t.v.ChatTemplate == "" {
		t.v.ChatTemplate = tmpl
	}
	return t, nil
}

func hfReadFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		if b, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return b, nil
}

// ParseHF builds a tokenizer from the bytes of a tokenizer.json and,
// optionally (nil), a tokenizer_config.json.
func ParseHF(tokenizerJSON, configJSON []byte) (*BPE, error) {
	var f hfFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	m := &f.Model
	if m.Type != "BPE" && !(m.Type == "" && m.Merges != nil) {
		return nil, fmt.Errorf("tokenizer.json: model type %q not supported (only BPE)", m.Type)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" ||
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return nil, fmt.Errorf("tokenizer.json: BPE continuing_subword_prefix / end_of_word_suffix not supported")
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer.json: empty model vocab")
	}

	normalize, err := hfNormalizer(f.Normalizer)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: normalizer: %w", err)
	}
	pre, err := hfPreTokenizer(f.PreTokenizer)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: %w", err)
	}
	dec, err := hfDecoder(f.Decoder)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: decoder: %w", err)
	}
	byteLevel := pre.byteLevel || dec.byteLevel

	// Token table: model vocab, then added tokens on top.
	size := 0
	for _, id := range m.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("tokenizer.json: negative token id %d", id)
		}
		size = max(size, int(id)+1)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 {
			return nil, fmt.Errorf("tokenizer.json: added token %q: negative id", a.Content)
		}
		size = max(size, int(a.ID)+1)
	}
	if size > 1<<24 {
		return nil, fmt.Errorf("tokenizer.json: token id %d too large", size-1)
	}
	v := &Vocab{BOS: -1, EOS: -1, UNK: -1, PAD: -1, EOT: -1}
	v.Tokens = make([]string, size)
	v.Types = make([]int32, size)
	for i := range v.Types {
		v.Types[i] = TypeUnused
	}
	t := &BPE{v: v, byteLevel: byteLevel, ignoreMerges: m.IgnoreMerges, byteFallback: m.ByteFallback,
		fuseUnk: m.FuseUnk, unk: -1, normalize: normalize, stripLeft: dec.stripLeft}
	t.ids = make(map[string]int32, len(m.Vocab))
	for s, id := range m.Vocab {
		v.Tokens[id] = s
		v.Types[id] = TypeNormal
		key := s
		if byteLevel {
			raw, ok := byteLevelDecode(s)
			if !ok {
				continue
			}
			key = raw
		}
		t.ids[key] = id
		if m.ByteFallback && len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>' {
			v.Types[id] = TypeByte
		}
	}
	if m.UnkToken != nil {
		if id, ok := m.Vocab[*m.UnkToken]; ok {
			t.unk, v.UNK = id, id
			v.Types[id] = TypeUnknown
		}
	}
	added := make([]bpeAddedTok, 0, len(f.AddedTokens))
	for _, a := range f.AddedTokens {
		v.Tokens[a.ID] = a.Content
		if a.Special {
			v.Types[a.ID] = TypeControl
		} else {
			v.Types[a.ID] = TypeUserDefined
		}
		added = append(added, bpeAddedTok{id: a.ID, text: a.Content, special: a.Special,
			lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord, normalized: a.Normalized})
	}
	t.added = newBPEAdded(added)

	if err := t.parseMerges(m.Merges, byteLevel); err != nil {
		return nil, err
	}
	t.split = pre.split
	v.Pre = pre.family
	if byteLevel {
		v.Model = "gpt2"
	} else {
		v.Model = "llama"
		v.AddSpacePrefix = hfPrepends(f.Normalizer) || pre.prepends
	}
	if err := hfSpecials(v, &f, configJSON); err != nil {
		return nil, err
	}
	t.finish()
	return t, nil
}

// parseMerges reads the merge list, in either of the two spellings
// tokenizers writes ("a b" or ["a", "b"]); the list index is the rank.
func (t *BPE) parseMerges(merges []json.RawMessage, byteLevel bool) error {
	t.merges = make(map[uint64]bpeMerge, len(merges))
	for rank, raw := range merges {
		var a, b string
		var s string
		var pair []string
		if x, y, ok := hfFastPair(raw); ok {
			a, b = x, y
		} else if err := json.Unmarshal(raw, &s); err == nil {
			k := strings.IndexByte(s[min(1, len(s)):], ' ')
			if k < 0 {
				return fmt.Errorf("tokenizer.json: merge %d %q has no space", rank, s)
			}
			k += min(1, len(s))
			a, b = s[:k], s[k+1:]
		} else if err := json.Unmarshal(raw, &pair); err == nil && len(pair) == 2 {
			a, b = pair[0], pair[1]
		} else {
			return fmt.Errorf("tokenizer.json: merge %d: %s is neither \"a b\" nor [a, b]", rank, raw)
		}
		if byteLevel {
			ra, ok1 := byteLevelDecode(a)
			rb, ok2 := byteLevelDecode(b)
			if !ok1 || !ok2 {
				continue
			}
			a, b = ra, rb
		}
		t.addMerge(a, b, int32(rank))
	}
	return nil
}

// hfNormalizer compiles a normalizer into one string function.
func hfNormalizer(raw json.RawMessage) (func(string) string, error) {
	n, err := hfParseNode(raw)
	if err != nil || n == nil {
		return nil, err
	}
	switch n.Type {
	case "Sequence":
		var fs []func(string) string
		for _, r := range n.Normalizers {
			f, err := hfNormalizer(r)
			if err != nil {
				return nil, err
			}
			if f != nil {
				fs = append(fs, f)
			}
		}
		if len(fs) == 0 {
			return nil, nil
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Prepend":
		p := n.Prepend
		return func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}, nil
	case "Replace":
		if n.Pattern == nil {
			return nil, fmt.Errorf("Replace without pattern")
		}
		content := n.Content
		if n.Pattern.String != nil {
			old := *n.Pattern.String
			return func(s string) string { return strings.ReplaceAll(s, old, content) }, nil
		}
		if n.Pattern.Regex != nil {
			re, err := regexp.Compile(*n.Pattern.Regex)
			if err != nil {
				return nil, fmt.Errorf("Replace pattern %q: %w", *n.Pattern.Regex, err)
			}
			return func(s string) string { return re.ReplaceAllLiteralString(s, content) }, nil
		}
		return nil, fmt.Errorf("Replace without pattern")
	case "Strip":
		l, r := n.Left, n.Right
		return func(s string) string {
			if l {
				s = strings.TrimLeftFunc(s, preIsSpace)
			}
			if r {
				s = strings.TrimRightFunc(s, preIsSpace)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer %q not supported", n.Type)
}

// hfPrepends reports whether the normalizer prepends "▁" (SentencePiece's
// dummy prefix), which Decode/Stream undo on the first token.
func hfPrepends(raw json.RawMessage) bool {
	n, err := hfParseNode(raw)
	if err != nil || n == nil {
		return false
	}
	if n.Type == "Prepend" {
		return n.Prepend == spaceMark
	}
	for _, r := range n.Normalizers {
		if hfPrepends(r) {
			return true
		}
	}
	return false
}

// hfPre is a compiled pre-tokenizer.
type hfPre struct {
	split     func(s string, atStart bool) []string
	byteLevel bool
	prepends  bool   // Metaspace adds "▁" in front
	family    string // llama.cpp name when the regex is a known one
}

// hfPreOp transforms the list of pieces; atStart says the segment begins
// the input (Metaspace prepend_scheme "first").
type hfPreOp func(pieces []string, atStart bool) []string

func hfPreTokenizer(raw json.RawMessage) (hfPre, error) {
	var p hfPre
	ops, err := hfPreOps(raw, &p)
	if err != nil {
		return p, err
	}
	if len(ops) == 0 {
		return p, nil
	}
	p.split = func(s string, atStart bool) []string {
		pieces := []string{s}
		for _, op := range ops {
			pieces = op(pieces, atStart)
		}
		return pieces
	}
	return p, nil
}

func hfPreOps(raw json.RawMessage, p *hfPre) ([]hfPreOp, error) {
	n, err := hfParseNode(raw)
	if err != nil || n == nil {
		return nil, err
	}
	switch n.Type {
	case "Sequence":
		var ops []hfPreOp
		for _, r := range n.Pretokenizers {
			o, err := hfPreOps(r, p)
			if err != nil {
				return nil, err
			}
			ops = append(ops, o...)
		}
		return ops, nil
	case "Split":
		st, fam, err := hfSplitStage(n)
		if err != nil {
			return nil, err
		}
		if fam != "" && (p.family == "" || p.family == "digits") {
			p.family = fam
		}
		beh, err := hfBehavior(n.Behavior)
		if err != nil {
			return nil, err
		}
		split := preSplit{stage: st, behavior: beh, invert: n.Invert}
		return []hfPreOp{hfSplitOp(split)}, nil
	case "ByteLevel":
		p.byteLevel = true
		prefix := n.AddPrefixSpace != nil && *n.AddPrefixSpace
		useRegex := n.UseRegex == nil || *n.UseRegex
		if useRegex && p.family == "" {
			p.family = "gpt2"
		}
		gpt2 := preSplit{stage: preMatchStage{preMatchGPT2}}
		return []hfPreOp{func(pieces []string, _ bool) []string {
			if prefix {
				for i, s := range pieces {
					if !strings.HasPrefix(s, " ") {
						pieces[i] = " " + s
					}
				}
			}
			if useRegex {
				return hfSplitOp(gpt2)(pieces, false)
			}
			return pieces
		}}, nil
	case "Metaspace":
		rep := n.Replacement
		if rep == "" {
			rep = spaceMark
		}
		scheme := n.PrependScheme
		if scheme == "" {
			scheme = "always"
			if n.AddPrefixSpace != nil && !*n.AddPrefixSpace {
				scheme = "never"
			}
		}
		p.prepends = scheme != "never"
		doSplit := n.Split == nil || *n.Split
		r0, _ := utf8.DecodeRuneInString(rep)
		sep := preSplit{stage: preMatchStage{preMatchClassOne(func(r rune) bool { return r == r0 })}, behavior: preSplitMergedWithNext}
		return []hfPreOp{func(pieces []string, atStart bool) []string {
			for i, s := range pieces {
				s = strings.ReplaceAll(s, " ", rep)
				if (scheme == "always" || scheme == "first" && atStart && i == 0) && !strings.HasPrefix(s, rep) {
					s = rep + s
				}
				pieces[i] = s
			}
			if doSplit {
				return hfSplitOp(sep)(pieces, atStart)
			}
			return pieces
		}}, nil
	case "Digits":
		var st preSplit
		if n.IndividualDigits {
			st = preSplit{stage: preMatchStage{preMatchClassOne(preIsN)}}
		} else {
			st = preSplit{stage: preMatchStage{preMatchClassRun(preIsN)}}
		}
		return []hfPreOp{hfSplitOp(st)}, nil
	case "Whitespace":
		// \w+|[^\w\s]+, the rest (white space) removed.
		word := func(r rune) bool { return preIsL(r) || preIsN(r) || preIsM(r) || unicode.Is(unicode.Pc, r) }
		other := func(r rune) bool { return !word(r) && !preIsSpace(r) }
		m := func(rs []rune, i int) int {
			if n := preRunOf(rs, i, word) - i; n > 0 {
				return n
			}
			return preRunOf(rs, i, other) - i
		}
		st := preSplit{stage: preMatchStage{m}, behavior: preSplitRemoved, invert: true}
		return []hfPreOp{hfSplitOp(st)}, nil
	case "Punctuation":
		beh, err := hfBehavior(n.Behavior)
		if err != nil {
			return nil, err
		}
		st := preSplit{stage: preMatchStage{preMatchClassOne(func(r rune) bool { return preIsASCIIPunct(r) || preIsP(r) })}, behavior: beh}
		return []hfPreOp{hfSplitOp(st)}, nil
	case "CharDelimiterSplit":
		d, _ := utf8.DecodeRuneInString(n.Delimiter)
		st := preSplit{stage: preMatchStage{preMatchClassOne(func(r rune) bool { return r == d })}, behavior: preSplitRemoved}
		return []hfPreOp{hfSplitOp(st)}, nil
	case "WhitespaceSplit":
		st := preSplit{stage: preMatchStage{preMatchClassRun(preIsSpace)}, behavior: preSplitRemoved}
		return []hfPreOp{hfSplitOp(st)}, nil
	}
	return nil, fmt.Errorf("pre-tokenizer %q not supported", n.Type)
}

func hfSplitOp(st preSplit) hfPreOp {
	stages := []preSplit{st}
	return func(pieces []string, _ bool) []string {
		out := pieces[:0:0]
		for _, s := range pieces {
			out = append(out, preSplitWords(s, stages)...)
		}
		return out
	}
}

func hfBehavior(s string) (preSplitBehavior, error) {
	switch s {
	case "Isolated", "":
		return preSplitIsolated, nil
	case "Removed":
		return preSplitRemoved, nil
	case "MergedWithPrevious":
		return preSplitMergedWithPrevious, nil
	case "MergedWithNext":
		return preSplitMergedWithNext, nil
	case "Contiguous":
		return preSplitContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q not supported", s)
}

// hfKnownPatterns maps the regexes of common tokenizer.json files (written
// with \r and \n escapes) to hand-written matchers: Go's regexp has no
// look-ahead and an ASCII-only \s.
var hfKnownPatterns = map[string]struct {
	m      preMatcher
	family string
}{
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                            {preLlama3Like{digits: 3}.match, "llama3"},
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                 {preLlama3Like{digits: 1}.match, "qwen2"},
	`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`:                                                                     {preMatchGPT2, "gpt2"},
	`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`:                                                                         {preMatchGPT2, "gpt2"},
	`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`: {preMatchDeepseekV3, "deepseek-v3"},
	`\p{N}{1,3}`:   {preMatchDigitsUpTo(3), "digits"},
	`\p{N}`:        {preMatchClassOne(preIsN), "digits"},
	`\p{N}+`:       {preMatchClassRun(preIsN), "digits"},
	`[一-龥぀-ゟ゠-ヿ]+`: {preMatchClassRun(preDeepseekV3CJK), ""},
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`:                                                                {preCaseSplit{digits: 1}.match, "tekken"},
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`: {preCaseSplit{digits: 3, contraction: true}.match, "gpt-4o"},
}

func hfSplitStage(n *hfNode) (preStage, string, error) {
	if n.Pattern == nil {
		return nil, "", fmt.Errorf("Split without pattern")
	}
	if n.Pattern.String != nil {
		lit := *n.Pattern.String
		if lit == "" {
			return nil, "", fmt.Errorf("Split with empty string pattern")
		}
		return preMatchStage{preMatchLiteral(lit)}, "", nil
	}
	if n.Pattern.Regex == nil {
		return nil, "", fmt.Errorf("Split without pattern")
	}
	pat := *n.Pattern.Regex
	key := strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(pat)
	if k, ok := hfKnownPatterns[key]; ok {
		return preMatchStage{k.m}, k.family, nil
	}
	re, err := regexp.Compile(hfTranslateRegex(pat))
	if err != nil {
		return nil, "", fmt.Errorf("Split regex %q not supported: %w", pat, err)
	}
	return preRegexpStage{re}, "", nil
}

// hfTranslateRegex gives \s, \d and \w the Unicode meaning they have in the
// Oniguruma regexes of HF tokenizers (Go's are ASCII only): White_Space,
// \p{Nd}, and letters, marks, decimal digits and connector punctuation.
// Negated forms inside a class (\S in [...]) are left as they are.
func hfTranslateRegex(p string) string {
	classes := map[byte]string{
		's': `\t-\r\x{85}\p{Z}`,
		'd': `\p{Nd}`,
		'w': `\p{L}\p{M}\p{Nd}\p{Pc}`,
	}
	var sb strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '\\' && i+1 < len(p) {
			e := p[i+1]
			lower := e | 0x20
			if cls, ok := classes[lower]; ok && (e == lower || !inClass) {
				switch {
				case inClass:
					sb.WriteString(cls)
				case e == lower:
					sb.WriteString("[" + cls + "]")
				default:
					sb.WriteString("[^" + cls + "]")
				}
			} else {
				sb.WriteByte(c)
				sb.WriteByte(e)
			}
			i++
			continue
		}
		if c == '[' && !inClass {
			inClass = true
		} else if c == ']' && inClass {
			inClass = false
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

type hfDec struct {
	byteLevel bool
	stripLeft int
}

func hfDecoder(raw json.RawMessage) (hfDec, error) {
	var d hfDec
	err := hfDecoderInto(raw, &d)
	return d, err
}

func hfDecoderInto(raw json.RawMessage, d *hfDec) error {
	n, err := hfParseNode(raw)
	if err != nil || n == nil {
		return err
	}
	switch n.Type {
	case "Sequence":
		for _, r := range n.Decoders {
			if err := hfDecoderInto(r, d); err != nil {
				return err
			}
		}
	case "ByteLevel":
		d.byteLevel = true
	case "Strip":
		if n.Content == " " || n.Content == "" {
			d.stripLeft += n.Start
		}
	case "Metaspace":
		if n.PrependScheme != "never" && (n.AddPrefixSpace == nil || *n.AddPrefixSpace) {
			d.stripLeft++
		}
	case "Replace", "ByteFallback", "Fuse":
		// Replace("▁"→" ") and byte fallback are built into TokenBytes.
	default:
		return fmt.Errorf("decoder %q not supported", n.Type)
	}
	return nil
}

// hfTokenRef is a tokenizer_config.json token: a string or an AddedToken
// object.
type hfTokenRef struct{ content string }

func (r *hfTokenRef) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	if err := json.Unmarshal(b, &r.content); err == nil {
		return nil
	}
	var o struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	r.content = o.Content
	return nil
}

type hfConfig struct {
	BOS          *hfTokenRef     `json:"bos_token"`
	EOS          *hfTokenRef     `json:"eos_token"`
	PAD          *hfTokenRef     `json:"pad_token"`
	UNK          *hfTokenRef     `json:"unk_token"`
	AddBOS       *bool           `json:"add_bos_token"`
	AddEOS       *bool           `json:"add_eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// hfEOGNames are end-of-turn tokens found by text, as llama.cpp does.
var hfEOGNames = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
	"<|end_of_text|>", "<EOT>", "<｜end▁of▁sentence｜>", "<|eom_id|>", "<end_of_utterance>"}

func hfSpecials(v *Vocab, f *hfFile, configJSON []byte) error {
	byText := map[string]int32{}
	for i, s := range v.Tokens {
		if v.Types[i] == TypeControl || v.Types[i] == TypeUserDefined || v.Types[i] == TypeUnknown {
			byText[s] = int32(i)
		}
	}
	for i, s := range v.Tokens {
		if _, ok := byText[s]; !ok && s != "" {
			byText[s] = int32(i)
		}
	}
	lookup := func(r *hfTokenRef) int32 {
		if r == nil || r.content == "" {
			return -1
		}
		if id, ok := byText[r.content]; ok {
			return id
		}
		return -1
	}
	var cfg hfConfig
	if configJSON != nil {
		if err := json.Unmarshal(configJSON, &cfg); err != nil {
			return fmt.Errorf("tokenizer_config.json: %w", err)
		}
	}
	v.BOS, v.EOS, v.PAD = lookup(cfg.BOS), lookup(cfg.EOS), lookup(cfg.PAD)
	if id := lookup(cfg.UNK); id >= 0 {
		v.UNK = id
	}
	// TemplateProcessing says which specials surround a single sequence.
	first, last := hfTemplateEnds(f.PostProcessor)
	// Ids from the post-processor come from the file: keep them in range.
	if int(first) >= len(v.Tokens) {
		first = -1
	}
	if int(last) >= len(v.Tokens) {
		last = -1
	}
	if v.BOS < 0 && first >= 0 {
		v.BOS = first
	}
	if v.EOS < 0 && last >= 0 {
		v.EOS = last
	}
	switch {
	case cfg.AddBOS != nil:
		v.AddBOS = *cfg.AddBOS && v.BOS >= 0
	case first >= 0:
		v.AddBOS = true
		v.BOS = first
	default:
		// Llama-3's tokenizer.json adds <|begin_of_text|> in transformers'
		// wrapper, not in the file; llama.cpp adds BOS whenever one is named.
		v.AddBOS = v.BOS >= 0
	}
	if cfg.AddEOS != nil {
		v.AddEOS = *cfg.AddEOS && v.EOS >= 0
	} else {
		v.AddEOS = last >= 0
	}
	for _, name := range hfEOGNames {
		if id, ok := byText[name]; ok && v.Types[id] != TypeNormal {
			if v.EOT < 0 && name != "<|endoftext|>" && name != "<|end_of_text|>" {
				v.EOT = id
			}
			v.EOG = append(v.EOG, id)
		}
	}
	if v.EOS >= 0 && !v.IsEOG(v.EOS) {
		v.EOG = append(v.EOG, v.EOS)
	}
	tmpl, err := hfChatTemplate(cfg.ChatTemplate)
	if err != nil {
		return fmt.Errorf("tokenizer_config.json: chat_template: %w", err)
	}
	v.ChatTemplate = tmpl
	return nil
}

// hfTemplateEnds returns the special token ids at the start and the end of
// TemplateProcessing's "single" template (-1 when absent).
func hfTemplateEnds(raw json.RawMessage) (first, last int32) {
	first, last = -1, -1
	n, err := hfParseNode(raw)
	if err != nil || n == nil {
		return
	}
	if n.Type == "Sequence" {
		for _, r := range n.Processors {
			if a, b := hfTemplateEnds(r); a >= 0 || b >= 0 {
				return a, b
			}
		}
		return
	}
	if n.Type == "RobertaProcessing" || n.Type == "BertProcessing" {
		// <s> A </s> / [CLS] A [SEP]: cls and sep are ["text", id].
		var rp struct {
			Sep []json.RawMessage `json:"sep"`
			Cls []json.RawMessage `json:"cls"`
		}
		if json.Unmarshal(raw, &rp) != nil {
			return
		}
		id := func(pair []json.RawMessage) int32 {
			var x int32
			if len(pair) == 2 && json.Unmarshal(pair[1], &x) == nil && x >= 0 {
				return x
			}
			return -1
		}
		return id(rp.Cls), id(rp.Sep)
	}
	if n.Type != "TemplateProcessing" {
		return
	}
	var pp struct {
		Single        []map[string]json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if json.Unmarshal(raw, &pp) != nil {
		return
	}
	idOf := func(item map[string]json.RawMessage) int32 {
		st, ok := item["SpecialToken"]
		if !ok {
			return -1
		}
		var s struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(st, &s) != nil {
			return -1
		}
		if ids := pp.SpecialTokens[s.ID].IDs; len(ids) == 1 {
			return ids[0]
		}
		return -1
	}
	if len(pp.Single) > 0 {
		first = idOf(pp.Single[0])
		if len(pp.Single) > 1 {
			last = idOf(pp.Single[len(pp.Single)-1])
		}
	}
	return
}

// hfChatTemplate reads chat_template: a string, or a list of named
// templates of which "default" (else the first) is taken.
func hfChatTemplate(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", err
	}
	for _, e := range list {
		if e.Name == "default" {
			return e.Template, nil
		}
	}
	if len(list) > 0 {
		return list[0].Template, nil
	}
	return "", nil
}

// hfFastPair reads a merge without escapes ("a b" or ["a","b"]) without
// going through encoding/json, which dominates loading otherwise.
func hfFastPair(raw []byte) (string, string, bool) {
	if bytes.IndexByte(raw, '\\') >= 0 || len(raw) < 2 {
		return "", "", false
	}
	if raw[0] == '"' && raw[len(raw)-1] == '"' {
		s := raw[1 : len(raw)-1]
		k := bytes.IndexByte(s[min(1, len(s)):], ' ')
		if k < 0 || bytes.IndexByte(s, '"') >= 0 {
			return "", "", false
		}
		k += min(1, len(s))
		return string(s[:k]), string(s[k+1:]), true
	}
	if raw[0] != '[' || raw[len(raw)-1] != ']' {
		return "", "", false
	}
	// Exactly four quotes: ["a","b"], with only a comma and spaces between.
	var q [4]int
	n := 0
	for i, c := range raw {
		if c == '"' {
			if n == 4 {
				return "", "", false
			}
			q[n] = i
			n++
		}
	}
	if n != 4 || strings.Trim(string(raw[q[1]+1:q[2]]), " \t\r\n") != "," ||
		strings.TrimSpace(string(raw[1:q[0]])) != "" || strings.TrimSpace(string(raw[q[3]+1:len(raw)-1])) != "" {
		return "", "", false
	}
	return string(raw[q[0]+1 : q[1]]), string(raw[q[2]+1 : q[3]]), true
}
