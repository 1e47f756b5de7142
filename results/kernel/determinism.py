"""Issue 44 compares the kernel, whose gradients are bitwise deterministic (no atomics: dq has its own kernel),
with PoPE's PyTorch path, whose backward is cuDNN's SDPA. Is that path deterministic; what does it cost made so?

    python results/kernel/determinism.py --json results/kernel/determinism.json [--steps 16384,4096,1024]
    python results/kernel/determinism.py --json results/kernel/determinism-rope.json --paths rope --steps ...
    python results/kernel/determinism.py --json F --no_attention --paths rope,pope-kernel,rope,pope-kernel (A/B)

Attention alone, at the 124M step's shapes (12 heads, D=64, bf16, 32k tokens): each path's forward+backward 5
times on the same inputs, the gradients compared bitwise with the first run's; the graphed forward+backward's
median ms (bench.graph_ms) and its longest kernels; first as PyTorch runs by default, then under
torch.use_deterministic_algorithms(True). Then, for each T of --steps, bench.train's 124M compiled step of
--paths under torch.use_deterministic_algorithms(True) (the default's: results/kernel/train-T.json).
"""
import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (deterministic cuBLAS needs it)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402

import bench  # noqa: E402
import pope_kernel as pk  # noqa: E402
from model import pope_attention_torch, pope_delta, pope_frequencies  # noqa: E402
from prepare.common import write_json  # noqa: E402


def attention(deterministic):
    torch.use_deterministic_algorithms(deterministic)
    rows = []
    for B, T in ((32, 1024), (8, 4096), (2, 16384)):
        q, k, v, delta, do = bench.inputs(B, 12, T, 64, torch.bfloat16, seed=T)
        theta = pope_frequencies(64, device="cuda")
        leaves = [x.requires_grad_(True) for x in (q, k, v, delta)]
        paths = {"pope-kernel": lambda: pk.pope_attention(q, k, v, pope_delta(delta), theta),
                 "pope-torch": lambda: pope_attention_torch(q, k, v, pope_delta(delta))}
        for path, f in paths.items():
            r = dict(path=path, deterministic=deterministic, batch=B, block_size=T)
            grads = [torch.autograd.grad(f(), leaves, do) for _ in range(5)]
            r["runs_differing"] = sum(any(not torch.equal(a, b) for a, b in zip(g, grads[0]))
                                      for g in grads[1:])
            grads = None
            r["graph_ms"] = bench.graph_ms(lambda: f().backward(do), leaves)
            r["kernels"] = bench.gpu_kernels(lambda: f().backward(do), leaves)[:4]
            for x in leaves:
                x.grad = None
            print(r, flush=True)
            rows.append(r)
    torch.use_deterministic_algorithms(False)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--steps", default="16384", help="comma-separated contexts T of the 124M step, or ''")
    ap.add_argument("--paths", default="pope-kernel,pope-torch", help="the step's, as bench.py train --paths")
    ap.add_argument("--tokens", type=int, default=32768, help="tokens a step, as bench.py train --tokens")
    ap.add_argument("--no_attention", action="store_true", help="the steps alone")
    a = ap.parse_args()
    out = dict(header=bench.header(), step=[],
               attention=[] if a.no_attention else attention(False) + attention(True))
    torch.use_deterministic_algorithms(True)
    for T in [int(t) for t in a.steps.split(",") if t]:
        out["step"] += [dict(r, deterministic=True) for r in bench.train(T, a.tokens, paths=a.paths.split(","))]
    write_json(a.json, out)
