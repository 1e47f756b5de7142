"""The 124M compiled step with gluon_pope.py's kernels in place of pope_kernel.py's training kernels (where
they take the input: bf16, D = 64, causal, no query offset, T a multiple of 128; else pope_kernel's own),
against RoPE and PoPE's PyTorch path: bench.py train's table, rows "pope-kernel" then being the Gluon ones.
Run from the repository root on an H200:
    PYTHONPATH=. python results/kernel/gluon_step.py --block_size T [--tokens N] [--json F]
and `bench.py train` beside it (same T, same call) for the Triton kernel's row."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import gluon_pope  # noqa: E402
import pope_kernel  # noqa: E402

triton_fwd, triton_bwd = pope_kernel._fwd, pope_kernel._bwd


def fwd(q, k, v, delta, theta, causal, sm_scale, q_offset, tune):  # (the custom op looks _fwd up per call)
    f = gluon_pope.pope_fwd if gluon_pope.takes(q, k, causal, q_offset) else triton_fwd
    return f(q, k, v, delta, theta, causal, sm_scale, q_offset, tune)


def bwd(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset):
    f = gluon_pope.pope_bwd if gluon_pope.takes(q, k, causal, q_offset) else triton_bwd
    return f(do, q, k, v, delta, theta, out, lse, causal, sm_scale, q_offset)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--block_size", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--paths", default="rope,pope-kernel,pope-torch")
    ap.add_argument("--json")
    a = ap.parse_args()
    pope_kernel._fwd, pope_kernel._bwd = fwd, bwd
    info = bench.header()
    print("# pope-kernel rows: gluon_pope.py's kernels (results/kernel/gluon_step.py)")
    rows = bench.train(a.block_size, a.tokens, a.paths.split(","))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header=info, rows=rows), f, indent=1)
