#!/bin/bash
# RESULTS.md, device call 2 (one H200, ~6 minutes): language modelling and length
# extrapolation with small GPTs (config/english_small.py, context 512).
#   1. PoPE and RoPE, seeds 1337 and 1338, four runs side by side on the same data.
#   2. Short fine-tunes at 4x context (2048) of seed 1337: RoPE+YaRN s=4
#      (config/finetune_yarn.py) and PoPE+ft (config/finetune_pope.py), shortened
#      to 100 steps of 8 x 2048 tokens (paper: 500 x 64 x 4096) to suit ~6M tokens.
#   3. eval_extrapolation.py at 512 x 1..10 on the held-out val split, all models,
#      RoPE also with zero-shot YaRN.
#   4. Memory check: 124M PoPE and RoPE models (a few steps, not trained) evaluated at
#      1024..10240 tokens, one window per forward pass.
#
# Usage (repo root):  bash notes/results_lm.sh      # writes $OUT/lm.tgz, extrapolation.json/png
# Env: OUT (default out-results), EXTRA="--key=value ..." appended to every train.py call,
#      SMALL=1 for a CPU dry run (tiny 124M stand-in, short lengths).
# Inputs: data/english (prepare command in config/english_small.py) or .carry/data/english.
set -u
OUT=${OUT:-out-results}
EXTRA=${EXTRA:-}
SMALL=${SMALL:-0}
source notes/device_env.sh
R=/tmp/r-lm
rm -rf "$R"; mkdir -p "$R" "$OUT"
[ -d data/english ] || { mkdir -p data && cp -r .carry/data/english data/; }
write_env "$R/env.txt"

# 1. pretraining, four runs side by side
for pe in pope rope; do
    for seed in 1337 1338; do
        python3 train.py config/english_small.py --pos_emb=$pe --seed=$seed --out_dir=$R/$pe-$seed $EXTRA \
            > "$R/$pe-$seed.log" 2>&1 &
    done
done
wait
echo "pretraining done at $(elapsed)s" | tee -a "$R/plan.txt"

# 2. fine-tunes at 4x context
FT="--block_size=2048 --batch_size=8 --gradient_accumulation_steps=1 --max_iters=100 --eval_interval=50 \
    --eval_iters=20 --log_interval=10 --compile=True --dataset=english --always_save_checkpoint=True"
python3 train.py config/finetune_yarn.py --init_from=$R/rope-1337/ckpt.pt --out_dir=$R/rope-yarn-ft \
    --rope_scaling=4.0 $FT $EXTRA > "$R/rope-yarn-ft.log" 2>&1 &
python3 train.py config/finetune_pope.py --init_from=$R/pope-1337/ckpt.pt --out_dir=$R/pope-ft \
    $FT $EXTRA > "$R/pope-ft.log" 2>&1 &
wait
echo "fine-tuning done at $(elapsed)s" | tee -a "$R/plan.txt"

# 3. perplexity against context length, 512 x 1..10, on the held-out addresses
LENS=""; [ "$SMALL" = 1 ] && LENS="--lengths=64,128 --max_tokens=2048"
python3 eval_extrapolation.py --data data/english/val.bin --yarn --no_progress $LENS \
    --ckpt $R/pope-1337/ckpt.pt $R/pope-1338/ckpt.pt $R/rope-1337/ckpt.pt $R/rope-1338/ckpt.pt \
           $R/pope-ft/ckpt.pt $R/rope-yarn-ft/ckpt.pt \
    --labels PoPE,PoPE-s2,RoPE,RoPE-s2,PoPE+ft,RoPE+YaRN-ft \
    --json "$OUT/extrapolation.json" --plot "$OUT/extrapolation.png" > "$R/extrapolation.log" 2>&1
echo "extrapolation eval done at $(elapsed)s" | tee -a "$R/plan.txt"

# 4. 124M at 10x its 1024 context: memory stays O(T) (no T x T attention tensor)
M124="--dataset=english --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 --eval_interval=20 --eval_iters=2 \
      --compile=False --always_save_checkpoint=True"
M_LENS="--lengths=1024,2048,4096,8192,10240 --max_tokens=20480 --batch_size=1"
if [ "$SMALL" = 1 ]; then
    M124="$M124 --n_layer=1 --n_head=2 --n_embd=64 --block_size=64 --batch_size=2 --gradient_accumulation_steps=1"
    M_LENS="--lengths=64,640 --max_tokens=1280 --batch_size=1"
fi
python3 train.py config/pope_124m.py --out_dir=$R/m124-pope $M124 $EXTRA > "$R/m124-pope.log" 2>&1
python3 train.py config/rope_124m.py --out_dir=$R/m124-rope $M124 $EXTRA > "$R/m124-rope.log" 2>&1
python3 eval_extrapolation.py --data data/english/val.bin --no_progress $M_LENS \
    --ckpt $R/m124-pope/ckpt.pt $R/m124-rope/ckpt.pt --labels PoPE-124M,RoPE-124M \
    --json "$R/memory124m.json" > "$R/memory124m.log" 2>&1
echo "124M memory check done at $(elapsed)s" | tee -a "$R/plan.txt"

{ cat "$R/env.txt" "$R/plan.txt"
  for r in pope-1337 pope-1338 rope-1337 rope-1338 pope-ft rope-yarn-ft; do
      echo "$r: $(grep -h '^step' $R/$r.log | tail -1)   $(grep -h '^iter' $R/$r.log | tail -1)"
  done
  cat "$R/extrapolation.log" "$R/memory124m.log"
  echo "total $(elapsed)s"; } > "$OUT/summary-lm.txt"
rm -f "$R"/*/ckpt.pt
tar czf "$OUT/lm.tgz" -C /tmp "$(basename $R)"
cat "$OUT/summary-lm.txt"
