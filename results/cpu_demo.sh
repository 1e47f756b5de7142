#!/bin/bash
# README's quick start on the CPU: 100 steps of config/indirect_indexing_quick.py with torch's
# default threads and with OMP_NUM_THREADS=1, on an idle machine and beside two busy processes
# (other jobs on a shared machine). Writes results/cpu_demo/timings.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=results/cpu_demo/timings.txt
work=$(mktemp -d)
cp -r ./*.py prepare config "$work"/
cd "$work"
python prepare/indirect_indexing.py --quick > /dev/null
{
    echo "# $(date -u +%FT%TZ) commit $(git -C "$OLDPWD" rev-parse --short HEAD), $(nproc) cores"
    echo "# seconds for: python train.py config/indirect_indexing_quick.py --max_iters=100"
    echo "| machine | threads | seconds |"
    echo "|---|---|---:|"
} > "$OLDPWD/$out.tmp"
for busy in 0 2; do
    pids=""
    for _ in $(seq 1 $busy); do
        python -c "while True: pass" &
        pids="$pids $!"
    done
    for threads in default 1; do
        rm -rf out-indirect-indexing-quick
        envs=""
        if [ $threads = 1 ]; then
            envs="OMP_NUM_THREADS=1"
        fi
        start=$(date +%s.%N)
        env $envs python train.py config/indirect_indexing_quick.py --max_iters=100 \
            --lr_decay_iters=100 --eval_interval=100 > /dev/null
        end=$(date +%s.%N)
        secs=$(python -c "print(round($end - $start, 1))")
        echo "| $busy busy processes | $threads | $secs |" >> "$OLDPWD/$out.tmp"
    done
    if [ -n "$pids" ]; then
        kill $pids
    fi
done
cd "$OLDPWD"
mv $out.tmp $out
rm -rf "$work"
cat $out
