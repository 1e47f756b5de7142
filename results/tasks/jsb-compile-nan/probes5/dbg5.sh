#!/bin/bash
# .tk/dbg5.sh: 4x inductor padding off, 4x q/k/v by split (the old model.py), 4x the Triton kernel
R=/root/d5; rm -rf $R && mkdir -p $R
for v in np sp tr; do cp -r . $R/$v; done
cd $R
python - <<'PY'
for v in ("np", "sp", "tr"):
    p = f"/root/d5/{v}/train.py"; s = open(p).read()
    a = "    if clip > 0:\n        scaler.unscale_(optimizer)"
    b = ("    bad = [(n, [i for i in range(3) if p.dim() == 2 and p.size(0) == 3 * p.size(1) and not torch.isfinite(p.grad.chunk(3)[i]).all()])"
         " for n, p in raw_model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]\n"
         "    print('nonfinite grads:', len(bad), bad[:12], 'loss', float(total), flush=True)\n" + a)
    assert a in s; s = s.replace(a, b, 1)
    if v == "np":
        s = s.replace("\nimport torch\n", "\nimport torch\nimport torch._inductor.config as _ic; _ic.comprehensive_padding = False\n", 1); assert "_ic" in s
    open(p, "w").write(s)
p = "/root/d5/sp/model.py"; s = open(p).read()
a = "q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)"
assert a in s; open(p, "w").write(s.replace(a, "q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))"))
PY
(cd np && python prepare/jsb.py --input .tk/shared/music/Jsb16thSeparated.json > /dev/null 2>&1)
for v in sp tr; do cp -r np/data $v/; done
C="config/jsb.py --compile=True --max_iters=8 --log_interval=1 --eval_interval=1000 --eval_iters=1 --overwrite=True --seed=1340"
run() { d=$1; n=$2; shift 2; (cd $R/$d && timeout 300 python train.py $C --out_dir=$R/o$n "$@" > $R/$n.log 2>&1); }
for i in 1 2 3 4; do run np np$i & run sp sp$i & run tr tr$i --attn_impl=triton & done
wait
mkdir -p $OUT; cp $R/*.log $OUT/
for f in $R/*.log; do echo "$(basename $f): $(grep -m1 -o 'iter [0-9]*: loss nan' $f) | $(grep -m1 'nonfinite grads: [1-9]' $f | cut -c1-150) | $(tail -1 $f | cut -c1-60)"; done
