"""
Markdown tables and curves from train.py's outputs: eval.json, metrics.jsonl and training logs.

Usage:
    python results/summarize.py --write              # regenerate RESULTS.md's tables from the files here
    python results/summarize.py RUN/eval.json ...            # final loss/accuracy per run, mean ± std
    python results/summarize.py RUN/metrics.jsonl ...        # last eval, median ms/step and tokens/s per run
    python results/summarize.py --curve RUN/metrics.jsonl ...               # val loss at every eval step
    python results/summarize.py --takeoff 15,50 RUN/metrics.jsonl ...     # first eval with val acc > 15%, 50%
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
                                    # bucket in the longest windows, mean ± std over seeds per group
                                    # (--labels: these groups, in this order); --plot: mean, band min to max

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
        cols.append(("tokens/s", 0,
                     lambda ev, tr: median([r["tok_per_s"] for i, r in tr.items() if i >= skip])))
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
    print(table(["run"] + [f"first step, {split} acc > {t:g}%" for t in thresholds] + [f"last {split} acc %"],
                rows))


def legend_names(paths):
    """Each file's run name; where two files of a panel share one (seed1337-pope of two variants), each
    prefixed with the folder its run folder is in (all-shift_token/seed1337-pope)."""
    names = [run_name(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    folder = [os.path.dirname(os.path.abspath(p)) for p in paths]  # a log's folder, a run folder's parent
    return [f"{os.path.basename(f if p.endswith('.log') else os.path.dirname(f))}/{n}"
            for p, f, n in zip(paths, folder, names)]


def plot(out, panels, split, metric, floor):
    """One panel per (title, files): the eval metric against step; PoPE solid, RoPE dashed, else dotted."""
    from matplotlib.figure import Figure  # optional: only --plot needs it
    fig = Figure(figsize=(6.5 * len(panels), 4.5))
    for ax, (title, paths) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        names = legend_names(paths)
        runs = [re.sub(r"pope|rope|none", "", n) for n in names]  # without its pos_emb: one colour each
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
    """'mean ± std' (sample std) of xs, the value alone for one, 'inf' where one is infinite (JSON null)."""
    xs = list(xs)
    if any(x is None or math.isinf(x) for x in xs):
        return "inf"
    if len(xs) == 1:
        return f"{xs[0]:,.{nd}f}"
    return f"{statistics.mean(xs):,.{nd}f} ± {statistics.stdev(xs):,.{nd}f}"


def load_extrapolation(path, labels):
    """(lengths, {group: [series, ...]}) of an eval_extrapolation.py --json file; groups in order of first
    appearance, or those of labels (a list) in its order."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found")
    try:
        r = json.load(open(path))
        lengths, models = [int(L) for L in r["lengths"]], r["models"]
    except (ValueError, KeyError, TypeError):
        raise SystemExit(f"error: {path} is not an eval_extrapolation.py --json file (no lengths, models); "
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


def extrapolation_tables(path, labels):
    """Perplexity by length and NLL by position bucket of the longest windows, mean ± std over seeds."""
    lengths, groups = load_extrapolation(path, labels)
    Lmax = max(lengths)
    rows = [[g, str(len(ms))] + [mean_std([m["results"][str(L)]["ppl"] for m in ms], 1) for L in lengths]
            for g, ms in groups.items()]
    ppl = table(["group", "seeds"] + [str(L) for L in lengths], rows)
    first = next(iter(groups.values()))[0]
    buckets = [(b["start"], b["end"]) for b in first["results"][str(Lmax)]["buckets"]]
    rows = [[f"{a}–{b - 1}"] + [mean_std([m["results"][str(Lmax)]["buckets"][i]["nll"] for m in ms], 4)
                                for ms in groups.values()] for i, (a, b) in enumerate(buckets)]
    return lengths, groups, ppl, table(["positions"] + list(groups), rows)


def extrapolation(path, labels, out):
    lengths, groups, ppl, nll = extrapolation_tables(path, labels)
    print("perplexity by context length (mean ± std over seeds)")
    print(ppl)
    print()
    print(f"NLL (nats/token) by position, windows of {max(lengths)} tokens (mean ± std over seeds)")
    print(nll)
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
                 [[value(m["results"][str(Lmax)]["buckets"][j]["nll"]) for m in ms]
                  for j in range(len(buckets))], ".")):
            a.plot(xs, [statistics.mean(y) for y in ys], marker=marker, label=f"{g} ({len(ms)})", **style)
            if len(ms) > 1:
                a.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=style["color"],
                               alpha=0.2, lw=0)
    for T in sorted({m["block_size"] for ms in groups.values() for m in ms}):  # the training contexts
        for a in (ax, bx):
            a.axvline(T, color="gray", linestyle=":", linewidth=1)
    ax.set(yscale="log", xlabel="context length (tokens)", ylabel="perplexity",
           title="Perplexity against length")
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
            win.append(abs(statistics.mean(ta[i]["loss"] - tb[i]["loss"] for i in ws)))
        tok_a = median([r["tok_per_s"] for i, r in ta.items() if i >= skip])
        tok_b = median([r["tok_per_s"] for i, r in tb.items() if i >= skip])
        rows.append([f"{run_name(a)} vs {run_name(b)}", f"{its[0]}–{its[-1]} ({len(its)})",
                     fmt(statistics.mean(d), 4), fmt(max(d), 4), fmt(max(win), 4),
                     fmt(tok_b / tok_a, 3) if tok_a and tok_b else ""])
    print("absolute difference of the logged train losses (each the mean over its global batch)")
    print(table(["runs A vs B", "steps (logged)", "mean", "max", f"max of {window}-step means",
                 "tokens/s B / A"], rows))


