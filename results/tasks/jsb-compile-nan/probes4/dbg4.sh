#!/bin/bash
# .tk/dbg4.sh: rates: 4x reseed, 4x no reseed, 4x flash SDPA off; each prints which grads go non-finite
R=/root/d4; rm -rf $R && mkdir -p $R
for v in gs nr nf; do cp -r . $R/$v; done
cd $R
python - <<'PY'
for v in ("gs", "nr", "nf"):
    p = f"/root/d4/{v}/train.py"; s = open(p).read()
    a = "    if clip > 0:\n        scaler.unscale_(optimizer)"
    b = ("    bad = [(n, [i for i in range(3) if p.dim() == 2 and p.size(0) == 3 * p.size(1) and not torch.isfinite(p.grad.chunk(3)[i]).all()])"
         " for n, p in raw_model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]\n"
         "    print('nonfinite grads:', len(bad), bad[:12], 'loss', float(total), flush=True)\n" + a)
    assert a in s; s = s.replace(a, b, 1)
    if v == "nr":
        a = "torch.manual_seed(make_gen(seed, iter_num, rank, 1).initial_seed())"; assert a in s; s = s.replace(a, "pass")
    if v == "nf":
        s = s.replace("\nimport torch\n", "\nimport torch\ntorch.backends.cuda.enable_flash_sdp(False)\n", 1); assert "enable_flash" in s
    open(p, "w").write(s)
PY
(cd gs && python prepare/jsb.py --input .tk/shared/music/Jsb16thSeparated.json > /dev/null 2>&1)
for v in nr nf; do cp -r gs/data $v/; done
C="config/jsb.py --compile=True --max_iters=8 --log_interval=1 --eval_interval=1000 --eval_iters=1 --overwrite=True --seed=1340"
run() { (cd $R/$1 && timeout 300 python train.py $C --out_dir=$R/o$2 > $R/$2.log 2>&1); }
for i in 1 2 3 4; do run gs gs$i & run nr nr$i & run nf nf$i & done
wait
mkdir -p $OUT; cp $R/*.log $OUT/
for f in $R/*.log; do echo "$(basename $f): $(grep -m1 -o 'iter [0-9]*: loss nan' $f) | $(grep -m1 'nonfinite grads: [1-9]' $f | cut -c1-220) | $(tail -1 $f | cut -c1-60)"; done
