#!/bin/bash
# RESULTS.md, section 1 (indirect indexing): the paper's task, model and schedule
# (config/indirect_indexing.py: 8 layers, 512 wide, 100k steps of 64 examples), PoPE and
# RoPE, then loss and accuracy of the final checkpoint on the whole val and test splits.
#
# Needs:   1-2 CUDA GPUs; runs are spread over the GPUs of CUDA_VISIBLE_DEVICES (default: all),
#          one run per GPU, or side by side on one. The data is generated here if missing
#          (python prepare/indirect_indexing.py, a few seconds).
# Time:    H200, the whole step as one CUDA graph (cuda_graph=True, ~4 ms/step): about 10 min
#          for PoPE and RoPE of one seed on 2 GPUs (one run each); more than twice that on one.
# Outputs: results/indirect_indexing/
#          seed<S>-<pe>.log            the training log (train loss every 100 steps, val every 2000)
#          seed<S>-<pe>/metrics.jsonl  the same as JSON lines (ckpt.pt beside it: the final checkpoint)
#          seed<S>-<pe>/eval.json      val and test loss and accuracy over the whole splits
#          seed<S>-<pe>-test.log       that evaluation's output
#          summary.md                  python results/summarize.py over the eval.json files
#          env.txt                     date, GPUs, driver, torch and triton versions
# Settings (environment variables):
#   SEEDS="1337"      seeds, one PoPE and one RoPE run each
#   POS_EMBS="pope rope"   add "none" for NoPE
#   STEPS=100000      another N compresses the schedule to N steps (warmup N/25, eval every N/10,
#                     the best-val checkpoint is tested; run folders seed<S>-<pe>-<N>steps)
#   EXTRA="--key=value ..."  appended to every train.py call
# train.py will not start a new run in a folder that holds ckpt.pt or metrics.jsonl, as the
# measured runs kept here do (seeds 1337, 1338): pick other SEEDS, delete the folder, or pass
# EXTRA=--overwrite=True.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-1337}
POS_EMBS=${POS_EMBS:-pope rope}
STEPS=${STEPS:-100000}
EXTRA=${EXTRA:-}
OUT=results/indirect_indexing
source results/setup.sh  # GPU list, logging, $OUT/env.txt

[ -f data/indirect_indexing/meta.json ] || python prepare/indirect_indexing.py

if [ "$STEPS" = 100000 ]; then
    SCHEDULE="--always_save_checkpoint=True"  # the config's schedule; a checkpoint at every eval, the last is tested
    TAG=""
else
    SCHEDULE="--max_iters=$STEPS --lr_decay_iters=$STEPS --warmup_iters=$((STEPS / 25)) --eval_interval=$((STEPS / 10))"
    TAG=-${STEPS}steps
fi

# train: the i-th run on the i-th GPU (round robin). One seed means the same batches for every pos_emb.
i=0; pids=()
for s in $SEEDS; do
    for pe in $POS_EMBS; do
        run=seed$s-$pe$TAG
        CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} python train.py config/indirect_indexing.py \
            --pos_emb=$pe --seed=$s --out_dir=$OUT/$run --compile=True --cuda_graph=True \
            $SCHEDULE $EXTRA > $OUT/$run.log 2>&1 &
        pids+=($!); i=$((i + 1))
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a training run failed: see the logs in $OUT"; exit 1; }

# evaluate each checkpoint on the whole val and test splits (the run's config comes from the checkpoint)
for s in $SEEDS; do
    for pe in $POS_EMBS; do
        run=seed$s-$pe$TAG
        CUDA_VISIBLE_DEVICES=${GPU[0]} python train.py --out_dir=$OUT/$run --init_from=resume --eval_only=True \
            --eval_full=True --eval_splits=val,test --compile=False $EXTRA > $OUT/$run-test.log 2>&1
    done
done
python results/summarize.py $OUT/seed*/eval.json | tee $OUT/summary.md
