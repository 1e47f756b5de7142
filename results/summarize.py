"""
Markdown tables and curves from train.py's outputs: eval.json, metrics.jsonl and training logs.

Usage:
    python results/summarize.py RUN/eval.json ...                 # final loss/accuracy per run, mean ± std over seeds
    python results/summarize.py RUN/metrics.jsonl ...             # last eval, median ms/step and tokens/s per run
    python results/summarize.py --curve RUN/metrics.jsonl ...     # val loss at every eval step, one row per run
    python results/summarize.py --takeoff 15,50 RUN/metrics.jsonl ...   # first eval step with val acc above 15%, 50%
                                                   (a training log, RUN.log, works in place of a metrics.jsonl)
    python results/summarize.py --diff A/metrics.jsonl B/metrics.jsonl [C D ...]
                                    # pairs A-B, C-D: per-step |train loss difference| and tokens/s B / A
    python results/summarize.py --plot OUT.png --panel "loss on the target" A/seed*/metrics.jsonl \\
                                               --panel "loss on every token" B/seed*.log --floor 0.0846
                                    # val accuracy (--metric loss: loss) against step, one panel per --panel
                                    # (or one untitled panel of the files given); needs matplotlib
    python results/summarize.py --extrapolation results/lm/extrapolation.json [--plot OUT.png] \\
                                              [--labels PoPE,RoPE,RoPE+YaRN]
                                    # eval_extrapolation.py --json: perplexity by length and NLL by position
                                    # bucket in the longest windows, mean ± std over seeds per group (--labels:
                                    # these groups, in this order); --plot: mean over seeds, band min to max

A run is named after its folder (results/lm/seed1337-pope/eval.json -> seed1337-pope),
or after the file (jsb-pope-1337-eval.json -> jsb-pope-1337). Runs whose names differ
only in the seed (seed1337, -1337, -s1337) form one group; groups of two or more get
a mean ± std (sample std) row. In --extrapolation the seed may sit before a suffix
(RoPE-s1337+YaRN -> group RoPE+YaRN). Accuracy is the greedy next-token accuracy over the
scored tokens, in %.
"""

import argparse
import json
import math
import os
import re
import statistics


def run_name(path):
    base = os.path.basename(path)
    if base.endswith(".log"):
        return base[:-4]
    if base in ("eval.json", "metrics.jsonl"):
        return os.path.basename(os.path.dirname(os.path.abspath(path)))
    return re.sub(r"([-.]eval)?\.(json|jsonl)$", "", base)


def load(path):
    """(evals {iter: {split: {loss, acc}}}, train {iter: record}) of one file."""
    if path.endswith(".log"):  # a training log's "step N: train loss a acc b, val loss x acc y" lines
        evals = {}
        for m in re.finditer(r"^step (\d+): (.*)$", open(path).read(), flags=re.M):
            evals[int(m[1])] = {k: {"loss": float(x), "acc": float(y)}
                                for k, x, y in re.findall(r"(\w+) loss ([\d.]+) acc ([\d.]+)", m[2])}
        return evals, {}
    if path.endswith(".jsonl"):
        recs = [json.loads(line) for line in open(path) if line.strip()]
        evals = {r["iter"]: r["eval"] for r in recs if "eval" in r}
        train = {r["iter"]: r for r in recs if "loss" in r}  # a resumed run's later record wins
        return evals, train
    r = json.load(open(path))
    return {r["iter"]: {k: v for k, v in r.items() if isinstance(v, dict)}}, {}


def group_name(name):
    """name without its seed (seed1337, -1337, -s1337, anywhere in it): seed1337-pope -> pope,
    RoPE-s1337+YaRN -> RoPE+YaRN."""
    return re.sub(r"[-_]?(seed|s)?\d{3,}", "", name).strip("-_") or name


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, nd):
    return "" if x is None else f"{x:,.{nd}f}"


