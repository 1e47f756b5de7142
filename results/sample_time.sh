#!/bin/bash
# sample.py's time to a sample (RESULTS.md §5, results/sample/time-to-sample/): wall time of a fresh
# process for 3 x 500 tokens from a random-weight 124M PoPE checkpoint, with empty caches (cold), then
# twice warm, for the sample.py in folder $1 (default: this checkout); $2 names the series (a
# commit) in sampletime.txt. Then (unless DECODE=0) eager against graph decoding at 100 and 1000 new
# tokens, warm, in sampledecode.txt. Provenance: env-$2.txt (results/setup.sh).
# Needs: a CUDA GPU. DEVARG=--device=cuda:0 for a sample.py that needs an index.
set -u
cd "$(dirname "$0")/.."
code=${1:-.}; name=${2:-new}; out=${OUT:-results/sample/time-to-sample}
ckpt=$PWD/out-time/ckpt.pt
OUT=$out ENV_TXT=$out/env-$name.txt source results/setup.sh
python - <<'PY'
import os
import torch
from model import GPT, GPTConfig
args = dict(block_size=1024, vocab_size=50304, n_layer=12, n_head=12, n_embd=768, pos_emb="pope")
torch.manual_seed(0)
os.makedirs("out-time", exist_ok=True)
meta = {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16"}
torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "meta": meta,
            "config": {}}, "out-time/ckpt.pt")
PY
# cold: no Triton, Inductor or Python bytecode cache (the GPU machines' torch has no .pyc files: a
# process compiles the sources it imports, as a read-only install does); warm: all three filled
export TRITON_CACHE_DIR=/tmp/triton-$name TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$name
export PYTHONPYCACHEPREFIX=/tmp/pycache-$name
rm -rf $TRITON_CACHE_DIR $TORCHINDUCTOR_CACHE_DIR $PYTHONPYCACHEPREFIX
err=$(mktemp)  # each call's stderr, whose last three lines the printout keeps
timed() {  # $1: the printout's label; the rest: sample.py's arguments
    local label=$1
    shift
    local start=$(date +%s.%N)
    (cd $code && python sample.py --ckpt=$ckpt --start="The meaning of life" --num_samples=3 \
        "$@" ${DEVARG:-} > /dev/null 2> $err)
    local rc=$?
    local end=$(date +%s.%N)
    echo "$label rc=$rc wall=$(python -c "print(round($end - $start, 2))") s"
    tail -3 $err
}
for run in cold warm warm2; do
    timed "$name $run" --max_new_tokens=500
done | tee -a $out/sampletime.txt
if [ "${DECODE:-1}" = 1 ]; then
    for n in 100 1000; do
        for decode in eager graph; do
            timed "$decode n=$n" --max_new_tokens=$n --decode=$decode
        done
    done | tee -a $out/sampledecode.txt
fi
