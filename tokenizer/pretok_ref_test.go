package tokenizer

import (
	"fmt"
	"math/rand"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"unicode"
	"unicode/utf8"
)

// A slow reference for the single-regex families: each alternative of the
// original pattern is compiled on its own with Go's regexp (leftmost-first,
// as a backtracking engine picks for these patterns) and tried in order at
// every position; only \s+(?!\S), which RE2 cannot express, is written out.

const preRefLookahead = "LOOKAHEAD"

type preRef struct {
	name string
	alts []string
}

var preRefs = []preRef{
	{"llama3", []string{`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}{1,3}`,
		` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, preRefLookahead, `\s+`}},
	{"qwen2", []string{`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`, `[^\r\n\p{L}\p{N}]?\p{L}+`, `\p{N}`,
		` ?[^\s\p{L}\p{N}]+[\r\n]*`, `\s*[\r\n]+`, preRefLookahead, `\s+`}},
	{"gpt2", []string{`'s|'t|'re|'ve|'m|'ll|'d`, ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`, preRefLookahead, `\s+`}},
	{"tekken", []string{`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*`, `\p{N}`,
		` ?[^\s\p{L}\p{N}]+[\r\n/]*`, `\s*[\r\n]+`, preRefLookahead, `\s+`}},
	{"gpt-4o", []string{`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?`,
		`\p{N}{1,3}`, ` ?[^\s\p{L}\p{N}]+[\r\n/]*`, `\s*[\r\n]+`, preRefLookahead, `\s+`}},
}

// The DeepSeek-V3 word regex alone (its own family runs two stages first).
var preRefDeepseekV3 = []string{"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+", `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`,
	` ?[\p{P}\p{S}]+[\r\n]*`, `\s*[\r\n]+`, preRefLookahead, `\s+`}

var (
	refCacheMu sync.Mutex
	refCache   = map[string][]*regexp.Regexp{}
)

func compileRef(t testing.TB, alts []string) []*regexp.Regexp {
	key := strings.Join(alts, "\x00")
	refCacheMu.Lock()
	defer refCacheMu.Unlock()
	if res, ok := refCache[key]; ok {
		return res
	}
	res := make([]*regexp.Regexp, len(alts))
	for i, a := range alts {
		if a == preRefLookahead {
			continue
		}
		res[i] = regexp.MustCompile(`\A(?:` + hfTranslateRegex(a) + `)`)
	}
	refCache[key] = res
	return res
}

var refSpace = regexp.MustCompile(`\A` + hfTranslateRegex(`\s+`))

func refSplit(s string, res []*regexp.Regexp) []string {
	var out []string
	gap := 0
	for i := 0; i < len(s); {
		n := 0
		for _, re := range res {
			if re == nil {
				if l := refSpace.FindStringIndex(s[i:]); l != nil {
					switch {
					case i+l[1] == len(s):
						n = l[1]
					default:
						_, w := utf8.DecodeLastRuneInString(s[i : i+l[1]])
						n = l[1] - w
					}
				}
			} else if l := re.FindStringIndex(s[i:]); l != nil {
				n = l[1]
			}
			if n > 0 {
				break
			}
		}
		if n == 0 {
			_, w := utf8.DecodeRuneInString(s[i:])
			i += w
			continue
		}
		if i > gap {
			out = append(out, s[gap:i])
		}
		out = append(out, s[i:i+n])
		i += n
		gap = i
	}
	if gap < len(s) {
		out = append(out, s[gap:])
	}
	return out
}

// preRefAlphabet mixes the characters the patterns care about.
var preRefAlphabet = []rune("aZ9<>IMG:ΩKµ|。…١ '\t\r\n/.,!sStTdDlLmM½²é\u0301Åǅʰあ中한ッ\u3000\u00a0\u2028😀_-$+<=>^~|`")

func randomPreString(r *rand.Rand) string {
	n := r.Intn(24)
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = preRefAlphabet[r.Intn(len(preRefAlphabet))]
	}
	return string(rs)
}

func checkPreRef(t *testing.T, s string) {
	for _, ref := range preRefs {
		split, err := PreTokenizer(ref.name)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := split(s), refSplit(s, compileRef(t, ref.alts)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s %q:\n got %q\nwant %q", ref.name, s, got, want)
		}
	}
	dv3 := []preSplit{{stage: preMatchStage{preMatchDeepseekV3}}}
	if got, want := preSplitWords(s, dv3), refSplit(s, compileRef(t, preRefDeepseekV3)); !reflect.DeepEqual(got, want) {
		t.Fatalf("deepseek-v3 words %q:\n got %q\nwant %q", s, got, want)
	}
}

func TestPreVsRegexp(t *testing.T) {
	for _, s := range preSeeds {
		if utf8.ValidString(s) {
			checkPreRef(t, s)
		}
	}
	r := rand.New(rand.NewSource(1))
	n := 20000
	if testing.Short() {
		n = 3000
	}
	for i := 0; i < n; i++ {
		checkPreRef(t, randomPreString(r))
	}
	checkPreRef(t, strings.Repeat("ab ", 50))
}

func FuzzPreVsRegexp(f *testing.F) {
	for _, s := range preSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		checkPreRef(t, s)
	})
}

