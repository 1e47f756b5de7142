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
