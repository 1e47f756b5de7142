#!/bin/bash
# .tk/dbg3.sh: JSB compiled NaN at iteration 2: flaky or not? old code? SDPA backend? which grads?
R=/root/d3; rm -rf $R && mkdir -p $R
for v in cur noreseed nocudnn noflash nopad gradscan; do cp -r . $R/$v; done
cp -r .tk/old $R/old
cd $R
sed -i 's/torch.manual_seed(make_gen(seed, iter_num, rank, 1).initial_seed())/pass/' noreseed/train.py
sed -i 's/^import torch$/import torch\ntorch.backends.cuda.enable_cudnn_sdp(False)/' nocudnn/train.py
sed -i 's/^import torch$/import torch\ntorch.backends.cuda.enable_flash_sdp(False)/' noflash/train.py
sed -i 's/^import torch$/import torch\nimport torch._inductor.config as _ic; _ic.comprehensive_padding = False/' nopad/train.py
python - <<'PY'
p = "/root/d3/gradscan/train.py"; s = open(p).read()
a = "    if clip > 0:\n        scaler.unscale_(optimizer)"
b = ("    bad = [n for n, p in raw_model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]\n"
     "    print('nonfinite grads:', len(bad), bad[:12], 'loss', float(total), flush=True)\n" + a)
assert a in s; open(p, "w").write(s.replace(a, b, 1))
PY
grep -c "pass$" noreseed/train.py; grep -c "enable_cudnn_sdp" nocudnn/train.py; grep -c "enable_flash" noflash/train.py; grep -c comprehensive nopad/train.py
(cd cur && python prepare/jsb.py --input .tk/shared/music/Jsb16thSeparated.json > /dev/null 2>&1)
(cd old && python prepare/jsb.py --input ../cur/.tk/shared/music/Jsb16thSeparated.json > /root/d3/old_prep.log 2>&1); tail -2 /root/d3/old_prep.log
for v in noreseed nocudnn noflash nopad gradscan; do cp -r cur/data $v/; done
C="config/jsb.py --compile=True --max_iters=8 --log_interval=1 --eval_interval=1000 --eval_iters=1 --overwrite=True"
run() { d=$1; n=$2; shift 2; (cd $R/$d && timeout 300 python train.py $C --out_dir=$R/o$n "$@" > $R/$n.log 2>&1); }
run cur base_a --seed=1340 & run cur base_b --seed=1340 & run noreseed noreseed_a --seed=1340 &
run noreseed noreseed_b --seed=1340 & run nocudnn nocudnn --seed=1340 & run noflash noflash --seed=1340 &
run nopad nopad --seed=1340 & run gradscan gradscan --seed=1340 &
(cd cur && CUDA_LAUNCH_BLOCKING=1 timeout 300 python train.py $C --out_dir=$R/oblk --seed=1340 > $R/blocking.log 2>&1) &
O="--dropout=0.3 --warmup_iters=50 --lr_decay_iters=1000 --seed=1340"
run old old_rope --pos_emb=rope $O & run old old_torch --attn_impl=torch $O &
wait
mkdir -p $OUT; cp $R/*.log $OUT/
for f in $R/*.log; do echo "$(basename $f): $(grep -m1 -o 'iter [0-9]*: loss nan' $f) | $(grep -m1 'nonfinite grads: [1-9]' $f | cut -c1-200) | $(tail -1 $f | cut -c1-90)"; done
