#!/bin/bash
# RESULTS.md, device call 1 (one H200, ~9.5 minutes): indirect indexing with
# PoPE and RoPE (two seeds each) and NoPE (one seed), and JSB Chorales with
# PoPE and RoPE, all seven runs side by side on the one GPU. The paper trains
# indirect indexing for 100k steps; here the step count N is what fits the
# time budget: a 300-step calibration run of the indirect-indexing models
# measures ms/step, and the real runs get the paper's schedule compressed to
# N steps (warmup 4% of N, as 4k of 100k). JSB runs its paper length (3k steps).
#
# Usage (repo root; the H200 of the device tool, or any CUDA GPU):
#   bash notes/results_tasks.sh                 # writes $OUT/tasks.tgz + $OUT/summary-tasks.txt
# Env: OUT (default out-results), BUDGET seconds (default 540), SEEDS (default "1337 1338";
#      NoPE and JSB use the first), JSB=0 to skip JSB, NOPE=0 to skip NoPE, FORCE_N=steps to
#      skip the calibration, EXTRA="--key=value ..." appended to every train.py call
#      (CPU dry runs: EXTRA="--device=cpu --compile=False --n_layer=1 ...").
# Inputs: .carry/jsb/Jsb16thSeparated.npz (or ../shared/data/music), .carry/tcache.tgz (optional
#      Triton cache). Indirect-indexing data is generated here (3 s).
set -u
OUT=${OUT:-out-results}
BUDGET=${BUDGET:-540}
SEEDS=${SEEDS:-1337 1338}
SEED=${SEEDS%% *}
EXTRA=${EXTRA:-}
JSB=${JSB:-1}
NOPE=${NOPE:-1}
source notes/device_env.sh
R=/tmp/r-tasks
rm -rf "$R"; mkdir -p "$R" "$OUT"
write_env "$R/env.txt"

python3 prepare/indirect_indexing.py > "$R/prepare.log" 2>&1 || { cat "$R/prepare.log"; exit 1; }
JSB_IN=.carry/jsb/Jsb16thSeparated.npz; [ -f $JSB_IN ] || JSB_IN=../shared/data/music/Jsb16thSeparated.npz
if [ "$JSB" = 1 ]; then
    python3 prepare/jsb.py --input $JSB_IN >> "$R/prepare.log" 2>&1 || { cat "$R/prepare.log"; exit 1; }
fi

RUNS=""  # pos_emb-seed
for s in $SEEDS; do RUNS="$RUNS pope-$s rope-$s"; done
[ "$NOPE" = 1 ] && RUNS="$RUNS none-$SEED"

# 1. calibration: ms/step of the indirect-indexing models running together (compiles too)
if [ -z "${FORCE_N:-}" ]; then
    for run in $RUNS; do
        python3 train.py config/indirect_indexing_pope.py --pos_emb=${run%-*} --seed=${run#*-} \
            --out_dir=$R/cal-$run --compile=True --max_iters=300 --lr_decay_iters=300 --warmup_iters=30 \
            --eval_interval=100000 --eval_iters=2 --log_interval=10 $EXTRA > "$R/cal-$run.log" 2>&1 &
    done
    wait
    N=$(python3 - "$R" "$BUDGET" "$(elapsed)" $RUNS <<'EOF'
import json, statistics, sys
r, budget, el, runs = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
dts = []
for run in runs:
    recs = [json.loads(l) for l in open(f"{r}/cal-{run}/metrics.jsonl")]
    dts.append(statistics.median(x["dt_ms"] for x in recs if "dt_ms" in x and x["iter"] >= 100))
left = budget - el - 60  # final compile (cached), test evals, packing
n = int(0.8 * left * 1000 / max(dts) / 1000) * 1000  # 20% margin: JSB shares the GPU at first
print(max(1000, min(100000, n)))
print(f"calibration ms/step {dict(zip(runs, [round(d, 2) for d in dts]))}, {left:.0f}s left -> N = {n}",
      file=sys.stderr)
EOF
    )
    [ -n "$N" ] || { echo "calibration failed"; tail -n 5 $R/cal-*.log; exit 1; }
fi
N=${FORCE_N:-$N}
WU=$(( N / 25 ))
echo "indirect indexing: N=$N steps, warmup $WU (calibration done at $(elapsed)s)" | tee "$R/plan.txt"

# 2. the real runs, side by side; a timeout keeps the call inside its limit (train.py saves the
#    best-val checkpoint at every eval, so a cut run still has one; its log shows where it stopped)
LEFT=$(( BUDGET - $(elapsed) - 40 ))
for run in $RUNS; do
    timeout $LEFT python3 train.py config/indirect_indexing_pope.py --pos_emb=${run%-*} --seed=${run#*-} \
        --out_dir=$R/ii-$run --compile=True --max_iters=$N --lr_decay_iters=$N --warmup_iters=$WU \
        --eval_interval=$(( N / 10 )) $EXTRA > "$R/ii-$run.log" 2>&1 &
done
if [ "$JSB" = 1 ]; then
    for pe in pope rope; do
        timeout $LEFT python3 train.py config/jsb_$pe.py --out_dir=$R/jsb-$pe-$SEED --seed=$SEED \
            --compile=True $EXTRA > "$R/jsb-$pe-$SEED.log" 2>&1 &
    done
fi
wait
echo "training done at $(elapsed)s" | tee -a "$R/plan.txt"

# 3. val and test metrics of the best-val checkpoints, on the whole splits
for run in $RUNS; do
    python3 train.py config/indirect_indexing_pope.py --pos_emb=${run%-*} --out_dir=$R/ii-$run \
        --init_from=resume --eval_only=True --eval_full=True --eval_splits=val,test $EXTRA \
        > "$R/ii-$run-test.log" 2>&1 &
done
if [ "$JSB" = 1 ]; then
    for pe in pope rope; do
        python3 train.py config/jsb_$pe.py --out_dir=$R/jsb-$pe-$SEED --init_from=resume --eval_only=True \
            --eval_full=True --eval_splits=val,test $EXTRA > "$R/jsb-$pe-$SEED-test.log" 2>&1 &
    done
fi
wait

{ cat "$R/env.txt" "$R/plan.txt"
  for d in "$R"/ii-* "$R"/jsb-*; do
      [ -d "$d" ] || continue
      b=$(basename "$d")
      echo "$b: $(grep -h '^step' "$R/$b-test.log" 2>/dev/null | tail -n 1)"
      echo "    last train log: $(grep -h '^iter' "$R/$b.log" | tail -n 1)"
  done
  echo "total $(elapsed)s"; } > "$OUT/summary-tasks.txt"
rm -f "$R"/*/ckpt.pt
tar czf "$OUT/tasks.tgz" -C /tmp "$(basename $R)"
cat "$OUT/summary-tasks.txt"