def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def summary(paths, skip, ppl):
    runs = {run_name(p): load(p) for p in paths}
    splits = sorted({s for ev, _ in runs.values() for e in ev.values() for s in e},
                    key=lambda s: ("train", "val", "test").index(s) if s in ("train", "val", "test") else 9)
    cols = []  # (name, digits, function of (evals, train))
    for s in splits:
        cols.append((f"{s} loss", 4, lambda ev, tr, s=s: ev[max(ev)].get(s, {}).get("loss") if ev else None))
        if ppl:
            cols.append((f"{s} ppl", 2, lambda ev, tr, s=s: math.exp(ev[max(ev)][s]["loss"])
                         if ev and s in ev[max(ev)] else None))
        cols.append((f"{s} acc %", 2, lambda ev, tr, s=s: 100 * ev[max(ev)][s]["acc"]
                     if ev and "acc" in ev[max(ev)].get(s, {}) else None))
    if any(tr for _, tr in runs.values()):
        cols.append(("ms/step", 1, lambda ev, tr: median([r["dt_ms"] for i, r in tr.items() if i >= skip])))
        cols.append(("tokens/s", 0, lambda ev, tr: median([r["tok_per_s"] for i, r in tr.items() if i >= skip])))
    vals = {n: [f(ev, tr) for _, _, f in cols] for n, (ev, tr) in runs.items()}
    keep = [j for j in range(len(cols)) if any(v[j] is not None for v in vals.values())]  # drop empty columns
    cols, vals = [cols[j] for j in keep], {n: [v[j] for j in keep] for n, v in vals.items()}
    rows = [[n, str(max(runs[n][0])) if runs[n][0] else ""] + [fmt(v, c[1]) for v, c in zip(vals[n], cols)]
            for n in runs]
    print(table(["run", "step"] + [c[0] for c in cols], rows))

    groups = {}
    for n in runs:
        groups.setdefault(group_name(n), []).append(n)
    grows = []
    for g, names in groups.items():
        if len(names) < 2:
            continue
        row = [g, str(len(names))]
        for j, (_, nd, _) in enumerate(cols):
            xs = [vals[n][j] for n in names if vals[n][j] is not None]
            row.append(f"{statistics.mean(xs):,.{nd}f} ± {statistics.stdev(xs):,.{nd}f}" if len(xs) > 1
                       else fmt(xs[0] if xs else None, nd))
        grows.append(row)
    if grows:
        print()
        print(table(["group", "runs"] + [c[0] for c in cols], grows))


def curve(paths, split):
    runs = {run_name(p): load(p)[0] for p in paths}
    its = sorted({i for ev in runs.values() for i in ev})
    rows = [[n] + [fmt(ev[i][split]["loss"], 4) if i in ev and split in ev[i] else "" for i in its]
            for n, ev in runs.items()]
    print(f"{split} loss at step")
    print(table(["run"] + [str(i) for i in its], rows))


def takeoff(paths, split, thresholds):
    """Per run: the first eval step whose accuracy exceeds each threshold (%), '–' if none."""
    rows = []
    for p in paths:
        ev = load(p)[0]
        its = sorted(i for i in ev if "acc" in ev[i].get(split, {}))
        first = [next((str(i) for i in its if 100 * ev[i][split]["acc"] > t), "–") for t in thresholds]
        rows.append([run_name(p)] + first + [fmt(100 * ev[its[-1]][split]["acc"], 2) if its else ""])
    print(table(["run"] + [f"first step, {split} acc > {t:g}%" for t in thresholds] + [f"last {split} acc %"], rows))


def legend_names(paths):
    """Each file's run name; where two files of a panel share one (seed1337-pope of two variants), each
    prefixed with the folder its run folder is in (all-shift_token/seed1337-pope)."""
    names = [run_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(p))))}/{n}" for p, n in zip(paths, names)]


