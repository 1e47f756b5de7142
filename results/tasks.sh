#!/bin/bash
# RESULTS.md, section 2 (JSB Chorales): the paper's model, our 1k-step schedule (config/jsb.py),
# PoPE and RoPE for each seed, then the NLL per scored token and the accuracy on the whole val and
# test splits, at the best-val checkpoint (val every 50 steps).
#
# Needs:   1-2 CUDA GPUs (runs spread over CUDA_VISIBLE_DEVICES, default: all; side by side on one);
#          Jsb16thSeparated.json (../shared/data/music/, or set SHARED); data/jsb is made if missing.
#          data/maestro is made from the MIDI folder (SHARED/music/maestro) with miditok; where either
#          is missing, prepare it elsewhere and copy the folder over (the v2.0.0 sample: 183 MB,
#          23 MB as a .tar.xz). data/genome (chr20: 20 MB) needs only SHARED/genome.
# Time:    H200: about 5 min for 3 seeds of JSB (6 runs side by side on one GPU).
# Outputs: results/tasks/
#          <task>-<pe>-<S><TAG>.log             training log
#          <task>-<pe>-<S><TAG>/metrics.jsonl   the same as JSON lines (ckpt.pt: the best-val checkpoint)
#          <task>-<pe>-<S><TAG>/eval.json       val and test NLL and accuracy over the whole splits
#          <task>-<pe>-<S><TAG>-test.log        that evaluation's output
#          <tasks><TAG>-env.txt                 the provenance (results/setup.sh), e.g.
#                                               maestro-genome-short-env.txt for TASKS="maestro genome" TAG=-short
#          git keeps each run's .log and eval.json and the env file (results/tasks/README.md)
# Settings (environment variables):
#   TASKS="jsb"       also "maestro" (needs pip install miditok) and "genome": their configs follow
#                     the paper's models; no run of them is in RESULTS.md, and they take hours
#   SEEDS="1337 1338 1339"   seeds, one PoPE and one RoPE run each
#   POS_EMBS="pope rope"
#   TAG=""            appended to the run names, for runs with other settings (EXTRA)
#   SHARED=../shared/data   where the source data lives
#   EXTRA="--key=value ..."  appended to every train.py call
# A run whose evaluation (<run>/eval.json) exists is kept, so the script can be stopped and run
# again; an unfinished run resumes from its checkpoint (the best-val one where the config keeps
# only that: the steps after it are run again, on the same batches), or starts again without one.
set -euo pipefail
cd "$(dirname "$0")/.."
TASKS=${TASKS:-jsb}
SEEDS=${SEEDS:-1337 1338 1339}
SHARED=${SHARED:-../shared/data}
POS_EMBS=${POS_EMBS:-pope rope}
TAG=${TAG:-}
EXTRA=${EXTRA:-}
OUT=results/tasks
NAME=$(echo $TASKS | tr ' ' -)$TAG  # this call's env file: another call's is kept
ENV_TXT=$OUT/$NAME-env.txt
source results/setup.sh  # GPU list, logging, $ENV_TXT

for task in $TASKS; do
    [ -f data/$task/meta.json ] && continue
    case $task in
        jsb)     python prepare/jsb.py --input $SHARED/music/Jsb16thSeparated.json ;;
        maestro) python prepare/maestro.py --input $SHARED/music/maestro ;;
        genome)  python prepare/genome.py --input $SHARED/genome/chr20.fa.gz ;;
        *)       echo "unknown task $task (jsb, maestro, genome)"; exit 1 ;;
    esac
done

# train: the i-th run on the i-th GPU (round robin); one seed means the same batches for PoPE and RoPE
i=0; pids=()
for task in $TASKS; do
    for s in $SEEDS; do
        for pe in $POS_EMBS; do
            run=$task-$pe-$s$TAG
            [ -f $OUT/$run/eval.json ] && continue
            how=$(start_flag $OUT/$run)
            CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} python train.py config/$task.py --pos_emb=$pe \
                --seed=$s --out_dir=$OUT/$run --compile=True $how $EXTRA >> $OUT/$run.log 2>&1 &
            pids+=($!); i=$((i + 1))
        done
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a training run failed: see the logs in $OUT"; exit 1; }

# evaluate each best-val checkpoint on the whole val and test splits, side by side as the training
# (one after another, the start of each process, torch, CUDA and the checkpoint, would add up)
i=0; pids=()
for task in $TASKS; do
    for s in $SEEDS; do
        for pe in $POS_EMBS; do
            run=$task-$pe-$s$TAG
            [ -f $OUT/$run/eval.json ] && continue
            CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} python train.py --out_dir=$OUT/$run --init_from=resume \
                --eval_only=True --eval_full=True --eval_splits=val,test --compile=False $EXTRA > $OUT/$run-test.log 2>&1 &
            pids+=($!); i=$((i + 1))
        done
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "an evaluation failed: see the <run>-test.log files in $OUT"; exit 1; }
