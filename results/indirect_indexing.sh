#!/bin/bash
# RESULTS.md, section 1 (indirect indexing): the paper's task, model and schedule
# (config/indirect_indexing.py: 8 layers, 512 wide, 100k steps of 64 examples), PoPE, RoPE and
# NoPE, then loss and accuracy of the final checkpoint on the whole val and test splits.
#
# Needs:   1-2 CUDA GPUs; runs are spread over the GPUs of CUDA_VISIBLE_DEVICES (default: all),
#          round robin, several side by side on one. The data is generated here if missing
#          (python prepare/indirect_indexing.py, a few seconds).
# Time:    H200, the whole step as one CUDA graph (cuda_graph=True, ~4 ms/step alone): about
#          8 min for one 100k-step run alone on a GPU. Runs side by side share it and gain
#          little: four on one H200 under CUDA MPS took 12.7-13.8 ms/step each (about 1.2x
#          the steps per second of one run alone; results/indirect_indexing/all/*.log).
# Outputs: results/indirect_indexing/<OBJECTIVE>[-<VARIANT>][-<LABEL>]/
#          seed<S>-<pe>.log            the training log (train loss every 100 steps, val every 2000)
#          seed<S>-<pe>/metrics.jsonl  the same as JSON lines (ckpt.pt beside it: the last checkpoint)
#          seed<S>-<pe>/eval.json      val and test loss and accuracy over the whole splits
#          seed<S>-<pe>-test.log       that evaluation's output
#          frequencies-seed<S..>-<pe..>.{json,png,log}   eval_frequencies.py over this call's checkpoints
#          env-seed<S..>-<pe..>.txt    the provenance (results/setup.sh)
#          git keeps each run's .log and eval.json, the env file and the frequency JSON after
#          python results/summarize.py --slim (results/indirect_indexing/README.md)
# Settings (environment variables):
#   OBJECTIVE=target  the training loss on the target letter only (train_mask=True), or
#             all     on every token of the training rows (train_mask=False); the eval always
#                     scores the target letter
#   VARIANT=""        the paper's format; shift_token (the shift as one of 31 tokens) or
#                     question_first (source letter and shift before the string): see
#                     python prepare/indirect_indexing.py --help
#   SEEDS="1337"      seeds, one run per pos_emb each
#   POS_EMBS="pope rope none"
#   STEPS=100000      another N compresses the schedule to N steps (warmup N/25, eval every N/10;
#                     run folders seed<S>-<pe>-<N>steps)
#   EXTRA="--key=value ..."  appended to every train.py call
#   LABEL=""          names a setting of EXTRA: the runs go to <OBJECTIVE>[-<VARIANT>]-<LABEL>/ (e.g.
#                     LABEL=wd0 EXTRA="--weight_decay=0"), so they never mix with the default's runs
#   RESULTS=results/indirect_indexing   where the run folders go
# A run with an eval.json is kept; one with a checkpoint short of its last step is resumed
# (train.py resumes exactly), one without a checkpoint is started again. So the script can be
# stopped and run again.
set -euo pipefail
cd "$(dirname "$0")/.."
OBJECTIVE=${OBJECTIVE:-target}
VARIANT=${VARIANT:-}
SEEDS=${SEEDS:-1337}
POS_EMBS=${POS_EMBS:-pope rope none}
STEPS=${STEPS:-100000}
EXTRA=${EXTRA:-}
LABEL=${LABEL:-}
[ -z "$EXTRA" ] || [ -n "$LABEL" ] || { echo "EXTRA changes the runs: name the setting with LABEL=... (their folder)"; exit 1; }
RESULTS=${RESULTS:-results/indirect_indexing}
case $OBJECTIVE in
    target) MASK=True ;;
    all)    MASK=False ;;
    *)      echo "OBJECTIVE must be target or all, got $OBJECTIVE"; exit 1 ;;
esac
case $VARIANT in
    "")             DATASET=indirect_indexing; PREP="" ;;
    shift_token)    DATASET=indirect_indexing_shift_token; PREP="--shift_format token" ;;
    question_first) DATASET=indirect_indexing_question_first; PREP="--order question_first" ;;
    *)              echo "VARIANT must be empty, shift_token or question_first, got $VARIANT"; exit 1 ;;
esac
OUT=$RESULTS/$OBJECTIVE${VARIANT:+-$VARIANT}${LABEL:+-$LABEL}
ENV_TXT=${ENV_TXT:-$OUT/env-seed$(echo $SEEDS | tr " " _)-$(echo $POS_EMBS | tr " " _).txt}
source results/setup.sh  # GPU list, logging, the provenance file $ENV_TXT

[ -f data/$DATASET/meta.json ] || python prepare/indirect_indexing.py $PREP --out_dir data/$DATASET

if [ "$STEPS" = 100000 ]; then
    SCHEDULE="--always_save_checkpoint=True"  # the config's schedule; a checkpoint at every eval, the last is tested
    TAG=""
else
    SCHEDULE="--max_iters=$STEPS --lr_decay_iters=$STEPS --warmup_iters=$((STEPS / 25)) --eval_interval=$((STEPS / 10)) --always_save_checkpoint=True"
    TAG=-${STEPS}steps
fi

# train: the i-th run on the i-th GPU (round robin). One seed means the same batches for every pos_emb.
i=0; pids=()
for s in $SEEDS; do
    for pe in $POS_EMBS; do
        run=seed$s-$pe$TAG
        [ -f $OUT/$run/eval.json ] && continue
        START=$(start_flag $OUT/$run)
        CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} python train.py config/indirect_indexing.py \
            --dataset=$DATASET --train_mask=$MASK --pos_emb=$pe --seed=$s --out_dir=$OUT/$run \
            --compile=True --cuda_graph=True $SCHEDULE $START $EXTRA >> $OUT/$run.log 2>&1 &
        pids+=($!); i=$((i + 1))
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a training run failed: see the logs in $OUT"; exit 1; }

# evaluate each checkpoint on the whole val and test splits (the run's config comes from the checkpoint)
for s in $SEEDS; do
    for pe in $POS_EMBS; do
        run=seed$s-$pe$TAG
        [ -f $OUT/$run/eval.json ] && continue
        CUDA_VISIBLE_DEVICES=${GPU[0]} python train.py --out_dir=$OUT/$run --init_from=resume --eval_only=True \
            --eval_full=True --eval_splits=val,test --compile=False > $OUT/$run-test.log 2>&1
    done
done

# which positional frequencies the trained models use (eval_frequencies.py), over the runs of this call whose
# checkpoint is here, on the first 65,536 tokens of the test split (a window per 52-token row, as train.py reads it)
FREQ=(); for s in $SEEDS; do for pe in $POS_EMBS; do
    [ -f $OUT/seed$s-$pe$TAG/ckpt.pt ] && FREQ+=($OUT/seed$s-$pe$TAG/ckpt.pt); done; done
NAME=frequencies$TAG-seed$(echo $SEEDS | tr ' ' _)-$(echo $POS_EMBS | tr ' ' _)
[ ${#FREQ[@]} = 0 ] || CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_frequencies.py --data data/$DATASET/test.bin \
    --ckpt "${FREQ[@]}" --no_progress --json $OUT/$NAME.json --plot $OUT/$NAME.png > $OUT/$NAME.log 2>&1
