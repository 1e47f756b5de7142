#!/bin/bash
# RESULTS.md, section 5 (Speed), training steps on one GPU, one run at a time:
#   PART=124m   the 124M step: RoPE (SDPA) vs PoPE with the fused kernel (attn_impl=triton) vs
#               PoPE's PyTorch path (attn_impl=torch); bf16, torch.compile, batch 16 x 1024 tokens,
#               no gradient accumulation, 120 steps (schedule shortened to 120)
#   PART=small  the indirect-indexing model (64 x 51 tokens per step, compiled), 400 steps: PoPE
#               with compile_mode=reduce-overhead and with cuda_graph=True (the whole step as one
#               CUDA graph), RoPE with cuda_graph=True
#   PART="124m small" (the default): both.
# The number is the median ms/step (and tokens/s) of the logged windows after the first ones,
# which hold compilation (124M: windows of 10 steps from iteration 20; small: of 50 from 100),
# as printed by python results/summarize.py into summary.md.
#
# Needs:   1 CUDA GPU (CUDA_VISIBLE_DEVICES picks it; default the first); data/openwebtext (made
#          here if missing from the 1,000-document OpenWebText sample in ../shared/data/text, or
#          set SHARED) and data/indirect_indexing (generated here if missing).
# Time:    H200: about 3 min for 124m (each run ~40 s of compilation), 2 min for small.
# Outputs: results/train_speed/
#          <pe>-<attn_impl>.log, <pe>-<attn_impl>/metrics.jsonl       the 124M runs
#          ii-<pe>-<mode>.log, ii-<pe>-<mode>/metrics.jsonl            the small-model runs
#          summary.md, env.txt   (the checkpoints are deleted; a rerun replaces the runs)
# Settings (environment variables):
#   PART="124m small"
#   DATASET=openwebtext   the 124M runs' dataset under data/ (made here only when it is openwebtext)
#   SHARED=../shared/data   where the source text lives
#   EXTRA="--key=value ..."  appended to every train.py call
set -euo pipefail
cd "$(dirname "$0")/.."
PART=${PART:-124m small}
DATASET=${DATASET:-openwebtext}
SHARED=${SHARED:-../shared/data}
EXTRA=${EXTRA:-}
OUT=results/train_speed
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
source results/setup.sh  # logging, the provenance file $OUT/env.txt
: > $OUT/summary.md

if [[ $PART == *124m* ]]; then
    if [ ! -f data/$DATASET/meta.json ]; then
        [ $DATASET = openwebtext ] || { echo "no data/$DATASET"; exit 1; }
        python prepare/openwebtext.py --input $SHARED/text/owt_sample.jsonl
    fi
    for run in rope-auto pope-triton pope-torch; do
        pe=${run%-*}; impl=${run#*-}
        python train.py config/pope_124m.py --pos_emb=$pe --dataset=$DATASET --attn_impl=$impl --max_iters=120 \
            --lr_decay_iters=120 --warmup_iters=10 --eval_interval=100000 --eval_iters=2 --log_interval=10 \
            --gradient_accumulation_steps=1 --batch_size=16 --always_save_checkpoint=False --overwrite=True \
            --out_dir=$OUT/$run $EXTRA > $OUT/$run.log 2>&1
        rm -f $OUT/$run/ckpt.pt
    done
    python results/summarize.py $OUT/{rope-auto,pope-triton,pope-torch}/metrics.jsonl >> $OUT/summary.md
fi

if [[ $PART == *small* ]]; then
    [ -f data/indirect_indexing/meta.json ] || python prepare/indirect_indexing.py
    for run in ii-pope-reduce-overhead ii-pope-cuda-graph ii-rope-cuda-graph; do
        case $run in
            *reduce-overhead) MODE="--compile_mode=reduce-overhead" ;;
            *)                MODE="--cuda_graph=True" ;;
        esac
        pe=$(echo $run | cut -d- -f2)
        python train.py config/indirect_indexing.py --pos_emb=$pe --compile=True $MODE --max_iters=400 \
            --lr_decay_iters=400 --warmup_iters=16 --eval_interval=100000 --eval_iters=2 --log_interval=50 \
            --always_save_checkpoint=False --overwrite=True --out_dir=$OUT/$run $EXTRA > $OUT/$run.log 2>&1
        rm -f $OUT/$run/ckpt.pt
    done
    echo >> $OUT/summary.md
    python results/summarize.py --skip 100 $OUT/ii-*/metrics.jsonl >> $OUT/summary.md
fi
cat $OUT/summary.md
