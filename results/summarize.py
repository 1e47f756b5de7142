"""
The tables and verdict sentences of RESULTS.md, README.md and results/*/README.md, made from the
raw files under results/ (runs found by folder): --write regenerates their <!-- table:NAME --> and
<!-- verdict:NAME --> blocks. --slim F.json drops what the tables recompute from frequency JSON.
"""

import argparse
import functools
import glob
import json
import os
import re
import runpy

import numpy as np
from scipy import stats

R = os.path.dirname(os.path.abspath(__file__))
READ = set()  # every file read: tests/test_results_tables.py lists those under results/ never read
ALPHA, MIN_N, SOLVED = 0.05, 3, 50  # the verdict rule's level, fewest seeds; solved: test acc > 50%
DOCS = ["../RESULTS.md", "../README.md", "README.md", *sorted(glob.glob("*/README.md", root_dir=R))]

def raw(path):
    """The text of a raw file (path under results/, or absolute), recorded in READ."""
    p = os.path.abspath(os.path.join(R, path))
    READ.add(p)
    return open(p).read()

@functools.cache
def val_acc(run):
    """{step: val accuracy} of a run's periodic evals, from its log, else its metrics.jsonl."""
    if os.path.exists(os.path.join(R, f"{run}.log")):  # "step N: ..., val loss x acc y"
        return {int(i): float(x) for i, x in
                re.findall(r"^step (\d+): .*val loss [\d.]+ acc ([\d.]+)", raw(f"{run}.log"), re.M)}
    recs = [json.loads(line) for line in raw(f"{run}/metrics.jsonl").splitlines()]
    evals = [r for r in recs if "eval" in r and "test" not in r["eval"]]  # not the final test eval
    return {r["iter"]: r["eval"]["val"]["acc"] for r in evals}

def attention(log):
    """The attention path a training log names: kernel, PyTorch path, SDPA, or 'no log'."""
    if not os.path.exists(os.path.join(R, log)):
        return "no log"
    m = re.search(r"(?:[pr]ope|none): (?:the )?(fused Triton kernel|kernel|PyTorch \w+)", raw(log))
    return {"PyTorch path": "PyTorch path", "PyTorch SDPA": "SDPA"}.get(m[1], "kernel")

# ---- statistics (scipy.stats), cells, sentences ----

def paired(a, b):
    """a − b over shared keys: 95% t interval and p (None under MIN_N), exact and sign tests."""
    keys = [k for k in a if k in b]
    d = np.array([a[k] - b[k] for k in keys], dtype=float)
    w, l = int((d > 0).sum()), int((d < 0).sum())
    r = dict(n=len(d), mean=d.mean(), keys=keys, lo=None, hi=None, p=None, wins=w, losses=l,
             ties=len(d) - w - l, sign_p=stats.binomtest(w, w + l).pvalue if w + l else 1.0)
    r["exact_p"] = 1.0 if len(d) < 2 else stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf, vectorized=True).pvalue
    if len(d) >= MIN_N and d.std() > 0:
        t = stats.ttest_1samp(d, 0.0)
        ci = t.confidence_interval(0.95)
        r.update(lo=ci.low, hi=ci.high, p=t.pvalue)
    return r

def verdict(r, sign):
    """The rule's word for r (n, mean a − b, p) in the paper's direction sign (+1: a > b)."""
    if r["n"] < MIN_N:
        return "too few seeds for a test"
    if r["p"] is None or r["p"] >= ALPHA:  # a t-test's: its 95% interval holds zero
        return "not established"
    return "reproduced" if sign * r["mean"] > 0 else "opposite"

PAIRED = ["n", "mean difference", "95% interval", "paired t p", "exact p",
          "higher / lower / tie (sign p)"]

def pair_cells(r, nd, unit=""):
    ci = "n too small" if r["lo"] is None else f"[{r['lo']:+.{nd}f}, {r['hi']:+.{nd}f}]"
    return [str(r["n"]), f"{r['mean']:+.{nd}f}{unit}", ci,
            "n too small" if r["p"] is None else f"{r['p']:.2g}", f"{r['exact_p']:.2g}",
            f"{r['wins']} / {r['losses']} / {r['ties']} (p {r['sign_p']:.2g})"]

