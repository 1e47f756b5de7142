"""Host time: does launching the autotuner's pick directly (pope_kernel._PICKS, 711a669) shorten the 124M
compiled step where the host is its bound? In turn in one process: RoPE, then the kernel path with every
autotuned launch going through the autotuner (as before 711a669: no pick kept) and with the picks kept, in
that order in even turns and the other in odd ones; --turns times, at batch tokens/T x T, with or without
torch.use_deterministic_algorithms(True).

    git apply results/kernel/picks.diff   # (the picks were not kept: results/kernel.md, "What was tried")
    python results/kernel/picks_ab.py --json results/kernel/picks-ab-det-b16-1024.json --deterministic
"""
import argparse
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # (deterministic cuBLAS needs it)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import torch  # noqa: E402

import bench  # noqa: E402
import pope_kernel as pk  # noqa: E402
from prepare.common import write_json  # noqa: E402


class NoPicks(dict):  # keeps nothing: every autotuned launch runs the autotuner, as before 711a669
    def __setitem__(self, key, value):
        pass


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--block_size", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--deterministic", action="store_true")
    a = ap.parse_args()
    if not hasattr(pk, "_PICKS"):
        sys.exit("error: pope_kernel.py has no _PICKS: git apply results/kernel/picks.diff first")
    out = dict(header=bench.header(), step=[])
    torch.use_deterministic_algorithms(a.deterministic)
    for turn in range(a.turns):
        kernel = [("kernel, autotuner", NoPicks(), "pope-kernel"), ("kernel, picks", {}, "pope-kernel")]
        for label, picks, path in [("rope", {}, "rope")] + kernel[::1 if turn % 2 == 0 else -1]:
            pk._PICKS = picks
            print(f"# turn {turn}: {label}", flush=True)
            out["step"] += [dict(r, deterministic=a.deterministic, turn=turn, launches=label)
                            for r in bench.train(a.block_size, a.tokens, paths=[path])]
    write_json(a.json, out)