// Multi-stage families: every stage but the look-ahead ones (checked
// above) is a plain regexp; the reference cuts each piece at every match,
// one stage after another.

type refStage struct {
	re *regexp.Regexp // nil: use m
	m  preMatcher
}

func classOf(t *unicode.RangeTable) string {
	var sb strings.Builder
	for _, r := range t.R16 {
		fmt.Fprintf(&sb, `\x{%X}-\x{%X}`, r.Lo, r.Hi)
	}
	for _, r := range t.R32 {
		fmt.Fprintf(&sb, `\x{%X}-\x{%X}`, r.Lo, r.Hi)
	}
	return sb.String()
}

func refStages(name string) []refStage {
	re := func(p string) refStage { return refStage{re: regexp.MustCompile(hfTranslateRegex(p))} }
	gpt2 := refStage{m: preMatchGPT2}
	poro := re(` ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+`)
	cjk := re(`[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+`)
	switch name {
	case "deepseek-llm":
		return []refStage{re(`[\r\n]`), re(`\s?[` + classOf(preDeepseekLettersTable) + `]+`),
			re(`\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+`), re(`\s+$`), cjk, re(`\p{N}+`)}
	case "deepseek-coder":
		return []refStage{re(`[\r\n]`), re(`\s?\p{L}+`), re(`\s?\p{P}+`), cjk, re(`\p{N}`)}
	case "deepseek-v3":
		return []refStage{re(`\p{N}{1,3}`), re(`[\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+`), {m: preMatchDeepseekV3}}
	case "falcon":
		return []refStage{re("[\\p{P}\\$\\+<=>\\^~\\|`]+"), gpt2, re(`[0-9][0-9][0-9]`)}
	case "default":
		return []refStage{re(`[\p{P}\$\+<=>\^~\|]+`), gpt2, re(`\p{N}+`), re(`[0-9][0-9][0-9]`)}
	case "starcoder":
		return []refStage{re(`\p{N}`), gpt2}
	case "poro-chat":
		return []refStage{poro}
	case "viking":
		return []refStage{poro, re(`\p{N}`)}
	case "chameleon":
		return []refStage{re(`<sentinel:[0-9]+>`), re(`(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z`), re("([\\t\\n]|    |  )"),
			re(`\p{N}`), re("[\\p{P}!-/:-@\\[-`{-~]"), gpt2}
	}
	return nil
}

func refMulti(s string, stages []refStage) []string {
	pieces := []string{s}
	if s == "" {
		return nil
	}
	for _, st := range stages {
		var next []string
		for _, p := range pieces {
			var locs [][]int
			if st.re != nil {
				locs = st.re.FindAllStringIndex(p, -1)
			} else {
				for _, sp := range (preMatchStage{st.m}).find([]rune(p), nil) {
					// rune offsets to byte offsets
					a := len(string([]rune(p)[:sp.a]))
					b := len(string([]rune(p)[:sp.b]))
					locs = append(locs, []int{a, b})
				}
			}
			last := 0
			for _, l := range locs {
				if l[0] == l[1] {
					continue
				}
				if l[0] > last {
					next = append(next, p[last:l[0]])
				}
				next = append(next, p[l[0]:l[1]])
				last = l[1]
			}
			if last < len(p) {
				next = append(next, p[last:])
			}
		}
		pieces = next
	}
	return pieces
}

var refMultiFamilies = []string{"deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon", "default", "starcoder", "poro-chat", "viking", "chameleon"}

func checkPreMulti(t *testing.T, s string) {
	for _, name := range refMultiFamilies {
		split, err := PreTokenizer(name)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := split(s), refMulti(s, refStagesCached(name)); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s %q:\n got %q\nwant %q", name, s, got, want)
		}
	}
}

var refStagesMemo sync.Map

func refStagesCached(name string) []refStage {
	if v, ok := refStagesMemo.Load(name); ok {
		return v.([]refStage)
	}
	st := refStages(name)
	refStagesMemo.Store(name, st)
	return st
}

func TestPreMultiStageVsRegexp(t *testing.T) {
	for _, s := range preSeeds {
		if utf8.ValidString(s) {
			checkPreMulti(t, s)
		}
	}
	r := rand.New(rand.NewSource(2))
	n := 10000
	if testing.Short() {
		n = 2000
	}
	for i := 0; i < n; i++ {
		checkPreMulti(t, randomPreString(r))
	}
}

func FuzzPreMultiStageVsRegexp(f *testing.F) {
	for _, s := range preSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if utf8.ValidString(s) {
			checkPreMulti(t, s)
		}
	})
}