def says(r, nd, unit=""):
    """A paired result in words: the mean, its interval and t-test, the sign counts."""
    n, mean, ci, p, _, _ = pair_cells(r, nd, unit)
    t = "n too small for a t-test" if r["p"] is None else f"95% interval {ci}, t p {p}"
    signs = f"higher on {r['wins']} of {n}, lower on {r['losses']}, sign p {r['sign_p']:.2g}"
    return f"{mean} ({t}; {signs})"

def table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])

def mean_std(xs, nd):  # a single value without the ± (no sample std)
    xs = list(xs)
    std = f" ± {np.std(xs, ddof=1):,.{nd}f}" if len(xs) > 1 else ""
    return f"{np.mean(xs):,.{nd}f}{std}"

def t_env(folder):
    """Each provenance file results/setup.sh wrote under folder."""
    envs = {f: dict(line.split(": ", 1) for line in raw(f).splitlines() if ": " in line)
            for f in sorted(glob.glob(f"{folder}/**/*env*.txt", root_dir=R, recursive=True))}
    rows = [[f"`{f}`", *(e.get(k) for k in ("commit", "dirty", "date", "gpus", "mps")),
             f"`{e['command'].strip()}`"] for f, e in envs.items()]
    return table(["file (results/)", "commit", "dirty", "date", "GPUs", "MPS", "command"], rows)

# ---- indirect indexing: runs results/indirect_indexing/<folder>/seed<S>-<pe>[-<N>steps]/ ----

II = "indirect_indexing"
FULL = 100000  # the config's steps: those of a run without -<N>steps
RUN = re.compile(r"seed(\d+)-(pope|rope|none)(?:-(\d+)steps)?")
PES = {"pope": "PoPE", "rope": "RoPE", "none": "NoPE"}
ARMS = {"target": "loss on the target letter, weight decay 0.1",
        "target-wd0.01": "loss on the target letter, weight decay 0.01 (the paper's)",
        "all": "loss on every token", "all-question_first": "every token, the question first",
        "all-shift_token": "every token, the shift as one of 31 tokens",
        "all-shift_token-torch": "every token, shift as one token, PyTorch path",
        "all-wd0clip0": "every token, weight decay 0, no gradient clipping"}
# an independent, pre-registered replication on the paper's recipe, quoted (not our runs): its
# INDIRECT_RESULTS.md and INDIRECT_RESULTS_200k.md; (arm, PoPE solved, RoPE solved, test accuracies)
REPLICATION = [("PrashRangarajan/mapformer, 100k steps (test acc: 3 seeds)", "1 of 8", "",
                "34.4 ± 39.8%", "6.6 ± 2.1%"),
               ("PrashRangarajan/mapformer, 200k steps", "7 of 8", "not run", "", "")]
FLOORS = {"copy": "copy the source letter at shift 0, else guess another",  # content_floor()
          "valid": "the same, guessing only among letters the shift can reach"}
PAPER = {"ii": ("94.82 ± 2.91%", "11.16 ± 2.45%"), "jsb": (0.4889, 0.5081),  # PoPE's, RoPE's
         "maestro": (1.486, 1.501), "genome": (4.152, 4.217), "lm": (21.33, 21.55)}

@functools.cache
def ii_runs():
    """{(folder, steps): {(seed, pe): run path under results/}} of the runs with an eval.json."""
    out = {}
    for path in sorted(glob.glob(f"{II}/*/seed*/eval.json", root_dir=R)):
        folder, name = path.split("/")[-3:-1]
        m = RUN.fullmatch(name)
        if m:
            out.setdefault((folder, int(m[3] or FULL)), {})[int(m[1]), m[2]] = os.path.dirname(path)
    return dict(sorted(out.items()))