# ---- statistics for runs paired by seed (no scipy: Student's t from the regularised incomplete beta) ----

def betainc(a, b, x):
    """I_x(a, b), the regularised incomplete beta, by its continued fraction (modified Lentz, float64)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast on this side; use the symmetry otherwise
        return 1 - betainc(b, a, 1 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front) / a
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        num = 1.0 if i == 0 else (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)) if i % 2 == 0
                                  else -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)))
        d = 1 + num * d
        d = 1 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1 + num / (c if abs(c) > 1e-300 else 1e-300)
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            break
    return front * (f - 1)


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_quantile(q, df):
    """The t with P(T <= t) = q (q > 0.5), by bisection on the two-sided tail."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 2 * (1 - q) else (lo, mid)
    return (lo + hi) / 2


def sign_test_p(wins, losses):
    """Two-sided exact binomial p of wins against losses at 1/2 (ties dropped)."""
    n, k = wins + losses, min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def paired(a, b):
    """a - b paired by position: n, mean difference, 95% t interval, paired t-test p, sign counts and p.
    Under 3 pairs the interval and the t-test are None (n too small)."""
    d = [x - y for x, y in zip(a, b)]
    n, mean = len(d), statistics.mean(d)
    wins, losses = sum(x > 0 for x in d), sum(x < 0 for x in d)
    r = {"n": n, "mean": mean, "lo": None, "hi": None, "p": None, "wins": wins, "losses": losses,
         "ties": n - wins - losses, "sign_p": sign_test_p(wins, losses)}
    if n >= 3:
        se = statistics.stdev(d) / math.sqrt(n)
        half = t_quantile(0.975, n - 1) * se
        r.update(lo=mean - half, hi=mean + half, p=t_two_sided_p(mean / se, n - 1) if se else 0.0)
    return r


# ---- RESULTS.md: each table between <!-- table:NAME --> and <!-- /table --> is made here from results/ ----

R = os.path.dirname(os.path.abspath(__file__))
II = os.path.join(R, "indirect_indexing")
PES = {"pope": "PoPE", "rope": "RoPE", "none": "NoPE"}


def ev(path, split="test", key="acc"):
    """A split's accuracy (%) or loss from an eval.json under results/."""
    x = json.load(open(os.path.join(R, path)))[split][key]
    return 100 * x if key == "acc" else x


def first_float(path, pattern):
    """The first number a regex captures in a file (a log line)."""
    return float(re.search(pattern, open(path).read(), flags=re.M)[1])


def pair_cells(a, b, nd, unit=""):
    """Cells of a paired row, a − b over the seeds both {seed: value} have: n, mean, 95% interval, t-test p,
    sign counts (p)."""
    r = paired([a[s] for s in a if s in b], [b[s] for s in a if s in b])
    ci = "n too small" if r["lo"] is None else f"[{r['lo']:+.{nd}f}, {r['hi']:+.{nd}f}]"
    p = "n too small" if r["p"] is None else f"{r['p']:.2g}"
    return [str(r["n"]), f"{r['mean']:+.{nd}f}{unit}", ci, p,
            f"{r['wins']} / {r['losses']} / {r['ties']} (p {r['sign_p']:.2g})"]


PAIRED = ["n", "mean PoPE − RoPE", "95% interval", "paired t p", "PoPE higher / lower / tie (sign p)"]

# indirect indexing: folder -> seeds run; the variants' names
II_SEEDS = {"target": range(1337, 1345), "all": range(1337, 1340), "all-question_first": (1337, 1338),
            "all-shift_token": range(1337, 1340), "all-wd0clip0": (1337, 1338)}
VARIANTS = {"all-question_first": "the question (letter, shift) before the string",
            "all-shift_token": "the shift as one of 31 tokens, not sign and digits",
            "all-wd0clip0": "the paper's format, weight decay 0, no gradient clipping"}


def has(folder, s, pe):
    return os.path.exists(f"{II}/{folder}/seed{s}-{pe}/eval.json")


def ii_acc(folder, pe):  # {seed: test accuracy %}
    return {s: ev(f"indirect_indexing/{folder}/seed{s}-{pe}/eval.json") for s in II_SEEDS[folder]
            if has(folder, s, pe)}


