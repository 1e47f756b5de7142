"""
Plot val accuracy (or loss) against step from train.py's outputs, one panel per group of runs.

Usage:
    python results/plot_curves.py OUT.png RUN [RUN ...] [--metric acc|loss] [--split val]
    python results/plot_curves.py OUT.png --panel "loss on the target" A/seed* --panel "loss on every token" B/seed*
    python results/plot_curves.py results/indirect_indexing/curves.png \\
        --panel "loss on the target letter" results/indirect_indexing/target/seed13*-{pope,rope,none} \\
        --panel "loss on every token" results/indirect_indexing/all/seed13*-{pope,rope,none} --floor 0.0846

A RUN is a folder holding a metrics.jsonl, or a training log (a .log file, read from its
"step N: ... val loss X acc Y" lines); its name is the curve's label. PoPE solid, RoPE dashed,
NoPE dotted; one colour per seed. Needs matplotlib.
"""
import argparse
import json
import os
import re

from matplotlib.figure import Figure


def seed_of(run):
    """The seed in a run's name (seed1337-pope -> 1337), else the run itself: one colour per seed."""
    m = re.search(r"seed(\d+)", run)
    return m[1] if m else run


def evals(run, split):
    """[(step, {"loss": x, "acc": y})] of one run's evals on split."""
    if run.endswith(".log"):
        pat = re.compile(rf"^step (\d+):.*\b{split} loss ([\d.]+) acc ([\d.]+)")
        found = {int(m[1]): {"loss": float(m[2]), "acc": float(m[3])} for m in map(pat.match, open(run)) if m}
        return sorted(found.items())  # a resumed log repeats its last eval: one point per step
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [(r["iter"], r["eval"][split]) for r in map(json.loads, f) if "eval" in r and split in r["eval"]]


p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("out", help="the PNG to write")
p.add_argument("runs", nargs="*", help="run folders (metrics.jsonl) or .log files: one panel")
p.add_argument("--panel", nargs="+", action="append", default=[], metavar=("TITLE", "RUN"),
               help="a panel: its title, then its runs (repeat for more panels)")
p.add_argument("--metric", default="acc", choices=["acc", "loss"])
p.add_argument("--split", default="val")
p.add_argument("--floor", type=float, default=None, help="a grey line at this value in every panel (e.g. a "
               "task's content floor: prepare/indirect_indexing.content_floor()['valid'])")
a = p.parse_args()
panels = ([("", a.runs)] if a.runs else []) + [(t, runs) for t, *runs in a.panel]
if not panels or not all(runs for _, runs in panels):
    p.error("give runs, or --panel TITLE RUN [RUN ...] with at least one run each")
fig = Figure(figsize=(6.5 * len(panels), 4.5))
for ax, (title, runs) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
    seeds = sorted({seed_of(r) for r in runs})
    for run in runs:
        name = os.path.basename(os.path.normpath(run)).removesuffix(".log")
        pts = evals(run, a.split)
        ax.plot([s for s, _ in pts], [e[a.metric] for _, e in pts], label=name, color=f"C{seeds.index(seed_of(run))}",
                ls="-" if "pope" in name else "--" if "rope" in name else ":")
    if a.floor is not None:
        ax.axhline(a.floor, color="grey", lw=0.8, label=f"floor {a.floor:g}")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{a.split} {a.metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
fig.savefig(a.out + ".tmp.png", dpi=110, bbox_inches="tight")
os.replace(a.out + ".tmp.png", a.out)
print("wrote", a.out)
