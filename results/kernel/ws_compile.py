"""
Does Triton's automatic warp specialization work for the PoPE forward on Hopper? Compiles, for sm_90 and without a
GPU, pope_kernel.py's forward with its key loop as tl.range(..., warp_specialize=True) (the patch below, applied to a
copy), in three launch configs, and prints registers, spills, shared memory, whether the PTX sets per-warp register
counts (setmaxnreg: the sign of a specialized kernel) and how many wgmma it issues, or the compile error.

Usage:
    python results/kernel/ws_compile.py > results/kernel/ws-compile.txt   (its last line: the failed pass, from stderr)
"""
import argparse
import importlib.util
import os
import sys
import tempfile

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)
import bench  # noqa: E402
import model as model_lib  # noqa: E402

argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
import triton  # noqa: E402

loop = "for start_n in range(lo_hi[0], lo_hi[1], BLOCK_N):"
src = open(os.path.join(ROOT, "pope_kernel.py")).read()
i = src.index(loop, src.index("def _fwd_inner("))
src = src[:i] + "for start_n in tl.range(lo_hi[0], lo_hi[1], BLOCK_N, warp_specialize=True):" + src[i + len(loop):]
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write(src)
spec = importlib.util.spec_from_file_location("pope_kernel_ws", f.name)
pk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pk)
calls = []
pk._launch = lambda kernel, tuned, blocks, grid, args, kwargs, key: calls.append((kernel, args, kwargs)) or 64


class Prepass:  # the key pre-pass is not compiled here
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


pk._cartesian_kernel = Prepass()
B, H, T, D = 1, 2, 256, 64
q, k, v = (torch.randn(B, H, T, D, dtype=torch.bfloat16) for _ in range(3))
pk._fwd(q, k, v, torch.zeros(H, D), model_lib.pope_frequencies(D), True, D ** -0.5, 0)
kernel, args, kwargs = calls[0]
target = triton.backends.compiler.GPUTarget("cuda", 90, 32)
print(f"# pope_kernel.py forward, key loop with warp_specialize=True, sm_90, D={D} bf16 causal, triton {triton.__version__}")
for bm, bn, w, s in ((64, 64, 4, 3), (128, 64, 4, 3), (128, 128, 8, 3)):
    try:
        c = bench._aot_compile(kernel, args, dict(kwargs, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s), target)
        ptx = c.asm["ptx"]
        print(f"{(bm, bn, w, s)}  compiled: {bench._resources(c)}, shared {c.metadata.shared}, "
              f"setmaxnreg {'setmaxnreg' in ptx}, wgmma {ptx.count('wgmma.mma_async')}", flush=True)
    except Exception as e:
        print(f"{(bm, bn, w, s)}  failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
os.unlink(f.name)
