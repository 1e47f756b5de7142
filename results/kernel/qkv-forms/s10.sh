#!/bin/bash
# .tk/s10.sh: four ways to make q, k, v from c_attn's output (split: HEAD; permute: before 3d55f91; heads: one
# view of 3H heads, transposed, split; t13: view, transpose(1, 3), unbind(2)). Per form, in a copy of the tree:
# tests/test_gpu.py::test_compiled_bf16_gradients_equal_eager with a print of its 4 largest errors (4 at once),
# then bench.py train at 1k for rope and pope-torch, the GPU to itself. All to $OUT.
export POPE_COMMIT=$(cat .tk/commit) POPE_DIRTY=no TIKTOKEN_CACHE_DIR=$PWD/.tk/tiktoken_cache PYTHONUNBUFFERED=1
R=/root/f; rm -rf $R && mkdir -p $R $OUT
pack() { (cd $R && tar czf $OUT/f.tgz t-*.log b-*.* 2>/dev/null); }
for f in split permute heads t13; do cp -r . $R/$f; done
python - <<'PY'
a = "q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, 2))"
forms = dict(permute="q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)",
             heads="q, k, v = self.c_attn(x).view(B, T, 3 * self.n_head, -1).transpose(1, 2).split(self.n_head, 1)",
             t13="q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, -1).transpose(1, 3).unbind(2)")
t = "        assert not {n: e for n, e in err.items() if not e < 0.05}, (pos_emb, err)"
for f in ("split", "permute", "heads", "t13"):
    p = f"/root/f/{f}/tests/test_gpu.py"; s = open(p).read(); assert t in s
    open(p, "w").write(s.replace(t, "        print(pos_emb, sorted(err.items(), key=lambda t: -t[1])[:4])\n" + t))
    if f in forms:
        p = f"/root/f/{f}/model.py"; s = open(p).read(); assert a in s; open(p, "w").write(s.replace(a, forms[f]))
PY
for f in split permute heads t13; do (cd $R/$f && timeout 200 python -m pytest -q -s -p no:cacheprovider tests/test_gpu.py -k gradients_equal_eager > $R/t-$f.log 2>&1) & done; wait
pack; grep -h "^pope\|^rope\|passed\|failed" $R/t-*.log | cut -c1-300
for f in split heads permute t13; do [ $SECONDS -lt 300 ] || break
  (cd $R/$f && python bench.py train --block_size 1024 --paths rope,pope-torch --profile --json $R/b-$f.json > $R/b-$f.txt 2>&1); echo $f; grep ms/step $R/b-$f.txt; pack; done
