"""
Plot val accuracy (or loss) against step from train.py's metrics.jsonl files.

Usage:
    python results/plot_curves.py OUT.png RUN_DIR [RUN_DIR ...] [--metric acc|loss] [--split val]
    python results/plot_curves.py results/indirect_indexing/curves.png results/indirect_indexing/seed13*-*

Each RUN_DIR holds a metrics.jsonl; its folder name is the curve's label. Needs matplotlib.
"""
import argparse
import json
import os

from matplotlib.figure import Figure

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("out", help="the PNG to write")
p.add_argument("runs", nargs="+", help="folders holding a metrics.jsonl")
p.add_argument("--metric", default="acc", choices=["acc", "loss"])
p.add_argument("--split", default="val")
a = p.parse_args()
fig = Figure(figsize=(7, 4.5))
ax = fig.subplots()
for run in a.runs:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if "eval" in r and a.split in r["eval"]]
    ax.plot([r["iter"] for r in evals], [r["eval"][a.split][a.metric] for r in evals],
            label=os.path.basename(os.path.normpath(run)), ls="-" if "pope" in run else "--")
ax.set_xlabel("step")
ax.set_ylabel(f"{a.split} {a.metric}")
ax.grid(alpha=0.3)
ax.legend()
fig.savefig(a.out + ".tmp.png", dpi=110, bbox_inches="tight")
os.replace(a.out + ".tmp.png", a.out)
print("wrote", a.out)
