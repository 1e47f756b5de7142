#!/bin/bash
# .tk/dbg2.sh: JSB under torch.compile, NaN from iteration 2 at seed 1340 (eager is fine): which part?
rm -rf /root/d2 && mkdir -p /root/d2 && for v in a e f; do cp -r . /root/d2/$v; done && cd /root/d2/a
sed -i 's/torch.manual_seed(make_gen(seed, iter_num, rank, 1).initial_seed())/pass/' /root/d2/e/train.py
sed -i 's/^import torch$/import torch\nimport torch._inductor.config as _ic; _ic.fallback_random = True/' /root/d2/f/train.py
grep -c 'pass$' /root/d2/e/train.py; grep -c fallback_random /root/d2/f/train.py
python prepare/jsb.py --input .tk/shared/music/Jsb16thSeparated.json > /dev/null 2>&1
cp -r data /root/d2/e/ && cp -r data /root/d2/f/
C="config/jsb.py --compile=True --max_iters=8 --log_interval=1 --eval_interval=1000 --eval_iters=1 --overwrite=True"
run() { n=$1; shift; timeout 240 python train.py $C --out_dir=/root/d2/o$n "$@" > /root/d2/$n.log 2>&1; }
run base1340 --seed=1340 & run base1337 --seed=1337 & run base1341 --seed=1341 &
run nodrop1340 --seed=1340 --dropout=0 & run fp32_1340 --seed=1340 --dtype=float32 &
run rope1340 --seed=1340 --pos_emb=rope & run triton1340 --seed=1340 --attn_impl=triton &
(cd /root/d2/e && run noreseed1340 --seed=1340) & (cd /root/d2/f && run fallback1340 --seed=1340) &
wait
mkdir -p $OUT; cp /root/d2/*.log $OUT/
for f in /root/d2/*.log; do echo "$(basename $f): $(grep -m1 -o 'iter [0-9]*: loss nan' $f) | $(tail -1 $f | cut -c1-100)"; done
