"""A/B of a variant of pope_kernel.py (a copy with a .diff of results/kernel/ applied) against pope_kernel.py,
in one process: the variant's training kernels take the place of pope_kernel's (pope_kernel._fwd / _bwd
swapped, as gluon_step.py does; the copy's custom ops must be renamed, `sed s/pope_kernel::/variant::/`:
a second definition of a name silently replaces the first, and A would run B's kernels).
For each shape: both kernels' errors against the float32 PyTorch path (as bench.py kernel prints them), then
each kernel's GPU µs in a bf16 causal forward+backward (torch.profiler), A then B, twice, at head dim 64
(--head_dim 128: 768 / D heads). --step T:tokens,...: then bench.py train's pope-kernel row (the 124M model,
head dim 64), A then B, twice. On an H200:
    PYTHONPATH=. python results/kernel/ab_variant.py COPY.py [--step T:tokens,...] [--head_dim 128]"""
import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import model  # noqa: E402
import pope_kernel as pk  # noqa: E402

SHAPES = ((16, 1024), (32, 1024), (8, 4096), (2, 16384))  # (batch, T) of the 124M step's attention

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("variant")
    ap.add_argument("--step")
    ap.add_argument("--head_dim", type=int, default=64, choices=(64, 128))
    a = ap.parse_args()
    if "pope_kernel::" in open(a.variant).read():
        sys.exit(f"{a.variant} redefines pope_kernel's custom ops: sed -i s/pope_kernel::/variant::/ it")
    spec = importlib.util.spec_from_file_location("variant", a.variant)
    var = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(var)
    paths = {"A": (pk._fwd, pk._bwd), "B": (var._fwd, var._bwd)}
    bench.header()
    print(f"# A: pope_kernel.py; B: {a.variant}")
    D, H = a.head_dim, 768 // a.head_dim
    for B, T in SHAPES:
        q, k, v, delta, do = bench.inputs(B, H, T, D, torch.bfloat16, seed=T)
        theta = model.pope_frequencies(D, device="cuda")
        for name, (f, b) in paths.items():
            pk._fwd, pk._bwd = f, b
            errs = bench.rel_errors(lambda q, k, v, d: pk.pope_attention(q, k, v, model.pope_delta(d), theta),
                                    q, k, v, delta, do)
            print(f"{B},{H},{T},{D} {name} rel err vs fp32 out/dq/dk/dv/ddelta "
                  + " ".join(f"{e:.2e}" for e in errs), flush=True)
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
        for rep in range(2):
            for name, (f, b) in paths.items():
                pk._fwd, pk._bwd = f, b
                ks = bench.gpu_kernels(lambda: pk.pope_attention(q, k, v, model.pope_delta(delta), theta)
                                       .backward(do), leaves)
                print(f"{B},{H},{T},{D} {name} sum {sum(us for _, us in ks):8.1f} µs: "
                      + ", ".join(f"{n} {us:.1f}" for n, us in ks[:4]), flush=True)
    for spec in a.step.split(",") if a.step else []:
        T, tokens = (int(x) for x in spec.split(":"))
        for rep in range(2):
            for name, (f, b) in paths.items():
                pk._fwd, pk._bwd = f, b
                print(f"# {name} (run {rep + 1})", flush=True)
                bench.train(T, tokens, ["pope-kernel"])