def targets():  # the arms with the loss on the target letter (the paper's objective)
    return [a for a in ii_runs() if a[0].startswith("target")]

def compared():  # the target arms with runs of both PoPE and RoPE: those the claims compare
    return [a for a in targets() if arm(a, "pope") and arm(a, "rope")]

def arm_name(a):
    return ARMS.get(a[0], a[0]) + ("" if a[1] == FULL else f", {a[1] // 1000}k steps")

def lift(run, pct, never=None):
    """The first eval step above pct% val accuracy of a run, `never` if it never passes it."""
    return next((i for i, x in sorted(val_acc(run).items()) if 100 * x > pct), never)

def step_k(run, pct):  # "12k", or "> 100k" where the run never passes pct% (its last eval)
    s = lift(run, pct)
    return f"> {max(val_acc(run)) // 1000}k" if s is None else f"{s // 1000}k"

def arm(a, pe, f=None):  # {seed: f(run), by default its test accuracy} over an arm's runs of one pe
    f = f or (lambda run: 100 * json.loads(raw(f"{run}/eval.json"))["test"]["acc"])
    return {s: f(run) for (s, p), run in ii_runs().get(a, {}).items() if p == pe}

def comparisons():
    """(name, arm A, pe A, arm B, pe B): PoPE − RoPE per arm, and target arms against target/."""
    out = [(f"PoPE − RoPE, {arm_name(a)}", a, "pope", a, "rope") for a in ii_runs()]
    for a in targets()[1:]:
        b = ("target", FULL) if a[1] == FULL else (a[0], FULL)
        out += [(f"{PES[p]}: {arm_name(a)} − {arm_name(b)}", a, p, b, p)
                for p in ("pope", "rope")]
    return [c for c in out if set(arm(*c[1:3])) & set(arm(*c[3:5]))]

def first(a, pa, b, pb, pct):
    """Who passes pct% val accuracy first, paired by seed: A first, B first, same, sign p."""
    r = paired(*(arm(x, p, lambda run: -lift(run, pct, 1e9)) for x, p in ((a, pa), (b, pb))))
    return r["wins"], r["losses"], r["ties"], f"{r['sign_p']:.2g}"

def solved(a, pe):
    return sum(x > SOLVED for x in arm(a, pe).values()), len(arm(a, pe))

def fisher(a):
    return stats.fisher_exact([[k, n - k] for k, n in map(solved, (a, a), ("pope", "rope"))]).pvalue

def t_ii_endpoints():
    rows = []
    for a in compared():
        lifted = [arm(a, p, lambda run: lift(run, SOLVED) is not None) for p in ("pope", "rope")]
        rows.append([arm_name(a)] + ["{} of {}".format(*solved(a, p)) for p in ("pope", "rope")]
                    + [f"{fisher(a):.2g}"] + [f"{sum(x.values())} of {len(x)}" for x in lifted]
                    + [mean_std(arm(a, p).values(), 2) + "%" for p in ("pope", "rope")])
    floor = runpy.run_path(f"{R}/../prepare/indirect_indexing.py")["content_floor"]()
    quoted = [("paper (3 seeds)", "", "", *PAPER["ii"])]
    quoted += [(f"floor, no positions: {n}", "", "", *[f"{100 * floor[k]:.2f}%"] * 2)
               for k, n in FLOORS.items()]
    rows += [[n, a, b, "", "", "", c, d] for n, a, b, c, d in quoted + REPLICATION]
    return table(["arm", "PoPE solved", "RoPE solved", "Fisher p", "PoPE lifted off",
                  "RoPE lifted off", "PoPE test acc", "RoPE test acc"], rows)

