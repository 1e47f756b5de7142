#!/bin/bash
# RESULTS.md, the code corpus (issue 84): the paper's 124M model on Python source at context 1024
# (config/code_124m.py: 2,000 steps of 64 x 1024 tokens), PoPE and RoPE for each seed; one seed
# means the same batches. Then, on the final checkpoints:
#   1. eval_extrapolation.py on the test split (held-out packages) at 1024 x 1..10, every RoPE
#      model also with zero-shot YaRN (at 1024: the whole split at the training context)
#   2. eval_frequencies.py on the same models (the test split's first 65,536 tokens)
#
# Needs:   1-2 CUDA GPUs (two: PoPE and RoPE side by side; one: one after the other). The corpus in
#          data/code, else built here from the pinned wheels in WHEELS (python prepare/code.py
#          --wheels; without network every wheel must be there: carry the folder) and tiktoken's
#          gpt2 files (offline: TIKTOKEN_CACHE_DIR naming a copy of its cache).
# Time:    a run's step and wall time: results/code/first-call-h200/ (one H200); the evals':
#          results/code/evaltime-h100/ (one H100).
# Outputs: results/code/
#          prepare.log, data-meta.json        the corpus build and its meta.json (packages, sha256,
#                                             tokens per package and split)
#          seed<S>-<pe>.log, seed<S>-<pe>/metrics.jsonl    training (ckpt.pt beside: the last one)
#          extrapolation.log / .json / .png   perplexity against context length, NLL by position
#          frequencies.log / .json / .png     frequency usage per layer and channel
#          env.txt
# Settings (environment variables):
#   SEEDS="1337"          one PoPE and one RoPE run per seed
#   WHEELS=data/code/raw  the folder of the pinned wheels (prepare/code.py's default)
#   MAX_TOKENS=8388608    eval_extrapolation.py's scored tokens per length: the default covers the
#                         whole test split; a smaller one reads its first packages only (by name)
# Each step keeps what it finished, so the script can be stopped (a lease's command limit) and run
# again: a run whose log reaches step 2000 is kept, an unfinished one resumes from its checkpoint
# (every 250 steps); an eval whose output is there is not run again. Delete the outputs to redo one.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-1337}
WHEELS=${WHEELS:-data/code/raw}
MAX_TOKENS=${MAX_TOKENS:-8388608}
LAST=2000  # config/code_124m.py's max_iters
OUT=results/code
source results/setup.sh  # GPU list, logging, $OUT/env.txt
finished() { grep -q "^step $LAST:" "$OUT/$1.log" 2>/dev/null; }

[ -f data/code/meta.json ] || python prepare/code.py --wheels "$WHEELS" 2>&1 \
    | tee $OUT/prepare.log
cp data/code/meta.json $OUT/data-meta.json

# training: with several GPUs the i-th run on the i-th (round robin, side by side), else in turn
i=0; pids=(); CKPTS=(); LABELS=()
for s in $SEEDS; do
    for name in PoPE RoPE; do
        pe=${name,,}; run=seed$s-$pe
        CKPTS+=($OUT/$run/ckpt.pt); LABELS+=($name-s$s)
        finished $run && continue
        how=$(start_flag $OUT/$run)
        cmd=(python train.py config/code_124m.py --pos_emb=$pe --seed=$s --out_dir=$OUT/$run $how)
        if [ ${#GPU[@]} -gt 1 ]; then
            CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} "${cmd[@]}" >> $OUT/$run.log 2>&1 &
            pids+=($!)
        else
            CUDA_VISIBLE_DEVICES=${GPU[0]} "${cmd[@]}" >> $OUT/$run.log 2>&1
        fi
        i=$((i + 1))
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a training run failed: see the logs in $OUT"; exit 1; }

# 1. perplexity against context length on the held-out packages, 1024 x 1..10 (--yarn: +YaRN too)
[ -f $OUT/extrapolation.json ] || CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_extrapolation.py \
    --data data/code/test.bin --yarn --max_tokens $MAX_TOKENS --no_progress --ckpt "${CKPTS[@]}" \
    --labels $(IFS=,; echo "${LABELS[*]}") --json $OUT/extrapolation.json \
    --plot $OUT/extrapolation.png 2>&1 | tee $OUT/extrapolation.log

# 2. which positional frequencies the models use
[ -f $OUT/frequencies.json ] || CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_frequencies.py \
    --data data/code/test.bin --ckpt "${CKPTS[@]}" --no_progress --json $OUT/frequencies.json \
    --plot $OUT/frequencies.png 2>&1 | tee $OUT/frequencies.log  # labels: the runs' folders
