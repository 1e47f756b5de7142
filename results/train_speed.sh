#!/bin/bash
# The small model's training step (not in RESULTS.md: its runs are in git at 26efb57, results/train_speed/):
# the indirect-indexing model (64 x 51 tokens a step,
# compiled), 400 steps: PoPE and RoPE with cuda_graph=True (the whole step as one CUDA graph); one run
# at a time. (train.py's compile_mode=reduce-overhead, timed beside it at 26efb57, is gone: cuda_graph is
# its one flag.) The 124M step: bench.py train (bench.sh).
# The number is the median ms/step of the logged windows of 50 steps from step 100 (before: compilation).
#
# Needs:   1 CUDA GPU (CUDA_VISIBLE_DEVICES picks it; default the first); data/indirect_indexing
#          (generated here if missing).
# Time:    H200: about 2 min.
# Outputs: results/train_speed/ii-<pe>-cuda-graph.log, ii-<pe>-cuda-graph/metrics.jsonl, env.txt
#          (the checkpoints are deleted; a rerun replaces the runs)
# Settings (environment variables):
#   EXTRA="--key=value ..."  appended to every train.py call
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=${EXTRA:-}
OUT=results/train_speed
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
source results/setup.sh  # logging, the provenance file $OUT/env.txt

[ -f data/indirect_indexing/meta.json ] || python prepare/indirect_indexing.py
for pe in pope rope; do
    run=ii-$pe-cuda-graph
    python train.py config/indirect_indexing.py --pos_emb=$pe --compile=True --cuda_graph=True \
        --max_iters=400 --lr_decay_iters=400 --warmup_iters=16 --eval_interval=100000 --eval_iters=2 \
        --log_interval=50 --always_save_checkpoint=False --overwrite=True --out_dir=$OUT/$run $EXTRA > $OUT/$run.log 2>&1
    rm -f $OUT/$run/ckpt.pt
done
