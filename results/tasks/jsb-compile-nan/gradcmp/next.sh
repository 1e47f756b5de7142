#!/bin/bash
# .tk/next.sh: .tk/gradcmp.py against both q/k/v forms side by side (about 2 min on one H200); logs to $OUT
R=/root/n; rm -rf $R && mkdir -p $R && cp -r . $R/split && cp -r . $R/permute
python - <<'PY'
p = "/root/n/permute/model.py"; s = open(p).read()
a = "q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))"
assert a in s; open(p, "w").write(s.replace(a, "q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)"))
PY
for f in split permute; do for i in 1 2; do (cd $R/$f && timeout 400 python .tk/gradcmp.py $f > $R/$f$i.log 2>&1) & done; done; wait
mkdir -p $OUT && cp $R/*.log $OUT/ && grep -h "rel err\|Error" $R/*.log
