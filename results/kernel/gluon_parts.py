"""Where the GPU time of pope_attention's forward+backward goes, kernel by kernel (torch.profiler, bench.py's
gpu_kernels), with pope_kernel's training kernels and with gluon_pope.py's swapped in. On an H200:
    PYTHONPATH=. python results/kernel/gluon_parts.py"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import gluon_step  # noqa: E402
import model  # noqa: E402
import pope_kernel  # noqa: E402

bench.header()
for B, H, T, D in ((8, 12, 1024, 64), (16, 12, 1024, 64), (2, 12, 4096, 64), (1, 12, 16384, 64)):
    q, k, v, delta, do = bench.inputs(B, H, T, D, torch.bfloat16, seed=T)
    theta = model.pope_frequencies(D, device="cuda")
    leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
    for name, fb in (("triton", (gluon_step.triton_fwd, gluon_step.triton_bwd)), ("gluon", (gluon_step.fwd,
                                                                                          gluon_step.bwd))):
        pope_kernel._fwd, pope_kernel._bwd = fb
        ks = bench.gpu_kernels(lambda: pope_kernel.pope_attention(q, k, v, model.pope_delta(delta), theta)
                               .backward(do), leaves)
        print(f"{B},{H},{T},{D} {name:6s} sum {sum(us for _, us in ks):8.1f} µs: "
              + ", ".join(f"{n} {us:.1f}" for n, us in ks), flush=True)
