#!/bin/bash
# RESULTS.md, sections 3 (length extrapolation) and 4 (language modelling at equal tokens), and
# the 124M memory check of section 5:
#   1. small GPTs (config/english_small.py: 6 layers, 384 wide, context 512, 1,200 steps of
#      32 x 512 tokens), PoPE and RoPE for each seed; one seed means the same batches. PoPE once
#      for each way of keeping delta in [-2pi, 0] in BOUNDS (model.pope_delta), delta from zero
#   2. fine-tunes of the first seed at 4x context, shortened to 100 steps of 8 x 2048 tokens:
#      RoPE with YaRN s = 4 and PoPE without change (config/finetune_long.py, --rope_scaling=4.0 for YaRN)
#   3. eval_extrapolation.py at 512 x 1..10 on the held-out val split (the State of the Union
#      addresses), every RoPE model also with zero-shot YaRN
#      init as in every language config; results/delta_stats.py says how much of delta moved
#   3b. eval_frequencies.py on every pretrained PoPE and RoPE model (the default bound)
#   4. 124M PoPE and RoPE (20 steps: a memory check, not a trained model) evaluated at 1024..10240
#      tokens, one window per forward pass: peak memory against length
#
# Needs:   1-2 CUDA GPUs (pretraining runs spread over CUDA_VISIBLE_DEVICES, default: all; side by
#          side on one); the English text in ../shared/data/text (or set SHARED): data/english is
#          made here if missing (the command in config/english_small.py).
# Time:    H200: about 15 min on one GPU for three seeds and three BOUNDS (12 pretraining runs side by side).
# Outputs: results/lm/
#          seed<S>-<pe>.log, seed<S>-<pe>/metrics.jsonl     pretraining (ckpt.pt beside: the final checkpoint);
#                                                           seed<S>-pope is the default bound (wrap), seed<S>-pope-<bound> the others
#          delta.md                                         how far delta moved from its zero init, per PoPE model
#          seed<S>-pope-ft.*, seed<S>-rope-yarn-ft.*         the fine-tunes of the first seed
#          extrapolation.log / .json / .png                 perplexity against context length, NLL by position
#          frequencies.log / .json / .png                   frequency usage per layer and channel (3b)
#          memory-124m.log / .json                          the 124M memory check (its checkpoints are deleted)
#          env.txt
# Settings (environment variables):
#   SEEDS="1337 1338 1339"  pretraining seeds (RESULTS.md: these three); the first is fine-tuned
#   BOUNDS="wrap clamp project"  PoPE's delta bounds to pretrain (wrap, the default, is the one fine-tuned)
#   SHARED=../shared/data   where the source text lives
#   EXTRA="--key=value ..."  appended to every train.py call
#   EVAL_EXTRA="--option ..."  appended to both eval_extrapolation.py calls
# A run whose log reaches its last step is kept, so the script can be stopped and run again: an
# unfinished pretraining run resumes from its last checkpoint (saved every 100 steps), an
# unfinished fine-tune starts again. Delete $OUT/<run>.log and $OUT/<run>/ to redo a run.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-1337 1338 1339}
BOUNDS=${BOUNDS:-wrap clamp project}
SHARED=${SHARED:-../shared/data}
EXTRA=${EXTRA:-}
EVAL_EXTRA=${EVAL_EXTRA:-}
OUT=results/lm
source results/setup.sh  # GPU list, logging, $OUT/env.txt
finished() { grep -q "^step $2:" "$OUT/$1.log" 2>/dev/null; }  # run name, its last step

if [ ! -f data/english/meta.json ]; then
    T=$SHARED/text
    python prepare/openwebtext.py --out_dir data/english --input $T/owt_sample.jsonl \
        $T/english/{abc,brown,inaugural,movie_reviews,tinyshakespeare,webtext}.txt \
        --val_input $T/english/state_union.txt
fi

