"""Does storing dS (results/kernel/ds-stored.diff) shorten the kernel's fwd+bwd? In one process, in turn:
the CUDA-graphed fwd+bwd of pope_attention with dS recomputed (_DS_BYTES = 0) and stored, order alternating
by turn; median ms of one replay and GPU µs per CUDA kernel, at bench.py kernel's 1k and 4k shapes.

    git apply results/kernel/ds-stored.diff   # (a prototype: results/kernel.md)
    python results/kernel/ds_ab.py --json results/kernel/ds-ab.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402

import bench  # noqa: E402
import pope_kernel as pk  # noqa: E402
from model import pope_delta, pope_frequencies  # noqa: E402
from prepare.common import write_json  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    if not hasattr(pk, "_DS_BYTES"):
        sys.exit("error: pope_kernel.py has no _DS_BYTES: git apply results/kernel/ds-stored.diff first")
    out = dict(header=bench.header(), rows=[])
    for B, H, T, D in ((8, 12, 1024, 64), (2, 12, 4096, 64)):
        q, k, v, delta, do = bench.inputs(B, H, T, D, torch.bfloat16, seed=T)
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
        theta = pope_frequencies(D, device="cuda")

        def step():
            pk.pope_attention(q, k, v, pope_delta(delta), theta).backward(do)
        for turn in range(a.turns):
            for ds_bytes in ((0, 1 << 30) if turn % 2 == 0 else (1 << 30, 0)):
                pk._DS_BYTES = ds_bytes
                ms = bench.graph_ms(step, leaves)
                kernels = bench.gpu_kernels(step, leaves)
                r = dict(shape=[B, H, T, D], turn=turn, stored=ds_bytes > 0, graph_ms=ms, kernels=kernels)
                print(f"{B},{H},{T},{D} turn {turn} stored={r['stored']!s:5s} {ms:.3f} ms  "
                      + ", ".join(f"{n} {us:.1f}" for n, us in kernels[:5]), flush=True)
                out["rows"].append(r)
    write_json(a.json, out)