def t_ii_seeds(target):  # the target arms' (RESULTS §1), or the others'
    """Per seed, each arm's test accuracy and first eval above 50% val accuracy."""
    cols = [(a, pe) for a in ii_runs() if (a in targets()) == target for pe in PES if arm(a, pe)]
    cell = {(a, pe, s): f"{x:.2f}% ({step_k(ii_runs()[a][s, pe], SOLVED)})" for a, pe in cols
            for s, x in arm(a, pe).items()}
    return table(["seed"] + [f"{PES[pe]}, {arm_name(a)}" for a, pe in cols],
                 [[str(s)] + [cell.get((a, pe, s), "") for a, pe in cols]
                  for s in sorted({k[2] for k in cell})])

def t_ii_paired(target):  # the target arms' comparisons (RESULTS §1), or the others'
    rows = []
    for name, a, pa, b, pb in [c for c in comparisons() if (c[1] in targets()) == target]:
        accs = [arm(a, pa), arm(b, pb)]  # {seed: test accuracy} of A and of B
        r = paired(*accs)
        means = [f"{np.mean([acc[k] for k in r['keys']]):.2f}%" for acc in accs]
        rows.append([name, *means, *pair_cells(r, 1, " pt")] + ["{} / {} / {} (p {})".format(
            *first(a, pa, b, pb, pct)) for pct in (SOLVED, 15)])
    return table(["test accuracy, paired by seed: A − B", "A", "B"] + PAIRED
                 + ["above 50% first: A / B / same (sign p)", "above 15% first"], rows)

# ---- JSB, MAESTRO, the genome: results/tasks/<task>-<pe>-<seed>-<tag>/eval.json and .log ----

TASKS = {("jsb", "short"): "JSB Chorales, 1k steps (config/jsb.py)",
         ("jsb", "3k"): "JSB Chorales, 3k steps", ("maestro", "3k"): "MAESTRO, 3k of 60k steps",
         ("genome", "2k"): "human genome (chr. 20), 2k of 20k steps"}

def task_nll(task, tag, pe, split="test"):
    """{seed: NLL} of a task's runs: eval.json, or the output line a run kept (<run>.txt)."""
    out = {}
    for f in sorted(os.listdir(os.path.join(R, "tasks"))):
        m = re.fullmatch(rf"{task}-{pe}-(\d+)-{tag}(\.txt)?", f)
        if m and m[2]:
            out[int(m[1])] = float(re.search(rf"{split} loss ([\d.]+)", raw(f"tasks/{f}"))[1])
        elif m and os.path.exists(f"{R}/tasks/{f}/eval.json"):
            out[int(m[1])] = json.loads(raw(f"tasks/{f}/eval.json"))[split]["loss"]
    return out

def task_paths(task, tag, pe):
    """{attention path in training: [seeds]} of a task's runs."""
    out = {}
    for s in task_nll(task, tag, pe):
        out.setdefault(attention(f"tasks/{task}-{pe}-{s}-{tag}.log"), []).append(s)
    return out

def task_rows():
    """(name, PoPE − RoPE by seed, the paper's gap, [(PoPE's path, its seeds only)]) per task."""
    out = []
    for (task, tag), name in TASKS.items():
        a, b = (task_nll(task, tag, p) for p in ("pope", "rope"))
        paths = task_paths(task, tag, "pope")
        subs = [(f"PoPE on the {p} (seeds {'/'.join(map(str, ss))})",
                 paired({s: a[s] for s in ss}, b)) for p, ss in paths.items() if len(paths) > 1]
        out.append((name, paired(a, b), PAPER[task][0] - PAPER[task][1], subs))
    return out

def t_tasks():
    rows = [[name, PES[pe], " / ".join(f"{x:.4f}" for x in nll.values()), mean_std(nll.values(), 4),
             mean_std(task_nll(t, g, pe, "val").values(), 4), f"{PAPER[t][i]}",
             ", ".join(f"{p} ({'/'.join(map(str, ss))})" for p, ss in task_paths(t, g, pe).items())]
            for (t, g), name in TASKS.items() for i, pe in enumerate(("pope", "rope"))
            for nll in [task_nll(t, g, pe)]]
    return table(["task", "model", "test NLL, seeds from 1337", "mean ± std", "val NLL", "paper",
                  "attention in training (seeds)"], rows)