def t_ii(folder, paper=None):
    pes = [pe for pe in PES if ii_acc(folder, pe)]
    rows = [[str(s)] + [f"{ev(f'indirect_indexing/{folder}/seed{s}-{pe}/eval.json'):.2f}%"
                        if has(folder, s, pe) else "–" for pe in pes] for s in II_SEEDS[folder]]
    rows.append(["mean ± std"] + [mean_std(ii_acc(folder, pe).values(), 2) + "%" for pe in pes])
    return table(["seed"] + [PES[pe] for pe in pes], rows + ([["paper (3 seeds)"] + paper] if paper else []))


def t_ii_variants():
    rows = []
    for f, v in VARIANTS.items():
        accs = [ii_acc(f, pe).values() for pe in ("pope", "rope")]
        rows.append([v] + [" / ".join(f"{x:.2f}%" for x in a) for a in accs]
                    + [mean_std(a, 2) + "%" for a in accs])
    return table(["variant (loss on every token)", "PoPE, seeds from 1337", "RoPE, seeds from 1337", "PoPE",
                  "RoPE"], rows)


def t_ii_paired():
    names = {"target": "paper's format, loss on the target letter",
             "all": "paper's format, loss on every token", **VARIANTS}
    rows = [[name] + pair_cells(ii_acc(f, "pope"), ii_acc(f, "rope"), 1, " pt") for f, name in names.items()]
    return table(["test accuracy, paired by seed"] + PAIRED, rows)


def evals(path):
    """{step: val acc %} of the periodic evals (100 batches of 64 rows) in a run folder's metrics.jsonl, or in
    its training log; not the whole-split eval at the end (the record with a test split)."""
    p = os.path.join(II, path)
    if not os.path.exists(p + "/metrics.jsonl"):
        return {i: 100 * e["val"]["acc"] for i, e in sorted(load(p + ".log")[0].items())}
    recs = [json.loads(line) for line in open(p + "/metrics.jsonl")]
    return dict(sorted((r["iter"], 100 * r["eval"]["val"]["acc"]) for r in recs
                       if "val" in r.get("eval", {}) and "test" not in r["eval"]))


def takeoff_step(path, pct):
    return next((i for i, a in evals(path).items() if a > pct), math.inf)


def takeoffs(path):
    steps = (takeoff_step(path, p) for p in (15, 50))
    return " / ".join("–" if s == math.inf else f"{s // 1000}k" for s in steps)


def t_ii_takeoff():
    names = {"target": "target letter", "all": "every token",
             "all-question_first": "every token, question first",
             "all-shift_token": "every token, shift as one token",
             "all-wd0clip0": "every token, wd 0, no clip"}
    rows = [[name, str(s)] + [takeoffs(f"{f}/seed{s}-{pe}") if has(f, s, pe) else "" for pe in PES]
            for f, name in names.items() for s in II_SEEDS[f]]
    return table(["objective or variant", "seed"] + list(PES.values()), rows)


def t_ii_takeoff_sign():
    """Who passes 15% first, paired by seed, in the paper's format: a negated step, so 'higher' is earlier."""
    rows = []
    for folders, name in ((("target",), "loss on the target letter"), (("all",), "loss on every token"),
                          (("target", "all"), "both")):
        first = [[-min(takeoff_step(f"{f}/seed{s}-{pe}", 15), 1e9) for f in folders for s in II_SEEDS[f]]
                 for pe in ("pope", "rope")]
        r = paired(*first)
        rows.append([name] + [str(r[k]) for k in ("n", "wins", "losses", "ties")] + [f"{r['sign_p']:.2g}"])
    return table(["paper's format", "seed pairs", "PoPE first", "RoPE first", "same eval", "sign p"], rows)


def t_ii_repeats():
    """Three runs of seed 1337 with the loss on every token (two of them named 1337 and 1338)."""
    rows = []
    for run in ("all-logs-only/seed1337", "all-logs-only/seed1338", "all/seed1337"):
        for pe in ("pope", "rope"):
            log, acc = f"{II}/{run}-{pe}.log", evals(f"{run}-{pe}")
            first = [first_float(log, r) for r in
                     (r"^iter 0: loss ([\d.]+)", r"^step 0: .*val loss ([\d.]+)")]
            rows.append([f"{run}-{pe}"] + [f"{x:.4f}" for x in first] + [takeoffs(f"{run}-{pe}"),
                                                                         f"{acc[max(acc)]:.2f}%"])
    return table(["run (each is seed 1337)", "loss at iteration 0", "val loss at step 0",
                  "take-off 15% / 50%",
                  "val acc at 100k"], rows)


