# Sourced by the notes/results_*.sh device scripts (repo root): starts the clock
# (T0, elapsed), unpacks the carried Triton cache once per machine (.carry/tcache.tgz,
# optional) and defines write_env FILE: date, GPUs, driver, torch and triton versions.
export PYTHONUNBUFFERED=1
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
if [ -f .carry/tcache.tgz ] && [ ! -d /tmp/tc/tcache ]; then
    mkdir -p /tmp/tc && tar xzf .carry/tcache.tgz -C /tmp/tc
fi
if [ -d /tmp/tc/tcache ]; then export TRITON_CACHE_DIR=/tmp/tc/tcache; fi
write_env() {
    { date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null
      python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
                  'gpus', torch.cuda.device_count())"; } > "$1"
}