def plot(out, panels, split, metric, floor):
    """One panel per (title, files): the eval metric against step; PoPE solid, RoPE dashed, else dotted."""
    from matplotlib.figure import Figure  # optional: only --plot needs it
    fig = Figure(figsize=(6.5 * len(panels), 4.5))
    for ax, (title, paths) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        names = legend_names(paths)
        runs = [re.sub(r"pope|rope|none", "", n) for n in names]  # a name without its pos_emb: one colour each
        colours = sorted(set(runs))
        for p, name, run in zip(paths, names, runs):
            ev = load(p)[0]
            its = sorted(i for i in ev if split in ev[i])
            ax.plot(its, [ev[i][split][metric] for i in its], label=name, color=f"C{colours.index(run)}",
                    ls="-" if "pope" in name else "--" if "rope" in name else ":")
        if floor is not None:
            ax.axhline(floor, color="grey", lw=0.8, label=f"floor {floor:g}")
        ax.set(title=title, xlabel="step", ylabel=f"{split} {metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(out + ".tmp.png", dpi=110, bbox_inches="tight")
    os.replace(out + ".tmp.png", out)
    print("wrote", out)


def mean_std(xs, nd):
    """'mean ± std' (sample std) of xs, the value alone for one, 'inf' where one is infinite (null in the JSON)."""
    if any(x is None or math.isinf(x) for x in xs):
        return "inf"
    return f"{statistics.mean(xs):,.{nd}f} ± {statistics.stdev(xs):,.{nd}f}" if len(xs) > 1 else f"{xs[0]:,.{nd}f}"


def load_extrapolation(path, labels):
    """(lengths, {group: [series, ...]}) of an eval_extrapolation.py --json file; groups in order of first
    appearance, or those of labels (a list) in its order."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found")
    try:
        r = json.load(open(path))
        lengths, models = [int(L) for L in r["lengths"]], r["models"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"error: {path} is not an eval_extrapolation.py --json file (no lengths and models); "
                         "write one with eval_extrapolation.py --json")
    groups = {}
    for label, m in models.items():
        groups.setdefault(group_name(label), []).append(m)
    if labels:
        missing = [g for g in labels if g not in groups]
        if missing:
            raise SystemExit(f"error: --labels {','.join(missing)}: no such group in {path}; "
                             f"the groups are {','.join(groups)}")
        groups = {g: groups[g] for g in labels}
    return lengths, groups


def extrapolation(path, labels, out):
    lengths, groups = load_extrapolation(path, labels)
    Lmax = max(lengths)
    rows = [[g, str(len(ms))] + [mean_std([m["results"][str(L)]["ppl"] for m in ms], 1) for L in lengths]
            for g, ms in groups.items()]
    print("perplexity by context length (mean ± std over seeds)")
    print(table(["group", "seeds"] + [str(L) for L in lengths], rows))
    buckets = [(b["start"], b["end"]) for b in next(iter(groups.values()))[0]["results"][str(Lmax)]["buckets"]]
    rows = [[f"{a}–{b - 1}"] + [mean_std([m["results"][str(Lmax)]["buckets"][i]["nll"] for m in ms], 4)
                                for ms in groups.values()] for i, (a, b) in enumerate(buckets)]
    print()
    print(f"NLL (nats/token) by position, windows of {Lmax} tokens (mean ± std over seeds)")
    print(table(["positions"] + list(groups), rows))
    if out:
        plot_extrapolation(out, lengths, groups)


def plot_extrapolation(out, lengths, groups):
    """Perplexity against length and NLL by position bucket: per group the mean over its seeds, a band from
    the min to the max; the legend below both panels, outside the axes, so that it covers no curve."""
    from matplotlib.figure import Figure  # optional: only --plot needs it
    nrows = -(-len(groups) // 6)
    ncol = -(-len(groups) // nrows)  # up to 6 columns, the rows balanced
    fig = Figure(figsize=(13, 4.5 + 0.25 * nrows), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    Lmax = max(lengths)

    def value(x):  # null (infinite) in the JSON: a gap
        return math.nan if x is None or math.isinf(x) else x

    for i, (g, ms) in enumerate(groups.items()):
        style = dict(color=f"C{i % 10}", ls="-" if i < 10 else "--")  # past 10 colours, dashed
        buckets = ms[0]["results"][str(Lmax)]["buckets"]
        for a, xs, ys, marker in (
                (ax, lengths, [[value(m["results"][str(L)]["ppl"]) for m in ms] for L in lengths], "o"),
                (bx, [(b["start"] + b["end"] - 1) / 2 for b in buckets],
                 [[value(m["results"][str(Lmax)]["buckets"][j]["nll"]) for m in ms] for j in range(len(buckets))], ".")):
            a.plot(xs, [statistics.mean(y) for y in ys], marker=marker, label=f"{g} ({len(ms)})", **style)
            if len(ms) > 1:
                a.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=style["color"], alpha=0.2, lw=0)
    for T in sorted({m["block_size"] for ms in groups.values() for m in ms}):  # the training contexts
        for a in (ax, bx):
            a.axvline(T, color="gray", linestyle=":", linewidth=1)
    ax.set(yscale="log", xlabel="context length (tokens)", ylabel="perplexity", title="Perplexity against length")
    bx.set(xlabel="position in the window (bucket centre)", ylabel="NLL (nats/token)",
           title=f"NLL by position, windows of {Lmax} tokens")
    for a in (ax, bx):
        a.grid(True, which="both", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=ncol, fontsize=8,
               title="group (seeds): mean over seeds, band min to max; dotted: training context")
    fig.savefig(out + ".tmp.png", dpi=120)
    os.replace(out + ".tmp.png", out)
    print("wrote", out)


def diff(paths, lo, hi, window, skip):
    if len(paths) % 2:
        raise SystemExit("error: --diff takes pairs of metrics.jsonl files")
    rows = []
    for a, b in zip(paths[::2], paths[1::2]):
        ta, tb = load(a)[1], load(b)[1]
        its = sorted(i for i in ta if i in tb and lo <= i < hi)
        if not its:
            raise SystemExit(f"error: {a} and {b} share no logged steps in [{lo}, {hi})")
        d = [abs(ta[i]["loss"] - tb[i]["loss"]) for i in its]
        win = []  # means over `window`-step windows remove most of the batch-to-batch noise
        for s in range(its[0], its[-1] + 1, window):
            ws = [i for i in its if s <= i < s + window]
            win.append(abs(statistics.mean(ta[i]["loss"] for i in ws) - statistics.mean(tb[i]["loss"] for i in ws)))
        tok_a = median([r["tok_per_s"] for i, r in ta.items() if i >= skip])
        tok_b = median([r["tok_per_s"] for i, r in tb.items() if i >= skip])
        rows.append([f"{run_name(a)} vs {run_name(b)}", f"{its[0]}–{its[-1]} ({len(its)})", fmt(statistics.mean(d), 4),
                     fmt(max(d), 4), fmt(max(win), 4), fmt(tok_b / tok_a, 3) if tok_a and tok_b else ""])
    print("absolute difference of the logged train losses (each the mean over its global batch)")
    print(table(["runs A vs B", "steps (logged)", "mean", "max", f"max of {window}-step means", "tokens/s B / A"], rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="eval.json, metrics.jsonl and/or training .log files")
    ap.add_argument("--curve", action="store_true", help="the eval loss at every eval step, one row per run")
    ap.add_argument("--split", default="val", help="the split of --curve and --takeoff (default val)")
    ap.add_argument("--takeoff", default=None, metavar="PCT,PCT",
                    help="the first eval step whose accuracy exceeds each of these percentages, one row per run")
    ap.add_argument("--diff", action="store_true", help="compare pairs of metrics.jsonl files (train loss, tokens/s)")
    ap.add_argument("--from", dest="lo", type=int, default=0, help="--diff: first step compared (default 0)")
    ap.add_argument("--to", dest="hi", type=int, default=10**12, help="--diff: compare steps below this one")
    ap.add_argument("--window", type=int, default=20, help="--diff: steps per window of means (default 20)")
    ap.add_argument("--skip", type=int, default=20,
                    help="timings from this step on (the first windows hold compilation; default 20)")
    ap.add_argument("--ppl", action="store_true", help="add perplexity columns, exp(loss)")
    ap.add_argument("--plot", default=None, metavar="OUT.png", help="draw the eval curves to this PNG")
    ap.add_argument("--panel", nargs="+", action="append", default=[], metavar=("TITLE", "FILE"),
                    help="--plot: a panel, its title then its metrics.jsonl / .log files (repeat for more)")
    ap.add_argument("--metric", default="acc", choices=["acc", "loss"], help="--plot: the metric (default acc)")
    ap.add_argument("--floor", type=float, default=None,
                    help="--plot: a grey line at this value in every panel (e.g. a task's content floor)")
    ap.add_argument("--extrapolation", default=None, metavar="JSON",
                    help="tables (and with --plot a figure) of an eval_extrapolation.py --json file, by group of seeds")
    ap.add_argument("--labels", default=None, metavar="GROUP,GROUP",
                    help="--extrapolation: the groups shown, in this order (default all, in the file's order)")
    a = ap.parse_args()
    if a.extrapolation:
        if a.files or a.panel:
            ap.error("--extrapolation takes no other files or --panel")
        extrapolation(a.extrapolation, a.labels.split(",") if a.labels else None, a.plot)
        return
    if a.labels:
        ap.error("--labels goes with --extrapolation JSON")
    panels = ([("", a.files)] if a.files else []) + [(t, fs) for t, *fs in a.panel]
    if not panels or not all(fs for _, fs in panels):
        ap.error("give files, or --plot OUT.png --panel TITLE FILE [FILE ...] with at least one file each")
    for p in a.files + [f for _, fs in panels for f in fs]:
        if not os.path.isfile(p):
            raise SystemExit(f"error: {p} not found")
    if a.plot:
        plot(a.plot, panels, a.split, a.metric, a.floor)
    elif a.panel:
        ap.error("--panel goes with --plot OUT.png")
    elif a.diff:
        diff(a.files, a.lo, a.hi, a.window, a.skip)
    elif a.takeoff:
        takeoff(a.files, a.split, [float(t) for t in a.takeoff.split(",")])
    elif a.curve:
        curve(a.files, a.split)
    else:
        summary(a.files, a.skip, a.ppl)


if __name__ == "__main__":
    main()
