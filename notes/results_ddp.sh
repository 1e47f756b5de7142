#!/bin/bash
# RESULTS.md, multi-GPU (issue 7): train.py under torchrun on 2 H200s (device kind
# nvidia-h200-x2), PoPE-124M on the OpenWebText sample.
#   PART=scaling: an NCCL all-reduce check, then tokens/s on 1 and on 2 GPUs at
#       16 x 1024 tokens per GPU and no accumulation, PoPE and RoPE, one run at a time;
#       then PoPE at the 124M config's global batch (64 x 1024 by accumulation).
#   PART=curves: the 124M setup (global batch 64 x 1024 = 16 x 4 accumulation
#       steps, 2 on each of 2 ranks) for 200 steps: 1 GPU and 2 GPUs, seeds 1337
#       and 1338. Same seed = same init and same global batches, so 1 vs 2 GPUs
#       differ only in summation order; the other seed gives the run-to-run noise.
#       Then resume under torchrun: 2 GPUs to step 100, stop, resume to 200.
# Usage (repo root, on the 2-GPU machine): PART=scaling bash notes/results_ddp.sh
#                                          PART=curves  bash notes/results_ddp.sh
#        then (anywhere): python3 notes/ddp_summary.py RUN_DIR...
# Env: OUT (default out-results), BUDGET seconds (default 540: runs that would not
#      fit are skipped and say so), DATA_DIR and DATASET (default data/openwebtext, made by
#      prepare/openwebtext.py; RESULTS.md used DATA_DIR=.carry/data DATASET=owt, a copy carried
#      to the device),
#      EXTRA="--key=value ..." appended to every train.py call (a CPU dry run:
#      EXTRA="--device=cpu --compile=False --n_layer=1 --n_embd=64 --n_head=2 --batch_size=2 --block_size=64").
set -u
PART=${PART:-scaling}
OUT=${OUT:-out-results}
BUDGET=${BUDGET:-540}
DATA_DIR=${DATA_DIR:-data}
DATASET=${DATASET:-openwebtext}
EXTRA=${EXTRA:-}
# NVLink multicast stays off: on a shared host it can take the GPUs out of service
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
source notes/device_env.sh
R=/tmp/r-ddp-$PART
rm -rf "$R"; mkdir -p "$R" "$OUT"
write_env "$R/env.txt"
{ nvidia-smi topo -m; env | grep -E "NCCL|MULTICAST|NVLS" | sort; } >> "$R/env.txt" 2>&1

# run NAME NEED_S CMD...: runs CMD (log in $R/NAME.log) if NEED_S seconds are left
run() {
    local name=$1 need=$2; shift 2
    local left=$(( BUDGET - $(elapsed) ))
    if [ $left -lt $need ]; then
        echo "$name: skipped, $left s left of the budget, needs ~$need s" | tee -a "$R/plan.txt"; return
    fi
    timeout $(( left - 5 )) "$@" > "$R/$name.log" 2>&1
    echo "$name: rc $? at $(elapsed)s" | tee -a "$R/plan.txt"
}
TR="torchrun --standalone --nproc_per_node=2"
BASE="config/pope_124m.py --data_dir=$DATA_DIR --dataset=$DATASET $EXTRA"

if [ "$PART" = scaling ]; then
    # NCCL all-reduce of 124M fp32 gradients' size (500 MB), the per-step DDP traffic
    cat > "$R/allreduce.py" <<'PY'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl"); r = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(r)
x = torch.full((124_000_000,), float(r + 1), device="cuda")
for _ in range(3): dist.all_reduce(x)
torch.cuda.synchronize(); t = time.time()
for _ in range(10): dist.all_reduce(x)
torch.cuda.synchronize(); dt = (time.time() - t) / 10
ok = torch.allclose(x[:10], torch.full((10,), 3.0 * 2 ** 12, device="cuda"))
if r == 0: print(f"all_reduce 496 MB fp32: {dt * 1e3:.2f} ms, bus bandwidth {2 * (1 - 1 / 2) * x.numel() * 4 / dt / 1e9:.0f} GB/s, sum correct {ok}")
dist.barrier(); dist.destroy_process_group()
PY
    run allreduce 30 $TR "$R/allreduce.py"
    S="--gradient_accumulation_steps=1 --max_iters=60 --lr_decay_iters=60 --warmup_iters=5 --eval_interval=1000
       --eval_iters=1 --log_interval=10 --always_save_checkpoint=False --eval_splits=val"
    for pe in pope rope; do
        run $pe-1gpu 90 env CUDA_VISIBLE_DEVICES=0 python3 train.py $BASE --pos_emb=$pe $S --out_dir=$R/$pe-1gpu
        run $pe-2gpu 90 $TR train.py $BASE --pos_emb=$pe $S --gradient_accumulation_steps=2 --out_dir=$R/$pe-2gpu
    done
    # the 124M config's global batch, 64 x 1024: 4 micro-steps on 1 GPU, 2 per rank on 2 GPUs
    run pope-1gpu-acc4 80 env CUDA_VISIBLE_DEVICES=0 python3 train.py $BASE $S --gradient_accumulation_steps=4 \
        --out_dir=$R/pope-1gpu-acc4
    run pope-2gpu-acc4 80 $TR train.py $BASE $S --gradient_accumulation_steps=4 --out_dir=$R/pope-2gpu-acc4
else
    C="--max_iters=200 --lr_decay_iters=200 --warmup_iters=20 --eval_interval=50 --eval_iters=10 --log_interval=1
       --always_save_checkpoint=True"
    # the two 1-GPU runs side by side, one on each GPU
    for i in 0 1; do
        seed=$((1337 + i))
        CUDA_VISIBLE_DEVICES=$i timeout $(( BUDGET - 60 )) python3 train.py $BASE $C --seed=$seed \
            --out_dir=$R/1gpu-$seed > "$R/1gpu-$seed.log" 2>&1 &
    done
    wait
    echo "1-GPU runs done at $(elapsed)s" | tee -a "$R/plan.txt"
    for seed in 1337 1338; do
        run 2gpu-$seed 60 $TR train.py $BASE $C --seed=$seed --out_dir=$R/2gpu-$seed
    done
    # resume: stop at 100 (same schedule), resume to 200 in the same out_dir
    run resume-a 50 $TR train.py $BASE $C --seed=1337 --max_iters=100 --out_dir=$R/resume
    run resume-b 50 $TR train.py $BASE $C --seed=1337 --init_from=resume --out_dir=$R/resume
fi
rm -f "$R"/*/ckpt.pt "$R"/*/ckpt.pt.tmp
python3 notes/ddp_summary.py "$R" > "$OUT/summary-ddp-$PART.txt" 2>&1
{ cat "$R/env.txt" "$R/plan.txt"; echo "total $(elapsed)s"; } >> "$OUT/summary-ddp-$PART.txt"
tar czf "$OUT/ddp-$PART.tgz" -C /tmp "$(basename $R)"
cat "$OUT/summary-ddp-$PART.txt"
