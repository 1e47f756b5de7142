# Issue 84: time results/code.sh's evals on one GPU (untimed so far), on two 20-step checkpoints
# (eval cost does not depend on training): corpus build, eval_full val+test, eval_extrapolation
# 1k..10k with --yarn at MAX_TOKENS (then scale), eval_frequencies. One call, foreground.
set -u
export TIKTOKEN_CACHE_DIR=$PWD/.devcarry/tkc PYTHONUNBUFFERED=1
O=$OUT; T0=$(date +%s)
mark() { echo "$(( $(date +%s) - T0 )) s: $*" | tee -a $O/times.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $O/gpu.txt
cat .devcarry/commit >> $O/gpu.txt
mark start
python prepare/code.py --wheels data/code/raw > $O/prepare.log 2>&1; mark "prepare rc=$?"
for pe in pope rope; do
  timeout 120 python train.py config/code_124m.py --pos_emb=$pe --seed=1337 --out_dir=/tmp/ct/$pe \
    --max_iters=20 --lr_decay_iters=20 --warmup_iters=2 --eval_interval=20 --eval_iters=2 \
    --compile=False > $O/train-$pe.log 2>&1; mark "train20 $pe rc=$?"
done
for pe in pope rope; do
  timeout 150 python train.py --out_dir=/tmp/ct/$pe --init_from=resume --eval_only=True \
    --eval_full=True --eval_splits=val,test --compile=False > $O/evalfull-$pe.log 2>&1
  mark "eval_full val,test $pe rc=$?"
done
timeout ${XT:-240} python eval_extrapolation.py --data data/code/test.bin --yarn \
  --max_tokens ${MAXTOK:-1048576} --no_progress --ckpt /tmp/ct/pope/ckpt.pt /tmp/ct/rope/ckpt.pt \
  --labels PoPE,RoPE --json $O/extrapolation.json > $O/extrapolation.log 2>&1
mark "extrapolation max_tokens=${MAXTOK:-1048576} rc=$?"
timeout 100 python eval_frequencies.py --data data/code/test.bin --ckpt /tmp/ct/pope/ckpt.pt \
  /tmp/ct/rope/ckpt.pt --labels PoPE,RoPE --no_progress --json $O/frequencies.json \
  > $O/frequencies.log 2>&1; mark "frequencies rc=$?"
