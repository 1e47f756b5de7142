"""
How far PoPE's phase bias delta moved in trained checkpoints: a markdown table.

Usage:
    python results/delta_stats.py RUN/ckpt.pt ...

For each checkpoint: the bound it was trained with (model.pope_delta), and over all
layers' delta entries the phase each one applies, pope_delta(parameter, bound), as an
angle in (-pi, pi] (cos is 2pi-periodic: -2pi and 0 are the same phase). "moved" is
the share of entries whose phase is more than 0.01 rad from 0, the zero init of the
language models; for a uniform init the table still shows the spread of the phases.
The last column is the share of parameters outside [-2pi, 0], where the clamp gives no gradient.
"""

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from model import pope_delta, read_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpts", nargs="+", help="train.py checkpoints (ckpt.pt) of PoPE models")
    args = ap.parse_args()
    rows = []  # every checkpoint checked before the table starts: an error is its own line
    for path in args.ckpts:
        ckpt = read_checkpoint(path)
        bound = ckpt["model_args"]["pope_delta_bound"]
        raw = [v.double() for k, v in ckpt["model"].items() if k.endswith("attn.delta")]
        if not raw:
            sys.exit(f"error: {path} has no PoPE delta "
                     f"(pos_emb={ckpt['model_args'].get('pos_emb')!r}); "
                     "pass PoPE checkpoints only")
        raw = torch.cat([r.flatten() for r in raw])
        used = pope_delta(raw, bound)
        phase = torch.atan2(torch.sin(used), torch.cos(used)).abs()
        frozen = ((raw > 0) | (raw < -2 * math.pi)).double().mean().item()
        run = os.path.basename(os.path.dirname(os.path.abspath(path)))
        rows.append(f"| {run} | {bound} | {raw.numel()} | "
                    f"{(phase > 0.01).double().mean().item():.1%} | "
                    f"{phase.median().item():.3f} | {frozen:.1%} |")
    print("| run | bound | entries | moved (> 0.01 rad) | median abs phase, rad | "
          "parameter outside [-2pi, 0] (no gradient under the clamp) |")
    print("|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
