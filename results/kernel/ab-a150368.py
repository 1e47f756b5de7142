"""Paired A/B, one process: a150368's kernel (the lean-core issue's reference; contiguous (B,H,T,D) leaves,
its gradients' layout) against this tree's (views of (B,T,H,D) memory, its gradients' layout): graph replays
of forward+backward (bench.py's graph_ms), alternated old/new four times a shape.
Run from the repository root on a GPU: PYTHONPATH=. python results/kernel/ab-a150368.py
(POPE_COMMIT and POPE_DIRTY name this tree for the header)."""
import datetime, os, statistics, subprocess, sys, tempfile

import torch
import triton

old = tempfile.mkdtemp()
with open(os.path.join(old, "pk_old.py"), "w") as f:
    f.write(subprocess.run(["git", "show", "a150368:pope_kernel.py"], capture_output=True, text=True,
                           check=True).stdout)
sys.path.insert(0, old)
import pk_old
import pope_kernel as pk
from bench import graph_ms, inputs
from model import pope_delta, pope_frequencies
sys.stdout.reconfigure(line_buffering=True)
print(f"# commit: {os.environ['POPE_COMMIT']}\n# dirty: {os.environ['POPE_DIRTY']}\n"
      f"# gpu: {torch.cuda.get_device_name()}\n# torch: {torch.__version__}\n# triton: {triton.__version__}\n"
      f"# date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC\n"
      f"# command: python results/kernel/ab-a150368.py (old: git show a150368:pope_kernel.py)")
print("# old = a150368 pope_kernel.py, contiguous (B,H,T,D) leaves; new = HEAD, (B,H,T,D) views of (B,T,H,D)")
for B, H, T, D in ((8, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64)):
    theta = pope_frequencies(D, device="cuda")
    qn, kn, vn, delta, don = inputs(B, H, T, D, torch.bfloat16, seed=T)
    qo, ko, vo, doo = (x.contiguous() for x in (qn, kn, vn, don))
    ln = [x.requires_grad_(True) for x in (qn, kn, vn, delta)]
    lo = [x.requires_grad_(True) for x in (qo, ko, vo)] + [delta]
    f = {"old": (lambda: pk_old.pope_attention(qo, ko, vo, pope_delta(delta), theta).backward(doo), lo),
         "new": (lambda: pk.pope_attention(qn, kn, vn, pope_delta(delta), theta).backward(don), ln)}
    t = {"old": [], "new": []}
    for r in range(4):
        for name in (("old", "new") if r % 2 == 0 else ("new", "old")):
            t[name].append(graph_ms(*f[name]))
    med = {n: statistics.median(v) for n, v in t.items()}
    print(f"{B},{H},{T},{D}  old {' '.join(f'{x:.3f}' for x in t['old'])} median {med['old']:.3f}  "
          f"new {' '.join(f'{x:.3f}' for x in t['new'])} median {med['new']:.3f}  new/old {med['new']/med['old']:.3f}")
    torch.cuda.empty_cache()
