#!/bin/bash
# RESULTS.md, section 6 (several GPUs): train.py under torchrun on 2 GPUs of one host,
# PoPE-124M and RoPE-124M (config/pope_124m.py, --pos_emb=rope), bf16, compiled.
#   PART=scaling  an NCCL all-reduce of 496 MB (the size of 124M's float32 gradients); then
#                 tokens/s on 1 and on 2 GPUs, 60 steps each, one run at a time: PoPE and RoPE at
#                 16 x 1024 tokens per GPU without accumulation, and PoPE at the config's global
#                 batch of 64 x 1024 (4 micro-steps on 1 GPU, 2 per rank on 2)
#   PART=curves   200 steps of the 124M setup (global batch 64 x 1024, warmup 20, cosine to 200),
#                 seeds 1337 and 1338, on 1 GPU (the two runs side by side, one per GPU) and on
#                 2 GPUs; same seed = same initial weights and same global batches. Then resume
#                 under torchrun: seed 1337 on 2 GPUs stopped at step 100 and resumed to 200.
#   PART="scaling curves" (the default): both.
#
# Needs:   2 CUDA GPUs (the first two of CUDA_VISIBLE_DEVICES); data/owt, made here if missing
#          from the OWT sample and the English corpora of ../shared/data/text (or set SHARED).
# Time:    2 H200s: scaling about 6 min, curves about 6 min.
# Outputs: results/ddp/
#          allreduce.log                            time and bus bandwidth of the all-reduce
#          scaling-<pe>-<n>gpu[-acc4].log, .../metrics.jsonl   the scaling runs
#          curves-<n>gpu-seed<S>.log, .../metrics.jsonl        the loss-curve runs
#          curves-resume-seed1337-{a,b}.log, curves-resume-seed1337/metrics.jsonl
#          env.txt                                  GPUs, versions, topology (nvidia-smi topo -m)
#          (the 124M checkpoints are deleted at the end; RESULTS.md's table of these runs, 1 GPU
#          against 2 by seed, is to be made by results/summarize.py once they are in git)
# Settings (environment variables):
#   PART="scaling curves"
#   DATASET=owt       a dataset under data/ (made here only when it is owt)
#   SHARED=../shared/data   where the source text lives
#   EXTRA="--key=value ..."  appended to every train.py call
set -euo pipefail
cd "$(dirname "$0")/.."
PART=${PART:-scaling curves}
DATASET=${DATASET:-owt}
SHARED=${SHARED:-../shared/data}
EXTRA=${EXTRA:-}
OUT=results/ddp
GPUS=${CUDA_VISIBLE_DEVICES:-$({ nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true; } | paste -sd, -)}
IFS=, read -ra GPU <<< "${GPUS:-0,1}"
[ ${#GPU[@]} -ge 2 ] || { echo "needs 2 GPUs, found: ${GPUS:-none}"; exit 1; }
ONE="env CUDA_VISIBLE_DEVICES=${GPU[0]} python"
TWO="env CUDA_VISIBLE_DEVICES=${GPU[0]},${GPU[1]} torchrun --standalone --nproc_per_node=2"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1  # NVLink multicast off, as measured
source results/setup.sh  # logging, the provenance file $OUT/env.txt
{ python -c "import torch; print('nccl', '.'.join(map(str, torch.cuda.nccl.version())))"
  nvidia-smi topo -m; } >> $OUT/env.txt 2>&1

if [ ! -f data/$DATASET/meta.json ]; then
    [ $DATASET = owt ] || { echo "no data/$DATASET"; exit 1; }
    python prepare/openwebtext.py --out_dir data/owt --input $SHARED/text/owt_sample.jsonl $SHARED/text/english
fi
BASE="config/pope_124m.py --dataset=$DATASET --overwrite=True $EXTRA"  # a rerun replaces these short runs

if [[ $PART == *scaling* ]]; then
    $TWO --no-python python -c '
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl"); r = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(r)
x = torch.full((124_000_000,), float(r + 1), device="cuda")
for _ in range(3): dist.all_reduce(x)
torch.cuda.synchronize(); t = time.time()
for _ in range(10): dist.all_reduce(x)
torch.cuda.synchronize(); dt = (time.time() - t) / 10
ok = torch.allclose(x[:10], torch.full((10,), 3.0 * 2 ** 12, device="cuda"))
bus = 2 * (1 - 1 / 2) * x.numel() * 4 / dt  # nccl-tests bus bandwidth: size / time x 2(n-1)/n, n = 2
if r == 0: print(f"all_reduce 496 MB fp32: {dt * 1e3:.2f} ms, bus bandwidth {bus / 1e9:.0f} GB/s, sum correct {ok}")
dist.barrier(); dist.destroy_process_group()' 2>&1 | tee $OUT/allreduce.log

    S="--max_iters=60 --lr_decay_iters=60 --warmup_iters=5 --eval_interval=1000 --eval_iters=1 --log_interval=10
       --always_save_checkpoint=False --eval_splits=val"
    for pe in pope rope; do  # 16 x 1024 tokens per GPU: accumulation 1 on 1 GPU, 2 (1 per rank) on 2
        $ONE train.py $BASE --pos_emb=$pe $S --gradient_accumulation_steps=1 --out_dir=$OUT/scaling-$pe-1gpu \
            > $OUT/scaling-$pe-1gpu.log 2>&1
        $TWO train.py $BASE --pos_emb=$pe $S --gradient_accumulation_steps=2 --out_dir=$OUT/scaling-$pe-2gpu \
            > $OUT/scaling-$pe-2gpu.log 2>&1
    done
    # the config's global batch, 64 x 1024: 4 micro-steps on 1 GPU, 2 per rank on 2
    $ONE train.py $BASE $S --gradient_accumulation_steps=4 --out_dir=$OUT/scaling-pope-1gpu-acc4 \
        > $OUT/scaling-pope-1gpu-acc4.log 2>&1
    $TWO train.py $BASE $S --gradient_accumulation_steps=4 --out_dir=$OUT/scaling-pope-2gpu-acc4 \
        > $OUT/scaling-pope-2gpu-acc4.log 2>&1
fi

if [[ $PART == *curves* ]]; then
    C="--max_iters=200 --lr_decay_iters=200 --warmup_iters=20 --eval_interval=50 --eval_iters=10 --log_interval=1
       --always_save_checkpoint=True"
    pids=()
    for i in 0 1; do  # the two 1-GPU runs side by side, one on each GPU
        s=$((1337 + i))
        CUDA_VISIBLE_DEVICES=${GPU[i]} python train.py $BASE $C --seed=$s --out_dir=$OUT/curves-1gpu-seed$s \
            > $OUT/curves-1gpu-seed$s.log 2>&1 &
        pids+=($!)
    done
    fail=0; for p in "${pids[@]}"; do wait $p || fail=1; done
    [ $fail = 0 ] || { echo "a 1-GPU run failed: see $OUT/curves-1gpu-seed*.log"; exit 1; }
    for s in 1337 1338; do
        $TWO train.py $BASE $C --seed=$s --out_dir=$OUT/curves-2gpu-seed$s > $OUT/curves-2gpu-seed$s.log 2>&1
    done
    # resume: the same schedule stopped at step 100, then continued to 200 in the same out_dir
    R=$OUT/curves-resume-seed1337
    $TWO train.py $BASE $C --seed=1337 --max_iters=100 --out_dir=$R > $R-a.log 2>&1
    $TWO train.py --out_dir=$R --init_from=resume --max_iters=200 $EXTRA > $R-b.log 2>&1
fi
rm -f $OUT/*/ckpt.pt
