"""
A/B timing of the forward kernel with pointer loads (pope_kernel.py) against a variant
of it, on one CUDA GPU: each of the forward's D=64 launch configs at four shapes, the
two modules in one process, median ms of `_fwd` (key pre-pass included) and the largest
output difference between the two.

Usage:
    cp pope_kernel.py /tmp/pk_tma.py && patch /tmp/pk_tma.py results/kernel/tma-forward.diff
    python results/kernel/tma_ab.py /tmp/pk_tma.py > results/kernel/tma-ab.txt

tma-forward.diff is the variant measured in results/kernel.md: the forward's key and
value tiles loaded through device-side TMA tensor descriptors (tl.make_tensor_descriptor)
instead of pointer arithmetic.
"""
import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import pope_kernel as pk  # noqa: E402
from bench import bench_ms, frequencies, inputs  # noqa: E402
from model import pope_delta  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("variant", help="path of the variant pope_kernel.py")
a = ap.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("error: tma_ab.py needs a CUDA GPU")
spec = importlib.util.spec_from_file_location("pope_kernel_variant", a.variant)
variant = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variant)
D, configs = 64, list(pk._BLOCKS["fwd"][64])
print(f"# fwd ms (pre-pass included), pointer loads vs {a.variant}: {torch.cuda.get_device_name()}, "
      f"torch {torch.__version__}", flush=True)
for mod in (pk, variant):
    mod._AUTOTUNE = False  # _fwd launches _BLOCKS["fwd"][D][0]
for B, T in ((8, 1024), (16, 1024), (2, 4096), (1, 16384)):
    H = 12
    q, k, v, delta, do = inputs(B, H, T, T, D, torch.bfloat16, seed=T)
    args = (q, k, v, pope_delta(delta), frequencies(D, q.device), True, D ** -0.5, 0)
    for cfg in configs:
        res = []
        for mod in (pk, variant):
            mod._BLOCKS["fwd"][64] = [cfg]
            out = mod._fwd(*args)[0]
            res.append((bench_ms(lambda: mod._fwd(*args)), out))
        diff = (res[0][1].float() - res[1][1].float()).abs().max().item()
        print(f"{B},{H},{T},{D} {str(cfg):18s} pointers {res[0][0]:.4f}  variant {res[1][0]:.4f}  "
              f"ratio {res[1][0] / res[0][0]:.3f}  max|diff| {diff:.1e}", flush=True)
