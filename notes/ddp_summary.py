"""
Summarise the multi-GPU runs of notes/results_ddp.sh from their metrics.jsonl files.

Usage: python3 notes/ddp_summary.py RUN_ROOT [RUN_ROOT ...]
    RUN_ROOT holds one folder per run (pope-1gpu, pope-2gpu, 1gpu-1337, 2gpu-1337,
    resume, ...); what is there is summarised, what is missing is skipped.
"""

import json
import os
import statistics
import sys


def load(path):
    recs = [json.loads(line) for line in open(path)]
    train = {r["iter"]: r for r in recs if "loss" in r}
    evals = {r["iter"]: r["eval"] for r in recs if "eval" in r}
    return train, evals


def main(roots):
    runs = {}
    for root in roots:
        for name in sorted(os.listdir(root)):
            p = os.path.join(root, name, "metrics.jsonl")
            if os.path.isfile(p):
                runs[name] = load(p)

    # scaling: median tokens/s over the timing windows after warm-up (the first holds compile)
    tok = {}
    for name, (train, _) in runs.items():
        if "gpu" in name and not name[0].isdigit():
            w = [r["tok_per_s"] for it, r in train.items() if it >= 20]
            if w:
                tok[name] = statistics.median(w)
                dts = [r["dt_ms"] for it, r in train.items() if it >= 20]
                print(f"{name}: {tok[name]:,.0f} tok/s, {statistics.median(dts):.1f} ms/step "
                      f"(median of {len(w)} windows of 10 steps)")
    for one in sorted(n for n in tok if "-1gpu" in n):
        two = one.replace("-1gpu", "-2gpu")
        if two in tok:
            s = tok[two] / tok[one]
            print(f"{one.replace('-1gpu', '')}: 2 GPUs / 1 GPU = {s:.3f}x ({s / 2 * 100:.1f}% efficiency)")

    # curves: per-step train loss (mean over the global batch) and periodic val loss
    def compare(a, b, lo=0, hi=10 ** 9):
        ta, tb = runs[a][0], runs[b][0]
        its = sorted(i for i in ta if i in tb and lo <= i < hi)
        if not its:
            return None
        d = [abs(ta[i]["loss"] - tb[i]["loss"]) for i in its]
        # the mean of 20-step windows, which removes most of the batch-to-batch noise
        win = []
        for s in range(its[0], its[-1] + 1, 20):
            ws = [i for i in its if s <= i < s + 20]
            if ws:
                win.append(abs(statistics.mean(ta[i]["loss"] for i in ws) - statistics.mean(tb[i]["loss"] for i in ws)))
        return len(its), statistics.mean(d), max(d), max(win)

    pairs = [("1gpu-1337", "2gpu-1337", "same seed, 1 vs 2 GPUs"), ("1gpu-1338", "2gpu-1338", "same seed, 1 vs 2 GPUs"),
             ("1gpu-1337", "1gpu-1338", "1 GPU, seed vs seed (noise)"), ("2gpu-1337", "2gpu-1338", "2 GPUs, seed vs seed (noise)")]
    printed = False
    for a, b, what in pairs:
        if a in runs and b in runs:
            c = compare(a, b)
            if c:
                if not printed:
                    print("\n|train loss| differences over steps 0..199: steps, mean, max, max of 20-step-window means")
                    printed = True
                print(f"  {a} vs {b} ({what}): {c[0]}, {c[1]:.4f}, {c[2]:.4f}, {c[3]:.4f}")
    names = [n for n in ("1gpu-1337", "2gpu-1337", "1gpu-1338", "2gpu-1338", "resume") if n in runs]
    if names:
        print("\nval loss (eval_iters fixed batches) at steps:")
        for n in names:
            ev = runs[n][1]
            print(f"  {n:10s} " + "  ".join(f"{i}: {ev[i]['val']['loss']:.4f}" for i in sorted(ev)))
        print("train loss, mean of steps 180..199:")
        for n in names:
            t = runs[n][0]
            ws = [t[i]["loss"] for i in range(180, 200) if i in t]
            if ws:
                print(f"  {n:10s} {statistics.mean(ws):.4f}")

    if "resume" in runs and "2gpu-1337" in runs:
        c = compare("resume", "2gpu-1337", 100, 200)
        if c:
            print(f"\nresume (2 GPUs, stopped at 100, resumed to 200) vs uninterrupted 2gpu-1337, steps 100..199: "
                  f"{c[0]} steps, mean |dloss| {c[1]:.5f}, max {c[2]:.5f}")
        ta, tb = runs["resume"][0], runs["2gpu-1337"][0]
        both = [i for i in (100, 101, 102, 150, 199) if i in ta and i in tb]
        print("  " + ", ".join(f"step {i}: {ta[i]['loss']:.4f} vs {tb[i]['loss']:.4f}" for i in both))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    main(sys.argv[1:])
