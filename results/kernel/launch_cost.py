"""
Host time of one Triton launch of the PoPE kernels, four ways, on one CUDA GPU: through pope_kernel's wrapper
(allocation included), through Triton's JIT launch (`kernel[grid](...)`: argument binding, specialisation key, cache
lookup), through the compiled kernel's runner (`compiled[grid](...)`, the binding skipped) and through its bare
launcher (`compiled.run(...)` with the stream and arguments prepared once). Microseconds per launch, n launches
queued without a sync, at a shape small enough that the GPU never holds the host back.

Usage:
    python results/kernel/launch_cost.py > results/kernel/launch-cost.txt
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import pope_kernel as pk  # noqa: E402
from model import pope_frequencies  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--n", type=int, default=300, help="launches per measurement")
a = ap.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("error: launch_cost.py needs a CUDA GPU")
import triton  # noqa: E402
from triton import knobs  # noqa: E402


def per_launch_us(f, n=a.n):
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


B, H, T, D = 1, 2, 128, 64
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
theta, delta = pope_frequencies(D, device="cuda"), torch.zeros(H, D, device="cuda")
kc = torch.empty(B, H, T, 2 * D, device="cuda", dtype=q.dtype)
out, lse = torch.empty_like(q), torch.empty(B, H, T, device="cuda")
launches = {
    "key pre-pass (_cartesian_kernel)": (
        pk._cartesian_kernel, (pk._cdiv(T, pk._PREP_BLOCK_T), B * H),
        (k, kc, theta, delta, k, k, kc, *k.stride(), *k.stride(), *k.stride(), H, T, 0),
        dict(HEAD_DIM=D, BLOCK_T=pk._PREP_BLOCK_T, HAS_DELTA=True, WITH_DI=False), dict(num_warps=4)),
    "forward (_pope_fwd), 64x64/4/3": (
        pk._pope_fwd, (pk._cdiv(T, 64), B * H),
        (q, kc, v, out, lse, theta, *q.stride(), *v.stride(), *out.stride(), D ** -0.5 * 1.4426950408889634,
         H, T, T, 0, pk._bucket(T), pk._bucket(T)),
        dict(HEAD_DIM=D, BLOCK_M=64, BLOCK_N=64, CAUSAL=True, DOT_PREC="tf32"), dict(num_warps=4, num_stages=3)),
}
print(f"# host µs per launch, {a.n} launches queued: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
      f"triton {triton.__version__}", flush=True)
print(f"{'pope_kernel._cartesian (wrapper, allocates)':48s} {per_launch_us(lambda: pk._cartesian(k, theta, delta, 0)):8.1f}")
for name, (kernel, grid, args, consts, opts) in launches.items():
    compiled = kernel[grid](*args, **consts, **opts)
    full = list(args) + [consts[n] for n in kernel.arg_names[len(args):]]  # every parameter, constexprs too
    device = torch.cuda.current_device()
    stream = triton.runtime.driver.active.get_current_stream(device)
    runner = compiled[(*grid, 1)]  # (a runner takes a 3-d grid)
    bare = (grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, None,
            knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *full)
    print(f"{name:48s} JIT {per_launch_us(lambda: kernel[grid](*args, **consts, **opts)):8.1f}   "
          f"compiled runner {per_launch_us(lambda: runner(*full)):8.1f}   "
          f"bare launcher {per_launch_us(lambda: compiled.run(*bare)):8.1f}", flush=True)
print(f"{'torch.empty (B,H,T,2D)':48s} {per_launch_us(lambda: torch.empty(B, H, T, 2 * D, device='cuda')):8.1f}")
kernel, grid, args, consts, opts = launches["key pre-pass (_cartesian_kernel)"]  # the bare launcher's output
compiled = kernel[grid](*args, **consts, **opts)
torch.cuda.synchronize()
ref = kc.clone()
kc.zero_()
full = list(args) + [consts[n] for n in kernel.arg_names[len(args):]]
compiled.run(grid[0], grid[1], 1, triton.runtime.driver.active.get_current_stream(torch.cuda.current_device()),
             compiled.function, compiled.packed_metadata, None, None, None, *full)
torch.cuda.synchronize()
print(f"# the bare launcher's key pre-pass output equals the JIT launch's: {torch.equal(ref, kc)}")
