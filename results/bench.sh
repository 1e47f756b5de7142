#!/bin/bash
# RESULTS.md, section 5 (Speed): bench.py's three jobs on one GPU, each output with its header (commit,
# dirty tree, GPU, versions, date, the command) and its rows as raw JSON:
#   python bench.py kernel                   the attention kernel against SDPA, RoPE+SDPA and PoPE's PyTorch
#                                            path at (8,12,1k,64), (2,12,4k,64), (1,12,16k,64)
#   python bench.py train --block_size T     the 124M compiled step at 32k tokens, T = 1024, 4096, 16384:
#                                            RoPE, PoPE on the kernel, PoPE's PyTorch path, PoPE with auto,
#                                            and each path's longest CUDA kernels (--profile)
#   python bench.py sample                   decoding tok/s, 124M, PoPE and RoPE, eager and graphed
# and first the whole test suite with the GPU visible (tests/test_gpu.py holds the GPU's correctness checks).
#
# Needs:   1 CUDA GPU (CUDA_VISIBLE_DEVICES picks it; default the first).
# Time:    H200: a few minutes a job, most of it autotuning and compilation.
# Outputs: results/gpu_tests/pytest.log and env.txt (its provenance: results/setup.sh),
#          results/kernel/bench-kernel.{txt,json}, results/kernel/train-{1024,4096,16384}.{txt,json} and
#          train-1024-b16.* (16 x 1024, the batch of earlier measurements), results/sample/bench-sample.*
# Settings: PART=tests or PART=bench runs one half: the tests may run beside another job, the timings
#           want the GPU to themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
PART=${PART:-tests bench}
# pytest.log and env.txt go in after the tests: the tables of them are among what the tests check
OUT=results/gpu_tests; ENV_TXT=/tmp/pope-tests-env.txt; [[ $PART == *tests* ]] || ENV_TXT=/dev/null
source results/setup.sh
if [[ $PART == *tests* ]]; then
  rc=0; python -m pytest -q -rs tests/ 2>&1 | tee /tmp/pope-pytest.log || rc=$?
  mv /tmp/pope-pytest.log $OUT/pytest.log; mv $ENV_TXT $OUT/env.txt; [ $rc = 0 ]; fi
[[ $PART == *bench* ]] || exit 0
mkdir -p results/kernel results/sample
python bench.py kernel --json results/kernel/bench-kernel.json 2>&1 | tee results/kernel/bench-kernel.txt
for T in 1024 4096 16384; do
  python bench.py train --block_size $T --paths rope,pope-kernel,pope-torch,pope-auto --profile \
    --json results/kernel/train-$T.json 2>&1 | tee results/kernel/train-$T.txt
done
python bench.py train --block_size 1024 --tokens 16384 --paths rope,pope-kernel,pope-torch \
  --json results/kernel/train-1024-b16.json 2>&1 | tee results/kernel/train-1024-b16.txt
python bench.py sample --json results/sample/bench-sample.json 2>&1 | tee results/sample/bench-sample.txt
