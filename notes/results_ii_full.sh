#!/bin/bash
# Indirect indexing at the paper's full length (100k steps), PoPE and RoPE, in two
# device calls of under 10 minutes: PHASE=1 trains until its time budget ends
# (checkpoint at every eval), PHASE=2 resumes both runs to 100k, evaluates the
# test split and writes the summary. Phase 2 must land on the same, still warm
# machine (fire it at once: the checkpoints live in /tmp there). With
# compile_mode=reduce-overhead the model steps in ~6 ms alone on an H200, so
# 100k steps take ~10-11 minutes per run. On a 2-GPU machine each run gets its
# own GPU; on one GPU they share it (slower: budget a third call, PHASE=2 again).
#
# Usage (repo root):  PHASE=1 bash notes/results_ii_full.sh
#                     PHASE=2 bash notes/results_ii_full.sh   # repeat until it says done
# Env: OUT (default out-results), BUDGET seconds per call (default 560), SEEDS (default 1337),
#      EXTRA="--key=value ..." appended to every train.py call (a CPU dry run:
#      EXTRA="--device=cpu --compile=False --n_layer=1 --n_embd=32 --n_head=2 --max_iters=300
#      --lr_decay_iters=300 --warmup_iters=10 --eval_interval=100 --eval_iters=2").
set -u
PHASE=${PHASE:-1}
OUT=${OUT:-out-results}
BUDGET=${BUDGET:-560}
SEEDS=${SEEDS:-1337}
EXTRA=${EXTRA:-}
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
source notes/device_env.sh
R=/tmp/r-ii-full
mkdir -p "$R" "$OUT"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)

if [ "$PHASE" = 1 ]; then
    rm -rf "$R"/*
    write_env "$R/env.txt"
    python3 prepare/indirect_indexing.py > "$R/prepare.log" 2>&1 || { cat "$R/prepare.log"; exit 1; }
    RESUME=""
else
    [ -f "$R/env.txt" ] || { echo "no phase-1 state in $R: the machine is a fresh one; run PHASE=1 again"; exit 1; }
    RESUME="--init_from=resume"
fi

# the paper's config; always_save_checkpoint so that a cut run resumes from its last eval
i=0
for s in $SEEDS; do
    for pe in pope rope; do
        run=$pe-$s
        if grep -q "^done" "$R/$run.status" 2>/dev/null; then continue; fi
        gpu=$(( NGPU > 0 ? i % NGPU : 0 )); i=$((i + 1))
        r=$RESUME; [ -f "$R/$run/ckpt.pt" ] || r=""
        CUDA_VISIBLE_DEVICES=$gpu timeout $(( BUDGET - $(elapsed) - 60 )) python3 train.py \
            config/indirect_indexing_pope.py --pos_emb=$pe --seed=$s --out_dir=$R/$run \
            --compile=True --compile_mode=reduce-overhead --always_save_checkpoint=True $r $EXTRA \
            >> "$R/$run.log" 2>&1 && echo done > "$R/$run.status" &
    done
done
wait
echo "phase $PHASE: training stopped at $(elapsed)s" | tee -a "$R/plan.txt"

# test accuracy of the finished runs (whole val and test splits)
for s in $SEEDS; do
    for pe in pope rope; do
        run=$pe-$s
        if grep -q "^done" "$R/$run.status" 2>/dev/null && [ ! -f "$R/$run/eval.json" ]; then
            python3 train.py config/indirect_indexing_pope.py --pos_emb=$pe --out_dir=$R/$run --init_from=resume \
                --eval_only=True --eval_full=True --eval_splits=val,test $EXTRA > "$R/$run-test.log" 2>&1
        fi
    done
done
{ cat "$R/env.txt" "$R/plan.txt"
  for s in $SEEDS; do for pe in pope rope; do
      run=$pe-$s
      echo "$run: $(cat "$R/$run.status" 2>/dev/null || echo 'not done'), last eval: $(grep -h '^step' "$R/$run.log" | tail -n 1)"
      [ -f "$R/$run/eval.json" ] && echo "    full splits: $(grep -h '^step' "$R/$run-test.log" | tail -n 1)"
  done; done
  echo "call total $(elapsed)s"; } > "$OUT/summary-ii-full.txt"
tar czf "$OUT/ii-full.tgz" -C /tmp --exclude=ckpt.pt --exclude=ckpt.pt.tmp "$(basename $R)"
cat "$OUT/summary-ii-full.txt"