def t_tasks_paired():
    rows = []
    for name, r, _, subs in task_rows():
        rows += [[name] + pair_cells(r, 4)] + [[f"{name}, {n}"] + pair_cells(s, 4) for n, s in subs]
    return table(["test NLL, PoPE − RoPE paired by seed"] + PAIRED, rows)

# ---- language models: results/<folder>/extrapolation.json, labels <model>-s<seed>[+YaRN] ----
# folder lm: English at 30M (§3, §4); code: Python source at 124M, the corpus of issue 84 (§9)

LM_GROUPS = ["PoPE", "RoPE", "RoPE+YaRN", "PoPE+ft", "RoPE+YaRN-ft", "RoPE+YaRN-ft+YaRN"]
LM_PAIRS = (("PoPE − RoPE", "PoPE", "RoPE"), ("project − wrap", "PoPE-project", "PoPE"),
            ("clamp − wrap", "PoPE-clamp", "PoPE"))
NOT_RUN = "Not run yet (`results/code.sh`)."
# an independent study of Python source, quoted (not our runs); bits per byte, seed means
CODE_REF = ("Quoted, not our runs: PrashRangarajan/mapformer (`CODE_RESULTS.md` at 390e97e: a "
            "9-layer byte-level model on 100 MB of Python split by file, 3 seeds), val bits per "
            "byte: trained at 512 and scored at 2,048, at positions 0–512 / 512–1,024 / "
            "1,024–2,048, PoPE 0.8785 / 0.7991 / 0.8792 and RoPE 0.8755 / 2.6713 / 4.4641; trained "
            "and scored at 2,048, PoPE 0.7052 and RoPE 0.7060, a difference it finds below its "
            "minimum detectable effect.")

@functools.cache
def extrapolation(folder):
    return json.loads(raw(f"{folder}/extrapolation.json"))

@functools.cache
def lm(group, folder="lm"):
    """{seed: {length: perplexity}} of a group's runs: the labels that differ only in the seed."""
    return {int(re.search(r"-s(\d+)", k)[1]): {int(L): x["ppl"] for L, x in m["results"].items()}
            for k, m in extrapolation(folder)["models"].items() if re.sub(r"-s\d+", "", k) == group}

def t_lm_ppl(folder="lm"):
    """Perplexity by length: mean ± std over each group's seeds."""
    lengths = extrapolation(folder)["lengths"]
    rows = [[g, str(len(lm(g, folder)))]
            + [mean_std([x[L] for x in lm(g, folder).values()], 1) for L in lengths]
            for g in LM_GROUPS if lm(g, folder)]
    return table(["group", "seeds"] + [str(L) for L in lengths], rows)

def lm_pair(a, b, L, folder="lm"):  # a − b in perplexity at L tokens, paired by seed
    return paired(*({s: x[L] for s, x in lm(m, folder).items()} for m in (a, b)))

def t_lm_paired():
    return table(["perplexity, paired by seed"] + PAIRED, [[f"{n}, at {L:,} tokens"]
                 + pair_cells(lm_pair(a, b, L), 2) for n, a, b in LM_PAIRS for L in (512, 5120)])

# ---- frequency usage: eval_frequencies.py --json files ----

