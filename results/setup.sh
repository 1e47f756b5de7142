# Sourced by the results/*.sh scripts after they set OUT: the GPUs to spread runs over
# (CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists) as the array GPU, a message when a
# command fails, and $OUT/env.txt (or the file ENV_TXT names) with the date, GPUs, driver, torch
# and triton versions.
GPUS=${CUDA_VISIBLE_DEVICES:-$({ nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true; } | paste -sd, -)}
IFS=, read -ra GPU <<< "${GPUS:-0}"
export PYTHONUNBUFFERED=1
trap 'echo "stopped: a command failed (exit $?); see the logs in $OUT" >&2' ERR
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null || true
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "${ENV_TXT:-$OUT/env.txt}"
# train.py's start flag for the run folder $1, its log $1.log (lm.sh, tasks.sh, indirect_indexing.sh): resume from
# its checkpoint, a "--- resumed" line marking the place in the log, else start afresh with an empty log
start_flag() {
    if [ -f "$1/ckpt.pt" ]; then echo "--- resumed" >> "$1.log"; echo --init_from=resume
    else : > "$1.log"; echo --overwrite=True; fi
}
