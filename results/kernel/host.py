"""Where the host time of PoPE's kernel path goes: one layer's attention at a shape too small for the GPU to
matter (B=1, H=12, T=128, D=64, bf16), host µs per call (wall clock over 300 calls, launches not waited
on), by part, against RoPE's SDPA and PoPE's PyTorch path; then cProfile's top functions of the kernel's
forward+backward without autograd (_fwd, _bwd: the work behind each custom op).

    python results/kernel/host.py > results/kernel/host.txt
"""
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench  # noqa: E402
import pope_kernel as pk  # noqa: E402
from model import pope_attention_torch, pope_delta, pope_frequencies  # noqa: E402


def host_us(f, n=300):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


if __name__ == "__main__":
    bench.header()
    q, k, v, delta, do = bench.inputs(1, 12, 128, 64, torch.bfloat16, seed=0)
    theta, d = pope_frequencies(64, device="cuda"), pope_delta(delta).float().contiguous()
    leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
    out, lse = pk._fwd(q, k, v, d, theta, True, 0.125, 0, True)
    c = (True, 0.125, 0)  # causal, sm_scale, q_offset
    sdpa = F.scaled_dot_product_attention
    parts = {
        "rope: SDPA fwd+bwd (autograd)": lambda: sdpa(q, k, v, is_causal=True).backward(do),
        "pope-torch: fwd+bwd (autograd)": lambda: pope_attention_torch(q, k, v, pope_delta(delta)).backward(do),
        "pope-kernel: fwd+bwd (autograd)": lambda: pk.pope_attention(q, k, v, pope_delta(delta), theta).backward(
            do),
        "pope-kernel: fwd custom op": lambda: torch.ops.pope_kernel.fwd(q, k, v, d, theta, *c, True),
        "pope-kernel: _fwd (2 launches)": lambda: pk._fwd(q, k, v, d, theta, *c, True),
        "pope-kernel: bwd custom op": lambda: torch.ops.pope_kernel.bwd(do, q, k, v, d, theta, out, lse, *c),
        "pope-kernel: _bwd (4 launches, a sum)": lambda: pk._bwd(do, q, k, v, d, theta, out, lse, *c),
        "pope-kernel: _cartesian (1 launch)": lambda: pk._cartesian(k, theta, d, 0),
        "torch.empty x 4": lambda: [torch.empty((1, 12, 128, 64), device="cuda", dtype=torch.bfloat16)
                                    for _ in range(4)],
    }
    for name, f in parts.items():
        with torch.enable_grad() if "autograd" in name else torch.no_grad():
            print(f"{name:40s} {host_us(f):8.1f} us", flush=True)
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(200):
            pk._fwd(q, k, v, d, theta, True, 0.125, 0, True)
            pk._bwd(do, q, k, v, d, theta, out, lse, True, 0.125, 0)
        prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(30)
