#!/bin/bash
# .tk/reg.sh: the GPU suite in the background (bench.sh PART=tests), and the new regression test 3x against
# the fixed model.py and 3x against the old view-permute-unbind form
PART=tests bash .tk/bg.sh $(cat .tk/commit)
R=/root/r; rm -rf $R && mkdir -p $R && cp -r . $R/new && cp -r . $R/old
python - <<'PY'
p = "/root/r/old/model.py"; s = open(p).read()
a = "q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))"
assert a in s; open(p, "w").write(s.replace(a, "q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)"))
PY
K=test_compiled_bf16_training_keeps_gradients_finite
for v in new old; do for i in 1 2 3; do (cd $R/$v && python -m pytest -q -p no:cacheprovider tests/test_gpu.py -k $K > $R/$v$i.log 2>&1) & done; done
wait
for f in $R/*.log; do echo "$(basename $f): $(tail -1 $f | cut -c1-80) $(grep -m1 -o "assert not .*" $f | cut -c1-150)"; done
mkdir -p $OUT/reg && cp $R/*.log $OUT/reg/
bash .tk/poll.sh 400
