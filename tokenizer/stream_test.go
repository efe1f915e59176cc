package tokenizer

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"pagoda/testutil"
)

// refDecode is an independent statement of what Decode and Stream must
// produce: all token bytes joined, the first piece's leading space dropped
// (dummy-prefix vocabularies), and each byte of invalid UTF-8 shown as U+FFFD.
func refDecode(tok Tokenizer, ids []int32) string {
	var all []byte
	first := true
	for _, id := range ids {
		b := tok.TokenBytes(id)
		if len(b) == 0 {
			continue
		}
		if first && tok.Vocab().AddSpacePrefix && b[0] == ' ' {
			b = b[1:]
		}
		first = false
		all = append(all, b...)
	}
	var sb strings.Builder
	for _, r := range string(all) {
		sb.WriteRune(r)
	}
	return sb.String()
}

func streamAll(tok Tokenizer, ids []int32) (string, bool) {
	s := NewStream(tok)
	var sb strings.Builder
	valid := true
	for _, id := range ids {
		chunk := s.Add(id)
		valid = valid && utf8.ValidString(chunk)
		sb.WriteString(chunk)
	}
	tail := s.Flush()
	valid = valid && utf8.ValidString(tail)
	sb.WriteString(tail)
	return sb.String(), valid
}

func TestStreamRandom(t *testing.T) {
	tok := llama2Tokenizer(t)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", " ", "é", "ж", "中", "文", "😀", "🙂", "\n", "ﬁ", "𝔘", "Hello", " world", "₿", "ő"}
	v := tok.Vocab()
	for iter := 0; iter < 300; iter++ {
		var ids []int32
		if iter%3 == 2 {
			// Arbitrary token soup: byte-fallback tokens that may not form
			// valid UTF-8, control tokens, normal tokens.
			n := rng.IntN(40)
			for range n {
				switch rng.IntN(3) {
				case 0:
					ids = append(ids, int32(3+rng.IntN(256)))
				case 1:
					ids = append(ids, int32(rng.IntN(v.Size())))
				default:
					ids = append(ids, int32(rng.IntN(3)))
				}
			}
		} else {
			var sb strings.Builder
			for range rng.IntN(30) {
				sb.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			text := sb.String()
			ids = tok.Encode(text, Options{AddSpecial: iter%2 == 0})
			if got := tok.Decode(ids); got != text {
				t.Fatalf("Decode(Encode(%q)) = %q", text, got)
			}
		}
		got, valid := streamAll(tok, ids)
		if !valid {
			t.Fatalf("ids %v: stream emitted invalid UTF-8", ids)
		}
		if want := refDecode(tok, ids); got != want {
			t.Fatalf("ids %v: stream %q, want %q", ids, got, want)
		}
		if dec := tok.Decode(ids); got != dec {
			t.Fatalf("ids %v: stream %q, Decode %q", ids, got, dec)
		}
	}
}

func TestStreamHoldsPartialUTF8(t *testing.T) {
	tok := llama2Tokenizer(t)
	// "😀" is not a Llama-2 token: it is spelled with four byte tokens.
	ids := tok.Encode("😀!", Options{})
	s := NewStream(tok)
	var outs []string
	for _, id := range ids {
		outs = append(outs, s.Add(id))
	}
	outs = append(outs, s.Flush())
	joined := strings.Join(outs, "")
	if joined != "😀!" {
		t.Fatalf("stream gave %q (chunks %q), want %q", joined, outs, "😀!")
	}
	for _, o := range outs[:len(outs)-1] {
		if o != "" && o != "😀" && o != "😀!" && o != "!" {
			t.Errorf("unexpected chunk %q in %q", o, outs)
		}
	}
	// An unfinished character at the end becomes U+FFFD per byte.
	s = NewStream(tok)
	if got := s.Add(3 + 0xF0); got != "" {
		t.Errorf("lead byte alone emitted %q", got)
	}
	if got := s.Add(3 + 0x9F); got != "" {
		t.Errorf("two bytes of four emitted %q", got)
	}
	if got := s.Flush(); got != "\uFFFD\uFFFD" {
		t.Errorf("Flush = %q, want two U+FFFD", got)
	}
}

func warAndPeace(t testing.TB) string {
	b, err := os.ReadFile(testutil.Shared(t, "models/ollama/tokenizer-testdata/war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWarAndPeaceRoundTrip(t *testing.T) {
	tok := llama2Tokenizer(t)
	text := warAndPeace(t)
	if testing.Short() {
		text = strings.ToValidUTF8(text[:200_000], "")
	}
	ids := tok.Encode(text, Options{AddSpecial: true})
	if got := tok.Decode(ids); got != text {
		i := 0
		for i < len(got) && i < len(text) && got[i] == text[i] {
			i++
		}
		t.Fatalf("round trip differs at byte %d: got %q, want %q", i, got[i:min(i+40, len(got))], text[i:min(i+40, len(text))])
	}
	if len(ids) < len(text)/8 || len(ids) > len(text)/2 {
		t.Errorf("%d tokens for %d bytes: implausible", len(ids), len(text))
	}
}

func BenchmarkSPMEncode1MB(b *testing.B) {
	tok := llama2Tokenizer(b)
	text := strings.ToValidUTF8(warAndPeace(b)[:1<<20], "")
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, Options{})
	}
}

// TestStreamOtherTokenizers: Stream agrees with Decode for the byte-level
// BPE and WordPiece vocabularies too, token by token.
func TestStreamOtherTokenizers(t *testing.T) {
	for _, name := range []string{"ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-bert-bge.gguf", "ggml-vocab-phi-3.gguf"} {
		t.Run(name, func(t *testing.T) {
			tok := loadGGUF(t, name)
			texts, _ := vocabCases(t, "ggml-vocab-llama-spm.gguf")
			for _, text := range texts {
				ids := tok.Encode(text, Options{AddSpecial: true})
				got, valid := streamAll(tok, ids)
				if !valid {
					t.Errorf("%q: stream emitted invalid UTF-8", text)
				}
				if dec := tok.Decode(ids); got != dec {
					t.Errorf("%q: stream %q, Decode %q", text, got, dec)
				}
			}
		})
	}
}
