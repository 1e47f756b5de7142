# Sourced by the results/*.sh scripts after they set OUT: the GPUs to spread runs over
# (CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists) as the array GPU, a message when a
# command fails, and the provenance file $OUT/env.txt (or the file ENV_TXT names): the command
# and its settings, the commit and whether the tree was dirty, date, GPUs, driver, MPS, versions.
# POPE_COMMIT / POPE_DIRTY, where set, name the commit and the dirty state (a copied tree's .git can
# be a stale snapshot); else git does, and without git they are "unknown".
GPUS=${CUDA_VISIBLE_DEVICES:-$({ nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true; } \
    | paste -sd, -)}
IFS=, read -ra GPU <<< "${GPUS:-0}"
export PYTHONUNBUFFERED=1
trap 'echo "stopped: a command failed (exit $?); see the logs in $OUT" >&2' ERR
mkdir -p "$OUT"
SETTINGS='OBJECTIVE|VARIANT|SEEDS|POS_EMBS|STEPS|EXTRA|LABEL|RESULTS|TASKS|TAG|BOUNDS|PART|DATASET'
SETTINGS+='|SHARED|WHEELS|MAX_TOKENS'
{ echo "command: $(env | grep -E "^($SETTINGS)=" \
      | sed "s/=\(.*\)/='\1'/" | sort | paste -sd' ') bash $0 $*"
  echo "commit: ${POPE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  if [ -n "${POPE_DIRTY+set}" ]; then d=$POPE_DIRTY
  elif d=$(git status --porcelain 2>/dev/null); then d=$(printf %s "$d" | head -c 400 | paste -sd' ')
  else d=unknown; fi
  echo "dirty: ${d:-no}"
  echo "date: $(date -u +%FT%TZ)"
  echo "gpus: $(nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null \
      | paste -sd';')"
  echo "mps: $(pgrep -f nvidia-cuda-mps-control >/dev/null && echo on || echo off)"
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "${ENV_TXT:-$OUT/env.txt}"
# train.py's start flag for the run folder $1, its log $1.log (lm.sh, tasks.sh, indirect_indexing.sh): resume
# from its checkpoint, a "--- resumed" line marking the place in the log, else start afresh with an empty log
start_flag() {
    if [ -f "$1/ckpt.pt" ]; then echo "--- resumed" >> "$1.log"; echo --init_from=resume
    else : > "$1.log"; echo --overwrite=True; fi
}
