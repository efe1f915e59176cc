#!/bin/sh
# Regenerates the embedding goldens with llama.cpp's llama-embedding (see
# README.md). Usage: make.sh LLAMA_CPP_DIR SHARED_DIR MODELS_DIR
# MODELS_DIR holds b-mean.gguf and b-cls.gguf as the test writes them
# (PAGODA_EMBED_WRITE=DIR go test ./engine -run TestEmbedGoldens).
set -e
LL=$1; SHARED=$2; MODELS=$3
here=$(cd "$(dirname "$0")" && pwd)
commit=$(git -C "$LL" rev-parse HEAD)
texts='the cat sat on the mat.
Once upon a time, Lily played with her big red ball in the park!
she was happy
tom and ben ran to the house, because the sun was hot; mom said: "come in".'
run() { # name model pooling
	out="$here/$1.json"
	# llama.cpp's logger writes stdout from a thread of its own, and now
	# and then the process exits before it has written everything: run
	# again until the output is whole (the parser checks it).
	for try in 1 2 3 4 5 6 7 8 9 10; do
		"$LL/build/bin/llama-embedding" -m "$2" -p "$texts" --pooling "$3" --embd-normalize -1 \
			--embd-output-format json -t 1 --no-repack --verbose-prompt >"$out.raw" 2>/dev/null
		tail -c 40 "$out.raw" | tr -d ' \n' | grep -q ']}]}$' && break
	done
	python3 - "$out.raw" "$1" "$2" "$3" "$commit" "$texts" <<'PY'
import json, re, sys, hashlib, gzip, os
raw, name, model, pooling, commit, texts = sys.argv[1:]
s = open(raw).read()
i = s.index('\n{')
tok_part, js = s[:i], json.loads(s[i:])
seqs, cur = [], []
for line in tok_part.split('\n'):
    m = re.match(r'^\s*(\d+) -> ', line)
    if m:
        cur.append(int(m.group(1)))
    elif cur and line.strip() == '':
        seqs.append(cur); cur = []
if cur: seqs.append(cur)
texts = texts.split('\n')
assert len(seqs) == len(texts) == len(js['data']), (len(seqs), len(texts))
out = {'llama_cpp_commit': commit,
       'command': 'llama-embedding -m %s -p <inputs joined by newlines> --pooling %s --embd-normalize -1 --embd-output-format json -t 1 --no-repack --verbose-prompt' % (os.path.basename(model), pooling),
       'model': os.path.basename(model), 'model_sha256': hashlib.sha256(open(model, 'rb').read()).hexdigest(),
       'pooling': pooling,
       'inputs': [{'text': t, 'tokens': q, 'embedding': d['embedding']} for t, q, d in zip(texts, seqs, js['data'])]}
with gzip.open(raw[:-4] + '.gz', 'wt') as f:
    json.dump(out, f, separators=(',', ':'))
os.remove(raw)
PY
}
run bert-mean "$MODELS/b-mean.gguf" mean
run bert-cls "$MODELS/b-cls.gguf" cls
run bert-q8-mean "$MODELS/b-q8.gguf" mean
run bert-f16-cls "$MODELS/b-f16.gguf" cls
run llama-gqa-mean "$SHARED/golden/models/g-llama-gqa.F32.gguf" mean
run llama-gqa-last "$SHARED/golden/models/g-llama-gqa.F32.gguf" last
run qwen3-last "$SHARED/golden/models/g-qwen3.F32.gguf" last
run deepseek2-lite-mean "$SHARED/golden/models/g-deepseek2-lite.F32.gguf" mean
run qwen3moe-last "$SHARED/golden/models/g-qwen3moe.F32.gguf" last