def ii_prepare():
    import importlib.util
    path = os.path.join(R, "..", "prepare", "indirect_indexing.py")
    spec = importlib.util.spec_from_file_location("ii", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def t_ii_floor():
    f = ii_prepare().content_floor()
    return table(["rule without positional skill (`content_floor()`)", "accuracy"], [
        ["copy the source letter at shift 0, else guess among the other letters", f"{100 * f['copy']:.2f}%"],
        ["the same, guessing only among letters the shift can reach", f"{100 * f['valid']:.2f}%"]])


def t_ii_shift_curve():
    """Val accuracy along the shift-as-one-token runs, the plateau's val loss, a model ignoring the shift."""
    steps = (50000, 60000, 70000, 80000, 90000, 94000, 100000)
    runs = [(f"{pe}, seed {s}", f"all-shift_token/seed{s}-{pe}") for pe in ("pope", "rope")
            for s in II_SEEDS["all-shift_token"]]
    runs.insert(1, ("pope, seed 1337, PyTorch path (`--attn_impl=torch`)",
                    "all-shift_token-torch/seed1337-pope"))  # (the kernel excluded)
    rows = []
    for name, run in runs:
        acc = evals(run)
        rows.append([name, f"{first_float(f'{II}/{run}.log', PLATEAU):.3f}"] + [f"{acc[i]:.1f}" for i in steps])
    m = ii_prepare()
    Ls = range(m.MIN_LEN, m.MAX_LEN + 1)  # a model that knows the string but not the shift: uniform over it
    rows.append(["uniform over the string's letters (ignores the shift)",
                 f"{statistics.mean(map(math.log, Ls)):.3f}",
                 f"{100 * statistics.mean(1 / L for L in Ls):.1f}"]
                + [""] * (len(steps) - 1))
    return table(["shift as one token", "val loss at 50k"] + [f"acc % {i // 1000}k" for i in steps], rows)


PLATEAU = r"^step 50000: .*val loss ([\d.]+)"

# music and the genome: (task, tag, name, paper's PoPE and RoPE NLL)
TASKS = [("jsb", "short", "JSB Chorales, 1k steps (config/jsb.py)", ("0.4889", "0.5081")),
         ("jsb", "3k", "JSB Chorales, 3k steps", ("0.4889", "0.5081")),
         ("maestro", "3k", "MAESTRO, 3k of 60k steps", ("1.486", "1.501")),
         ("genome", "2k", "human genome (chr. 20), 2k of 20k steps", ("4.152", "4.217"))]


def task_nll(task, pe, tag, split="test"):
    """{seed: NLL} of a results/tasks run set, seeds from 1337 (JSB 3k RoPE 1339: the output line it kept)."""
    out = {}
    for s in range(1337, 1345):
        base = os.path.join(R, f"tasks/{task}-{pe}-{s}-{tag}")
        if os.path.exists(base + "-eval.json"):
            out[s] = ev(base + "-eval.json", split, "loss")
        elif os.path.exists(base + ".txt"):
            out[s] = first_float(base + ".txt", rf"{split} loss ([\d.]+)")
    return out


def t_tasks():
    rows = []
    for t, tag, name, paper in TASKS:
        for j, pe in enumerate(("pope", "rope")):
            test = task_nll(t, pe, tag).values()
            rows.append([name, PES[pe], " / ".join(f"{x:.4f}" for x in test), mean_std(test, 4),
                         mean_std(task_nll(t, pe, tag, "val").values(), 4), paper[j]])
    return table(["task", "model", "test NLL, seeds from 1337", "mean ± std", "val NLL", "paper"], rows)


def t_tasks_paired():
    rows = [[name] + pair_cells(task_nll(t, "pope", tag), task_nll(t, "rope", tag), 4)
            for t, tag, name, _ in TASKS]
    return table(["test NLL, paired by seed"] + PAIRED, rows)


# language models: results/lm/extrapolation.json, labels <model>-s<seed>[+YaRN]
EXTRA = os.path.join(R, "lm", "extrapolation.json")
LM_SEEDS = (1337, 1338, 1339)
LM_GROUPS = ["PoPE", "RoPE", "RoPE+YaRN", "PoPE+ft", "RoPE+YaRN-ft", "RoPE+YaRN-ft+YaRN"]


def ppl(label, L):
    return json.load(open(EXTRA))["models"][label]["results"][str(L)]["ppl"]


def t_lm_rise():
    rise = [[ppl(lab.format(s), L) for L in (512, 5120)] for lab in ("PoPE-s{}", "RoPE-s{}", "RoPE-s{}+YaRN")
            for s in LM_SEEDS]
    rows = [[name] + [f"{a:.1f} → {b:.1f} ({100 * (b / a - 1):+.1f}%)" for a, b in rise[3 * i:3 * i + 3]]
            for i, name in enumerate(("PoPE", "RoPE", "RoPE + YaRN"))]
    return table(["perplexity 512 → 5,120"] + [f"seed {s}" for s in LM_SEEDS], rows)


def t_lm_seeds():
    rows = [[name, " / ".join(f"{ppl(f'{name}-s{s}', 512):.3f}" for s in LM_SEEDS),
             mean_std([ppl(f"{name}-s{s}", 512) for s in LM_SEEDS], 1), paper]
            for name, paper in (("PoPE", "21.33"), ("RoPE", "21.55"))]
    return table(["model", "perplexity at 512, seeds 1337 / 1338 / 1339", "mean ± std",
                  "paper (124M, OWT, 100k steps)"], rows)


def t_lm_paired():
    rows = []
    for name, a, b in (("PoPE − RoPE", "PoPE", "RoPE"), ("project − wrap", "PoPE-project", "PoPE"),
                       ("clamp − wrap", "PoPE-clamp", "PoPE")):
        for L in (512, 5120):
            xa, xb = ({s: ppl(f"{m}-s{s}", L) for s in LM_SEEDS} for m in (a, b))
            c = pair_cells(xa, xb, 2)
            rel = 100 * statistics.mean(xa.values()) / statistics.mean(xb.values()) - 100
            rows.append([f"{name}, perplexity at {L:,}"] + c[:4] + [f"{rel:+.1f}%", c[4]])
    return table(["paired by seed", "n", "mean difference", "95% interval", "paired t p", "relative",
                  "first higher / lower / tie (sign p)"], rows)


def t_delta_toy():
    return "\n".join(line for line in open(os.path.join(R, "delta", "toy.txt")).read().splitlines()
                     if line.startswith("|"))


def t_delta_lm():
    cells = {c[0]: c for c in ([x.strip() for x in line.split("|")[1:-1]] for line in
                               open(os.path.join(R, "lm", "delta.md"))) if c and c[0].startswith("seed")}
    rows = [[bound] + [" / ".join(cells[f"seed{s}-pope{suffix}"][j] for s in LM_SEEDS) for j in (3, 5)]
            + [" / ".join(f"{ppl(f'PoPE{suffix}-s{s}', L):.2f}" for s in LM_SEEDS) for L in (512, 5120)]
            for bound, suffix in (("wrap", ""), ("clamp", "-clamp"), ("project", "-project"))]
    return table(["bound", "δ moved > 0.01 rad, seeds 1337 / 1338 / 1339", "δ outside [−2π, 0]", "ppl at 512",
                  "ppl at 5,120"], rows)


def freq_rows(path, suffix=""):
    """Per model of an eval_frequencies.py --json file: top-quarter share (mean and range over layers), each
    channel's share (mean over layers) over an even share: its range and its mean over the top quarter."""
    rows = []
    for label, m in json.load(open(os.path.join(R, path)))["models"].items():
        C = len(m["share"][0])
        even = [C * statistics.mean(row[c] for row in m["share"]) for c in range(C)]
        top = m["top_quarter_share"]
        rows.append([label + suffix, f"{m['top_quarter_share_mean']:.3f}", f"{min(top):.3f}–{max(top):.3f}",
                     f"{min(even):.2f}–{max(even):.2f}", f"{statistics.mean(even[:C // 4]):.2f}"])
    return rows


FREQ_HEAD = ["model", "top-quarter share (0.25 = even), mean over layers", "range over layers",
             "share ÷ even share, min–max over channels", "mean over the top quarter"]


def t_freq_ii():
    runs = [("target", "seed1341_1342-pope_rope", "paper's task"),
            ("target", "seed1343_1344-pope_rope", "paper's task"),
            ("all-question_first", "seed1337_1338-pope_rope", "question first"),
            ("all-shift_token", "seed1337-pope_rope", "shift as one token"),
            ("all-shift_token-torch", "seed1337-pope", "shift as one token, PyTorch path"),
            ("all-shift_token", "seed1338-pope_rope", "shift as one token"),
            ("all-shift_token", "seed1339-pope_rope", "shift as one token"),
            ("all-wd0clip0", "seed1337-pope_rope", "weight decay 0, no clip"),
            ("all-wd0clip0", "seed1338-pope_rope", "weight decay 0, no clip"),
            ("all", "seed1337_1338-none", "paper's format"), ("all", "seed1339-none", "paper's format")]
    return table(FREQ_HEAD, [r for f, name, what in runs for r in
                             freq_rows(f"indirect_indexing/{f}/frequencies-{name}.json", f", {what}")])


def t_freq_lm():
    return table(FREQ_HEAD, freq_rows("lm/frequencies.json"))


def bench(name):  # a bench.py --json file's rows by key: (path, shape) for kernel's, path for train's
    rows = json.load(open(os.path.join(R, name)))["rows"]
    return {(r["path"], r["shape"]) if "shape" in r else r["path"]: r for r in rows}


def t_kernel():
    return table(["path", "(B,H,T,d)", "fwd ms", "fwd+bwd eager", "fwd+bwd graph", "graph TFLOP/s",
                  "peak MB"],
                 [[path, shape] + [f"{r[k]:.3f}" for k in ("fwd", "fwdbwd", "graph")]
                  + [f"{r['tflops']:.1f}", f"{r['peak_mb']:.0f}"]
                  for (path, shape), r in bench("kernel/bench-kernel.json").items()])


def t_kernel_profile():
    """bench.py kernel's per-kernel GPU µs: the PoPE kernel's parts, and the two cuDNN kernels of PoPE's
    PyTorch path and of SDPA at d=128 (the larger is the backward); graph ÷ SDPA d=128's."""
    run = bench("kernel/bench-kernel.json")
    parts = ("_pope_fwd", "_pope_bwd_dkdv", "_pope_bwd_dq", "_cartesian_kernel")

    def cudnn(path, shape):
        us = [x for n, x in run[path, shape]["kernels"] if n.startswith("cudnn_generated")]
        return ", ".join(f"{x:.1f}" for x in sorted(us, reverse=True))
    rows = []
    for (path, shape), r in run.items():
        if path == "pope kernel":
            us = dict(r["kernels"])
            rows.append([shape] + [f"{us[n]:.1f}" for n in parts] + [f"{sum(us[n] for n in parts):.1f}",
                         cudnn("pope torch (cart.+SDPA)", shape), cudnn("SDPA d=128", shape),
                         f"{r['graph'] / run['SDPA d=128', shape]['graph']:.2f}"])
    return table(["(B,H,T,d)", "forward", "dk/dv", "dq", "Cartesian pre-pass", "sum",
                  "PyTorch path's SDPA: backward, forward", "SDPA d=128: backward, forward",
                  "graph ÷ SDPA d=128's"], rows)


STEPS = ("train-1024-b16", "train-1024", "train-4096", "train-16384")  # bench.py train's files in §5


def raw_files(folder, pattern):  # results/folder's files whose names match pattern, sorted
    return sorted(f"{folder}/{f}" for f in os.listdir(os.path.join(R, folder)) if re.fullmatch(pattern, f))


def ab_files():  # §5's interleaved A/Bs of the kernel and other paths (ab-b16: batch 16, not 32)
    return raw_files("kernel", r"ab-(heads-interleaved|b16)-\d+(-rep\d*)?\.json")


SAMPLES = r"bench-sample(-rep\d+)?\.json"  # bench.py sample's runs (§5's decoding table pairs them by run)
DETERMINISM, DET_AB = r"determinism(-rope)?\.json", r"det-ab-(b16-)?\d+(-rep\d+)?\.json"  # determinism.py's


def t_speed_provenance():
    """Where each §5 file comes from: its header, as bench.py (results/setup.sh for the tests) wrote it."""
    rows = []
    for f in ["kernel/bench-kernel.json", *(f"kernel/{n}.json" for n in STEPS), *ab_files(),
              *raw_files("kernel", f"{DETERMINISM}|{DET_AB}"),
              *raw_files("sample", SAMPLES)]:
        h = json.load(open(os.path.join(R, f)))["header"]
        dirty = {False: "no", True: "yes"}.get(h["dirty"], h["dirty"])  # bench.py before 2026-12-04: a bool
        rows.append([f"`{f}`", h["commit"][:7], dirty, h["date"], h["gpu"], h["torch"],
                     h["triton"]])
    env = r"^commit: (\w{7}).*^dirty: (.*?)$.*^date: (\S+).*^gpus: \d+, ([^,]+).*^torch (\S+) triton (\S+)"
    env = re.search(env, open(os.path.join(R, "gpu_tests/env.txt")).read(), flags=re.M | re.S)
    rows.append(["`gpu_tests/pytest.log`", *env.groups()])
    return table(["file (results/)", "commit", "dirty", "date", "GPU", "torch", "triton"], rows)


def t_train_step():
    rows = []
    for name in STEPS:
        by = bench(f"kernel/{name}.json")
        for path, r in by.items():
            rows.append([f"{r['batch']} × {r['block_size']}", path, f"{r['ms']:.2f}", f"{r['tok_s']:,.0f}",
                         f"{r['peak_alloc_gb']:.1f}", f"{r['ms'] / by['rope']['ms']:.3f}",
                         f"{r['ms'] / by['pope-torch']['ms']:.3f}" if path.startswith("pope") else ""])
    return table(["batch × context", "path", "ms/step", "tokens/s", "peak GB", "÷ RoPE", "÷ PyTorch path"],
                 rows)


def kernel_pairs(files, key, others):
    """{(T, batch, other path): [(kernel ms, its ms)]} over the files' rows (under key), the i-th run of each
    path in a file paired as run in one process (paths in turn); sorted by T, batch, path."""
    pairs = {}
    for f in files:
        rs = json.load(open(os.path.join(R, f)))[key]
        for other in others:
            pairs.setdefault((rs[0]["block_size"], rs[0]["batch"], other), []).extend(
                zip(*([r["ms"] for r in rs if r["path"] == p] for p in ("pope-kernel", other))))
    return dict(sorted((k, v) for k, v in pairs.items() if v))


def t_kernel_pairs():
    """PoPE's kernel against its PyTorch path and RoPE in the 124M compiled step, over every run: the step
    table's files and the interleaved A/Bs."""
    rows = []
    for (T, B, other), ps in kernel_pairs([*(f"kernel/{n}.json" for n in STEPS), *ab_files()], "rows",
                                          ("rope", "pope-torch")).items():
        k, o = zip(*ps)
        rows.append([f"{B} × {T}", other, f"{statistics.mean(k):.2f}", f"{statistics.mean(o):.2f}",
                     f"{statistics.mean(k) / statistics.mean(o):.3f}",
                     *pair_cells(dict(enumerate(k)), dict(enumerate(o)), 2)])
    return table(["batch × context", "against", "kernel ms/step", "its ms/step", "kernel ÷ it", "pairs",
                  "mean kernel − it, ms", "95% interval", "paired t p",
                  "kernel slower / faster / tie (sign p)"], rows)


def t_determinism():
    """results/kernel/determinism*.json: bitwise reruns and graphed attention ms of both PoPE paths (summed and
    averaged over the files), as PyTorch runs by default and under torch.use_deterministic_algorithms(True);
    the 124M step of each file's paths under the latter."""
    ds = [json.load(open(os.path.join(R, f))) for f in raw_files("kernel", DETERMINISM)]
    att, step = {}, {(r["path"], r["block_size"]): r["ms"] for d in ds for r in d["step"]}
    for r in (r for d in ds for r in d["attention"]):
        att.setdefault((r["path"], r["block_size"], r["deterministic"]), []).append(r)
    rows = []
    for T in (1024, 4096, 16384):
        for path in ("rope", "pope-kernel", "pope-torch"):
            cells = []
            for rs in (att.get((path, T, det), []) for det in (False, True)):
                cells += [f"{sum(r['runs_differing'] for r in rs)} of {4 * len(rs)}",
                          f"{statistics.mean(r['graph_ms'] for r in rs):.2f}"] if rs else ["", ""]
            rows.append([f"{32768 // T} × {T}", path, *cells, f"{step[path, T]:.2f}",
                         f"{step['pope-kernel', T] / step[path, T]:.3f}"])
    return table(["batch × context", "path", "reruns not bitwise equal", "attention ms",
                  "deterministic: reruns not bitwise equal", "attention ms", "124M step ms",
                  "kernel ÷ this path"], rows)


def t_determinism_ab():
    """results/kernel/det-ab-*.json: paths in turn (each order repeated), every step under deterministic
    algorithms; each turn's kernel against each other path of the same turn, over every file."""
    turns = kernel_pairs(raw_files("kernel", DET_AB), "step", ("rope", "pope-torch"))
    rows = [[f"{B} × {T}", path, str(len(ts)), f"{statistics.mean(o for _, o in ts):.2f}",
             f"{statistics.mean(k for k, _ in ts):.2f}", ", ".join(f"{k / o:.3f}" for k, o in ts)]
            for (T, B, path), ts in turns.items()]
    return table(["batch × context", "path", "turns", "ms/step", "kernel ms/step", "kernel ÷ this path, "
                  "each turn"], rows)


def t_host_time():
    """The step files with host_ms (bench.py train's since e88626b): each turn's median over the timed
    iterations of the host's time to enqueue a step and of that time over the step's; near 1, the GPU waited."""
    turns = {}
    for f in [*ab_files(), *raw_files("kernel", DET_AB)]:
        d = json.load(open(os.path.join(R, f)))
        for r in (r for r in d.get("step") or d["rows"] if "host_ms" in r):
            h, t = r["host_ms"][20:], r["times_ms"][20:]
            turns.setdefault((r["block_size"], r["batch"], "step" in d, r["path"]), []).append(
                (r["ms"], statistics.median(h), statistics.median(a / b for a, b in zip(h, t))))
    return table(["batch × context", "algorithms", "path", "ms/step, each turn", "host ms/step",
                  "host ÷ step"],
                 [[f"{B} × {T}", "deterministic" if det else "default", path,
                   *(", ".join(f"{x[i]:{fmt}}" for x in ts) for i, fmt in enumerate((".2f", ".1f", ".2f")))]
                  for (T, B, det, path), ts in sorted(turns.items())])


def t_qkv_forms():
    """results/kernel/qkv-forms: per way of making q, k, v from c_attn's output, tests/test_gpu.py's compiled
    vs eager gradient test (its largest relative error, PoPE; it stops at the first model that fails) and
    bench.py train at 32 x 1k."""
    rows = []
    for form in ("split", "permute", "heads", "t13"):
        log = open(os.path.join(R, f"kernel/qkv-forms/t-{form}.log")).read()
        err = float(re.search(r"^pope \[\('[\w.]+', ([\d.]+)\)", log, re.M)[1])
        b = f"kernel/qkv-forms/b-{form}.json"  # (t13's was not timed)
        by = bench(b) if os.path.exists(os.path.join(R, b)) else {}
        rows.append([form, f"{err:.4f}" if err < 1 else f"{err:,.0f}", "passed" if " passed" in log else
                     "failed"] + [f"{by[p]['ms']:.2f}" if p in by else "" for p in ("rope", "pope-torch")])
    return table(["q, k, v by", "largest gradient error, PoPE", "test", "rope ms/step",
                  "pope-torch ms/step"], rows)


def t_train_small():
    """train.py's logged step times of the indirect-indexing model, 400 steps: median from step 100 on, last."""
    rows = []
    for run in ("ii-pope-reduce-overhead", "ii-pope-cuda-graph", "ii-rope-cuda-graph"):
        ms = [(int(i), float(x)) for i, x in re.findall(r"^iter (\d+): .*?, ([\d.]+) ms,",
                                                         open(os.path.join(R, f"train_speed/{run}.log")).read(),
                                                         flags=re.M)]
        rows.append([run[3:], f"{statistics.median(x for i, x in ms if i >= 100):.1f}", f"{ms[-1][1]:.1f}"])
    return table(["model, step as", "median ms/step, steps 100-350", "ms/step at step 350"], rows)


def t_decode():
    """Decoding tok/s over every bench.py sample run: medians, and graphed PoPE against RoPE paired by run."""
    runs = [{(r["model"], r["context"], r["batch"], r["mode"]): r["tok_s"]
             for r in json.load(open(os.path.join(R, f)))["rows"]} for f in raw_files("sample", SAMPLES)]
    rows = []
    for c in (1024, 8192):
        for b in (1, 8):
            med = lambda pe, m: f"{statistics.median(r[pe, c, b, m] for r in runs):,.0f}"  # noqa: E731
            graph = [{i: r[pe, c, b, "graph"] for i, r in enumerate(runs)} for pe in ("pope", "rope")]
            rows.append([str(c), str(b), med("pope", "eager"), med("rope", "eager"), med("pope", "graph"),
                         med("rope", "graph"), *pair_cells(*graph, 0)])
    return table(["context", "batch", "eager PoPE", "eager RoPE", "graph PoPE", "graph RoPE",
                  "runs", "graph PoPE − RoPE, mean", "95% interval", "paired t p",
                  "PoPE faster / slower / tie (sign p)"], rows)


def t_memory():
    r = json.load(open(os.path.join(R, "lm/memory-124m.json")))
    res = {m["pos_emb"]: m["results"] for m in r["models"].values()}
    return table(["peak extra MB, 124M"] + [f"{L:,}" for L in r["lengths"]],
                 [[pe] + [f"{res[pe][str(L)]['peak_extra_mem_mb']:.1f}" for L in r["lengths"]]
                  for pe in ("pope", "rope")])


TABLES = {f.__name__[2:]: f for f in (
    t_ii_floor, t_ii_paired, t_ii_variants, t_ii_takeoff, t_ii_takeoff_sign, t_ii_repeats, t_ii_shift_curve,
    t_tasks, t_tasks_paired, t_lm_rise, t_lm_seeds, t_lm_paired, t_speed_provenance, t_kernel,
    t_kernel_profile, t_train_step, t_kernel_pairs, t_determinism, t_determinism_ab, t_host_time, t_qkv_forms,
    t_train_small, t_decode, t_memory, t_delta_toy, t_delta_lm, t_freq_ii, t_freq_lm)}
TABLES.update(ii_target=lambda: t_ii("target", ["94.82 ± 2.91%", "11.16 ± 2.45%", ""]),
              ii_all=lambda: t_ii("all"),
              lm_ppl=lambda: extrapolation_tables(EXTRA, LM_GROUPS)[2],
              lm_nll=lambda: extrapolation_tables(EXTRA, LM_GROUPS)[3])
MARKER = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def fill(text):
    """text with every marked table regenerated; an unknown table name is an error."""
    def one(m):
        if m[2] not in TABLES:
            raise SystemExit(f"error: no table named {m[2]} in results/summarize.py")
        return m[1] + TABLES[m[2]]() + "\n" + m[4]
    return MARKER.sub(one, text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="eval.json, metrics.jsonl and/or training .log files")
    ap.add_argument("--curve", action="store_true", help="the eval loss at every eval step, one row per run")
    ap.add_argument("--split", default="val", help="the split of --curve and --takeoff (default val)")
    ap.add_argument("--takeoff", default=None, metavar="PCT,PCT",
                    help="the first eval step whose accuracy exceeds each of these percentages, per run")
    ap.add_argument("--diff", action="store_true",
                    help="compare pairs of metrics.jsonl files (train loss, tokens/s)")
    ap.add_argument("--from", dest="lo", type=int, default=0, help="--diff: first step compared (default 0)")
    ap.add_argument("--to", dest="hi", type=int, default=10**12, help="--diff: compare steps below this one")
    ap.add_argument("--window", type=int, default=20, help="--diff: steps per window of means (default 20)")
    ap.add_argument("--skip", type=int, default=20,
                    help="timings from this step on (the first windows hold compilation; default 20)")
    ap.add_argument("--ppl", action="store_true", help="add perplexity columns, exp(loss)")
    ap.add_argument("--plot", default=None, metavar="OUT.png", help="draw the eval curves to this PNG")
    ap.add_argument("--panel", nargs="+", action="append", default=[], metavar=("TITLE", "FILE"),
                    help="--plot: a panel, its title then its metrics.jsonl / .log files (repeat for more)")
    ap.add_argument("--metric", default="acc", choices=["acc", "loss"],
                    help="--plot: the metric (default acc)")
    ap.add_argument("--floor", type=float, default=None,
                    help="--plot: a grey line at this value in every panel (e.g. a task's content floor)")
    ap.add_argument("--extrapolation", default=None, metavar="JSON",
                    help="tables (with --plot, a figure) of an eval_extrapolation.py --json file")
    ap.add_argument("--labels", default=None, metavar="GROUP,GROUP",
                    help="--extrapolation: the groups shown, in this order (default: all, as in the file)")
    ap.add_argument("--write", action="store_true",
                    help="regenerate every marked table of RESULTS.md in place")
    a = ap.parse_args()
    if a.write:
        path = os.path.join(R, "..", "RESULTS.md")
        text = fill(open(path).read())
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
        return
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