@functools.cache
def freq():
    """{(folder, label): (top-quarter share per layer, share ÷ even share per channel)}."""
    out = {}
    files = sorted(glob.glob(f"{II}/*/frequencies-*.json", root_dir=R)) + ["lm/frequencies.json"]
    for f in files + glob.glob("code/frequencies.json", root_dir=R):
        for label, m in json.loads(raw(f))["models"].items():
            w = np.array(m["weight"])  # (layer, head, channel)
            share = w.sum(1) / w.sum((1, 2))[:, None]  # eval_frequencies.py's: heads summed
            out[os.path.dirname(f), label] = (
                share[:, :max(1, share.shape[1] // 4)].sum(1), share.mean(0) * share.shape[1])
    return out

def t_freq(folder):  # lm/'s (RESULTS §8), code/'s (§9) or indirect_indexing/'s
    return table(["model", "top-quarter share (0.25 = even), mean over layers", "range over layers",
                  "share ÷ even share, min–max over channels", "mean over the top quarter"], [
        [f"{f}/{label}", f"{top.mean():.3f}", f"{top.min():.3f}–{top.max():.3f}",
         f"{even.min():.2f}–{even.max():.2f}", f"{even[:len(even) // 4].mean():.2f}"]
        for (f, label), (top, even) in freq().items() if f.split("/")[0] == folder])

# ---- speed: bench.py train --json files under results/kernel/, one run of each path ----

STEPS = ("train-1024-b16", "train-1024", "train-4096", "train-16384")

def t_train_step():
    files = [{r["path"]: r for r in json.loads(raw(f"kernel/{n}.json"))["rows"]} for n in STEPS]
    return table(["batch × context", "path", "ms/step", "tokens/s", "peak GB", "÷ RoPE",
                  "÷ PyTorch path"], [
        [f"{r['batch']} × {r['block_size']}", p, f"{r['ms']:.2f}", f"{r['tok_s']:,.0f}",
         f"{r['peak_alloc_gb']:.1f}", f"{r['ms'] / by['rope']['ms']:.3f}",
         f"{r['ms'] / by['pope-torch']['ms']:.3f}" if "pope" in p else ""]
        for by in files for p, r in by.items()])  # by: {path: row} of a file

# ---- sample.py's time to a sample: sample_time.sh's printouts, results/sample/time-to-sample/ ----

CALL = re.compile(r"^(\w+) (?:n=)?(\w+) rc=0 wall=([\d.]+) s\n(?:decoding: .*\n)?prefill: .* "
                  r"time to first token ([\d.]+) s since start(?: \(imports ([\d.]+) s, "
                  r"checkpoint ([\d.]+) s\))?\ndecode: .* tokens/s \(capture ([\d.]+) s", re.M)
CALL_HEAD = ["call, s", "first token, s", "imports, s", "checkpoint, s", "graph capture, s"]

def calls(name):
    """[(series, setting, and the times CALL_HEAD names)] of one of sample_time.sh's printouts."""
    return [(*c[:4], c[4] or "not printed", c[5] or "not printed", c[6])
            for c in CALL.findall(raw(f"sample/time-to-sample/{name}.txt"))]

# ---- the claims and their verdicts ----

RULE = (f"A claim counts as **reproduced** where its test rejects no difference at p < {ALPHA} "
        "in the paper's direction: for a paired outcome, the 95% t interval of the paired "
        "difference excludes zero; for indirect indexing, whose runs either solve the task (test "
        f"accuracy above {SOLVED}%) or do not, Fisher's exact test of the two solve rates. It is "
        "**opposite** where the test rejects the other way, **too few seeds for a test** under "
        f"{MIN_N} seeds, and **not established** otherwise.")

def ii_claim(a):
    (k1, n1), (k2, n2), fp = solved(a, "pope"), solved(a, "rope"), fisher(a)
    word = verdict(dict(n=min(n1, n2), mean=k1 / n1 - k2 / n2, p=fp), 1)  # of the solve rates
    r = paired(arm(a, "pope"), arm(a, "rope"))
    w, l, t, sp = first(a, "pope", a, "rope", 15)
    ours = (f"solved by PoPE on {k1} of {n1} seeds, by RoPE on {k2} of {n2} (Fisher p {fp:.2g}); "
            f"test accuracy PoPE − RoPE {says(r, 1, ' points')}, exact p {r['exact_p']:.2g}")
    more = (f"; PoPE passes 15% val accuracy first on {w} of {r['n']} seeds, RoPE on {l}, "
            f"ties (the same eval, or neither) {t} (sign p {sp})")
    for name, x, pe, b, _ in comparisons():
        if x == a and b != a:  # this arm against target/'s weight decay 0.1 on the same seeds
            rb = paired(arm(a, pe), arm(b, pe))
            more += f"; {name}: {says(rb, 1, ' points')}, exact p {rb['exact_p']:.2g}"
    return (f"Indirect indexing, {arm_name(a)}: PoPE solves the task, RoPE does not",
            "PoPE {}, RoPE {} (3 seeds)".format(*PAPER["ii"]), ours, word, "§1", ours + more)

def extrapolation_claim(folder, name, where):
    """PoPE − RoPE at the longest length, and whether RoPE's rise per step of length shrinks."""
    lengths = extrapolation(folder)["lengths"]
    r = lm_pair("PoPE", "RoPE", lengths[-1], folder)
    rope = lm("RoPE", folder).values()
    inc = [[x[L] - x[K] for x in rope] for K, L in (lengths[:2], lengths[-2:])]
    shrinks = max(inc[1]) < min(inc[0])  # every rise over the last step below every first one
    shape = "degrades steadily, not a blow-up at this scale" if shrinks else "blows up"
    a, b = (f"{min(x):+.1f} to {max(x):+.1f}" for x in inc)
    ours = f"PoPE − RoPE at {lengths[-1]:,} tokens {says(r, 2)}"
    step = lengths[1] - lengths[0]
    return (f"{name}: at 10× its context PoPE's perplexity is below RoPE's",
            "PoPE's stays flat past the context, RoPE's rises", ours, verdict(r, -1), where,
            f"{ours}; RoPE's perplexity rises by {a} over the first {step:,} tokens past the "
            f"context and by {b} over the last: it {shape}")

def context_claim(folder, name, models, where):
    """PoPE − RoPE at the training context (the first length)."""
    L = extrapolation(folder)["lengths"][0]
    r = lm_pair("PoPE", "RoPE", L, folder)
    ours = f"PoPE − RoPE at {L:,} tokens {says(r, 2)}"
    return (f"{name}: PoPE's perplexity is below RoPE's", "{} vs {} (124M, OpenWebText, 100k "
            "steps)".format(*PAPER["lm"]), f"{models}: {ours}", verdict(r, -1), where, ours)

def code_run():  # the code corpus's runs are in (issue 84); until then its blocks say NOT_RUN
    return os.path.exists(os.path.join(R, "code", "extrapolation.json"))

def if_run(f):
    return lambda: f() if code_run() else NOT_RUN

@functools.cache
def claims():
    """(claim, paper, ours, verdict, where, the section's sentence) per claim."""
    out = [ii_claim(a) for a in compared()]
    for name, r, gap, subs in task_rows():
        ours = f"PoPE − RoPE {says(r, 4)}"
        more = "".join(f"; {n}: {says(s, 4)}" for n, s in subs)
        alone = [n for n, s in subs if verdict(s, -1) == "reproduced"]
        if len(alone) == 1:  # of two or more paths (subs only where PoPE trained on several)
            more += f"; the gap rests on one code path ({alone[0]} alone rejects no difference)"
        out.append((f"{name}: PoPE's test NLL is below RoPE's", f"PoPE − RoPE {gap:+.4f} nats",
                    ours, verdict(r, -1), "§2", ours + more))
    out.append(extrapolation_claim("lm", "Length extrapolation", "§3"))
    out.append(context_claim("lm", "Language modelling at equal tokens", "30M models", "§4"))
    rope = {fk: v[0].mean() for fk, v in freq().items() if RUN.fullmatch(fk[1])[2] == "rope"}
    lm_rope = {k: x for k, x in rope.items() if k[0] == "lm"}
    r = paired(lm_rope, dict.fromkeys(lm_rope, 0.25))
    above = sum(x > 0.25 for x in rope.values())
    ours = (f"the language models' RoPE top-quarter share − 0.25 (even) {says(r, 3)}; above an "
            f"even share in {above} of {len(rope)} RoPE models measured")
    out.append(("Frequency usage: RoPE suppresses its high frequencies", "RoPE's high frequencies "
                "suppressed, PoPE's range broader", ours, verdict(r, -1), "§8", ours))
    if code_run():
        out.append(context_claim("code", "Python source", "124M models", "§9"))
        out.append(extrapolation_claim("code", "Python source, length extrapolation", "§9"))
    return out

def v_claims(where):
    return "\n".join(f"- **{c[0]}: {c[3]}.** {c[5][0].upper()}{c[5][1:]}." for c in claims()
                     if c[4] == where)

def v_delta():
    return "; ".join(f"{n} at {L:,} tokens {says(lm_pair(a, b, L), 2)}" for n, a, b in LM_PAIRS[1:]
                     for L in (512, 5120)) + "."

# ---- the documents' marked blocks ----

TABLES = {f.__name__[2:]: f for f in (t_ii_endpoints, t_tasks,
                                      t_tasks_paired, t_lm_ppl, t_lm_paired, t_train_step)}
TABLES.update(
    claims=lambda: table(["claim", "paper", "ours", "verdict", "where"], [c[:5] for c in claims()]),
    ii_seeds=lambda: t_ii_seeds(True), ii_seeds_all=lambda: t_ii_seeds(False),
    ii_paired=lambda: t_ii_paired(True), ii_paired_all=lambda: t_ii_paired(False),
    sample_time=lambda: table(["sample.py of", "caches", *CALL_HEAD], calls("sampletime")),
    sample_decode=lambda: table(["decoding", "new tokens", *CALL_HEAD], calls("sampledecode")),
    env_ii=lambda: t_env(II), env_tasks=lambda: t_env("tasks"),
    env_gpu_tests=lambda: t_env("gpu_tests"), env_sample=lambda: t_env("sample"),
    pytest_gpu_tests=lambda: table(["log (results/)", "pytest's last line"], [
        [f"`{f}`", raw(f).strip().splitlines()[-1]]
        for f in sorted(glob.glob("gpu_tests/**/*.log", root_dir=R, recursive=True))]),
    freq_ii=lambda: t_freq(II), freq_lm=lambda: t_freq("lm"), env_code=lambda: t_env("code"),
    code_ppl=if_run(lambda: t_lm_ppl("code")), freq_code=if_run(lambda: t_freq("code")))
VERDICTS = {"rule": lambda: RULE, "delta": v_delta, "code_ref": lambda: CODE_REF,
            "readme": lambda: "\n".join(f"- {c[0]} ({c[4]}): **{c[3]}**." for c in claims()),
            **{k: functools.partial(v_claims, f"§{i}") for k, i in (
                ("ii", 1), ("tasks", 2), ("extrapolation", 3), ("lm", 4), ("freq", 8), ("code", 9))}}
MARKER = re.compile(r"(<!-- (table|verdict):(\w+) -->)\n(.*?)\n?(<!-- /\2 -->)", re.S)

def fill(text):
    """text with every marked block regenerated; an unknown name is an error."""
    def one(m):
        made = {"table": TABLES, "verdict": VERDICTS}[m[2]]
        if m[3] not in made:
            raise SystemExit(f"error: no {m[2]} named {m[3]} in results/summarize.py")
        return f"{m[1]}\n{made[m[3]]()}\n{m[5]}"
    return MARKER.sub(one, text)

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    one = ap.add_mutually_exclusive_group(required=True)
    one.add_argument("--write", action="store_true", help="regenerate the documents' marked blocks")
    one.add_argument("--slim", nargs="+", default=[], metavar="JSON", help="frequency JSON files")
    a = ap.parse_args()
    out = [(os.path.join(R, doc), fill(raw(doc))) for doc in DOCS] if a.write else []
    for path in a.slim:
        d = json.loads(raw(os.path.abspath(path)))
        for m in d["models"].values():
            for k in ("q_mag", "k_mag", "share", "top_quarter_share", "top_quarter_share_mean"):
                m.pop(k, None)
        out.append((path, json.dumps(d)))
    for path, text in out:  # each file whole or not at all
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)

if __name__ == "__main__":
    main()
