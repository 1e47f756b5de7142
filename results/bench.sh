#!/bin/bash
# RESULTS.md, section 5 (Speed): bench.py's GPU checks and benchmarks, on one GPU.
#   python bench.py check    the PoPE kernel's forward and 4 gradients against float64 (untuned
#                            configs, outputs that start as NaN), two backward runs compared bitwise
#   python bench.py kernel   causal bf16 attention at (B,H,T,d) = (8,12,1k,64), (2,12,4k,64),
#                            (1,12,16k,64): fwd, fwd+bwd eager and as one CUDA graph, TFLOP/s, peak
#                            memory; the PoPE kernel, PoPE's PyTorch path, RoPE + SDPA, SDPA d=64 and d=128,
#                            and pope-pytorch 0.2.1's fused kernel where it is installed (requirements-optional.txt)
#   python bench.py sample   decoding tokens/s, 124M PoPE vs RoPE, batch 1 and 8, eager and compiled
#   python bench.py decode   the decoding kernel's launch constants (warps, programs, tile) against its time
#   python bench.py host     host time per eager call (the kernel's fwd+bwd, decoding) and a cProfile of it
#   python bench.py launch   host time of one Triton launch: the JIT, the compiled kernel's runner, its bare
#                            launcher, pope_kernel._run (the direct launch)
#   python bench.py sweep    every launch config of the three attention kernels, timed at four shapes
#                            (D=64, then D=128): where pope_kernel.py's config lists come from
#   python bench.py aot      registers, spills and shared memory of every kernel config compiled
#                            for sm_90 (no GPU needed)
# Design notes and measurements of the kernel: results/kernel.md.
#
# Needs:   1 CUDA GPU (CUDA_VISIBLE_DEVICES picks it; default the first) for all but aot.
# Time:    H200: a few minutes each, most of it autotuning and compilation; aot ~1 min on 2 CPU cores.
# Outputs: results/kernel/check.txt, bench-kernel.txt, host.txt, launch-cost.txt, sweep-d{64,128}.{txt,json}, aot.txt, env.txt;
#          results/sample/bench-sample.{txt,json}, decode.{txt,json}
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=results/kernel
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
trap 'echo "stopped: a command failed (exit $?); see the outputs in $OUT" >&2' ERR
mkdir -p $OUT results/sample
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > $OUT/env.txt

python bench.py check 2>&1 | tee $OUT/check.txt
python bench.py kernel 2>&1 | tee $OUT/bench-kernel.txt
python bench.py host 2>&1 | tee $OUT/host.txt
python bench.py launch 2>&1 | tee $OUT/launch-cost.txt
for D in 64 128; do
  python bench.py sweep --head_dim $D --json $OUT/sweep-d$D.json 2>&1 | tee $OUT/sweep-d$D.txt
done
python bench.py sample --json results/sample/bench-sample.json 2>&1 | tee results/sample/bench-sample.txt
python bench.py decode --json results/sample/decode.json 2>&1 | tee results/sample/decode.txt
python bench.py aot 2>&1 | tee $OUT/aot.txt