# 1. pretraining, the i-th run on the i-th GPU (round robin)
i=0; pids=(); CKPTS=(); LABELS=()
for s in $SEEDS; do
    for v in $BOUNDS rope; do
        case $v in
            rope) run=seed$s-rope; args=--pos_emb=rope; label=RoPE-s$s ;;
            wrap) run=seed$s-pope; args="--pos_emb=pope --pope_delta_bound=wrap"; label=PoPE-s$s ;;
            *)    run=seed$s-pope-$v; args="--pos_emb=pope --pope_delta_bound=$v"; label=PoPE-$v-s$s ;;
        esac
        CKPTS+=($OUT/$run/ckpt.pt); LABELS+=($label)
        finished $run 1200 && continue
        how=$(start_flag $OUT/$run)
        CUDA_VISIBLE_DEVICES=${GPU[i % ${#GPU[@]}]} python train.py config/english_small.py $args \
            --seed=$s --out_dir=$OUT/$run $how $EXTRA >> $OUT/$run.log 2>&1 &
        pids+=($!); i=$((i + 1))
    done
done
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a training run failed: see the logs in $OUT"; exit 1; }

# 2. fine-tunes of the first seed at 4x context (2048), side by side
s=${SEEDS%% *}
FT="--block_size=2048 --batch_size=8 --gradient_accumulation_steps=1 --max_iters=100 --eval_interval=50
    --eval_iters=20 --log_interval=10 --compile=True --dataset=english --always_save_checkpoint=True"
pids=()
finished seed$s-rope-yarn-ft 100 || {
    CUDA_VISIBLE_DEVICES=${GPU[0]} python train.py config/finetune_long.py --init_from=$OUT/seed$s-rope/ckpt.pt \
        --out_dir=$OUT/seed$s-rope-yarn-ft --rope_scaling=4.0 $FT --overwrite=True $EXTRA > $OUT/seed$s-rope-yarn-ft.log 2>&1 &
    pids+=($!); }
finished seed$s-pope-ft 100 || {
    CUDA_VISIBLE_DEVICES=${GPU[1 % ${#GPU[@]}]} python train.py config/finetune_long.py --init_from=$OUT/seed$s-pope/ckpt.pt \
        --out_dir=$OUT/seed$s-pope-ft $FT --overwrite=True $EXTRA > $OUT/seed$s-pope-ft.log 2>&1 &
    pids+=($!); }
fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
[ $fail = 0 ] || { echo "a fine-tune failed: see $OUT/seed$s-*-ft.log"; exit 1; }
CKPTS+=($OUT/seed$s-pope-ft/ckpt.pt $OUT/seed$s-rope-yarn-ft/ckpt.pt); LABELS+=(PoPE+ft-s$s RoPE+YaRN-ft-s$s)

python results/delta_stats.py $OUT/seed*-pope*/ckpt.pt | tee $OUT/delta.md

# 3. perplexity against context length, 512 x 1..10 (--yarn adds zero-shot YaRN to every RoPE model)
CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_extrapolation.py --data data/english/val.bin --yarn --no_progress \
    --ckpt "${CKPTS[@]}" --labels $(IFS=,; echo "${LABELS[*]}") \
    --json $OUT/extrapolation.json --plot $OUT/extrapolation.png $EVAL_EXTRA 2>&1 | tee $OUT/extrapolation.log

# 3b. which positional frequencies the pretrained PoPE and RoPE models use (RESULTS.md, frequency usage)
FREQ=(); for s in $SEEDS; do FREQ+=($OUT/seed$s-pope/ckpt.pt $OUT/seed$s-rope/ckpt.pt); done
CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_frequencies.py --data data/english/val.bin --ckpt "${FREQ[@]}" --no_progress \
    --json $OUT/frequencies.json --plot $OUT/frequencies.png 2>&1 | tee $OUT/frequencies.log

# 4. 124M at 10x its 1024-token context: peak memory is linear in T (no T x T attention tensor)
M124="--dataset=english --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 --eval_interval=20 --eval_iters=2
      --compile=False --always_save_checkpoint=True --overwrite=True"  # a rerun replaces these
for pe in pope rope; do
    CUDA_VISIBLE_DEVICES=${GPU[0]} python train.py config/pope_124m.py --pos_emb=$pe --out_dir=$OUT/memory-124m-$pe $M124 $EXTRA \
        > $OUT/memory-124m-$pe.log 2>&1
done
CUDA_VISIBLE_DEVICES=${GPU[0]} python eval_extrapolation.py --data data/english/val.bin --no_progress \
    --lengths=1024,2048,4096,8192,10240 --max_tokens=20480 --batch_size=1 \
    --ckpt $OUT/memory-124m-pope/ckpt.pt $OUT/memory-124m-rope/ckpt.pt --labels PoPE-124M,RoPE-124M \
    --json $OUT/memory-124m.json $EVAL_EXTRA 2>&1 | tee $OUT/memory-124m.log
rm -f $OUT/memory-124m-*/ckpt.pt
