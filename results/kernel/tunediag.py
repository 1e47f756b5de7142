"""How stable is the autotuner's pick for each attention kernel, and what does each D=64 launch config of
a kernel cost inside a forward+backward replayed as a CUDA graph (the other kernels as last tuned)?
Causal, bf16, B*T = 16k tokens, 12 heads. Four fresh tunings per shape (Triton's disk cache off), then
every config of each kernel forced in turn: graph ms (median of 3) and that kernel's GPU us.
Made results/kernel/tunediag.txt (one H200, 2026-12-02; pope_kernel.py as of that day, with the dq list
it had before: 64x64/4/3, 64x64/4/2, 64x32/4/3, 128x64/8/4).

usage: python results/kernel/tunediag.py   (from the repository root, on a CUDA GPU)"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import pope_kernel as pk
from bench import inputs, pope_delta, frequencies, graph_ms, gpu_kernels

tuners = {"fwd": pk._pope_fwd_tuned, "dkdv": pk._pope_bwd_dkdv_tuned, "dq": pk._pope_bwd_dq_tuned}
names = {"fwd": "_pope_fwd", "dkdv": "_pope_bwd_dkdv", "dq": "_pope_bwd_dq"}
for B, T in ((16, 1024), (2, 4096), (1, 16384)):
    H, D = 12, 64
    q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
    leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
    theta = frequencies(D, q.device)
    step = lambda: pk.pope_attention(q, k, v, pope_delta(delta), theta).backward(do)
    # 1. the autotuner's pick, 4 fresh tunings
    for trial in range(4):
        for t in tuners.values():
            t.cache.clear()
            t.cache_results = False
        pk._CHOSEN.clear()
        step()
        torch.cuda.synchronize()
        for kind, t in tuners.items():
            best = t.best_config
            tim = sorted(((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages), round(x[0] * 1000, 1))
                         for c, x in t.configs_timings.items())
            print(f"{B},{H},{T} trial {trial} {kind:5s} picked {(best.kwargs['BLOCK_M'], best.kwargs['BLOCK_N'], best.num_warps, best.num_stages)}  "
                  f"timings us {tim}", flush=True)
    # 2. each config of each kernel forced (others as tuned in the last trial), graph ms and that kernel's GPU us
    for kind, t in tuners.items():
        chosen_other = dict(pk._CHOSEN)
        for cfg in pk._BLOCKS[kind][64]:
            pk._CHOSEN.clear()
            pk._CHOSEN.update(chosen_other)
            key = next(kk for kk in chosen_other if kk[0] is t)
            pk._CHOSEN[key] = {**chosen_other[key], "BLOCK_M": cfg[0], "BLOCK_N": cfg[1], "num_warps": cfg[2], "num_stages": cfg[3]}
            ms = sorted(graph_ms(step, leaves) for _ in range(3))[1]
            us = dict(gpu_kernels(step, leaves)).get(names[kind], float("nan"))
            print(f"{B},{H},{T} forced {kind:5s} {cfg}  graph {ms:.4f} ms  {names[kind]} {us:.1f} us", flush=True)
        pk._CHOSEN.clear()
        pk._CHOSEN.update(chosen_other)
    for x in leaves:
        x.grad = None
