"""results/summarize.py: tables from eval.json, metrics.jsonl and training logs (take-off steps, mean ± std)
and the --plot figure;
results/check_numbers.py: the file that holds each number of a markdown page, or NO FILE;
results/delta_stats.py: the phases of PoPE's delta in checkpoints;
results/kernel/targets.py: the kernel's targets with their numbers, from bench.py's raw outputs."""
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def summarize(*args):
    r = subprocess.run([sys.executable, str(REPO / "results" / "summarize.py"), *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in r.stdout.splitlines() if line.startswith("| ") and not line.startswith("| run")}


def test_takeoff_from_metrics_and_logs(tmp_path):
    """The first eval above each threshold, from a metrics.jsonl and from a log of the same evals."""
    accs = {0: 0.01, 2000: 0.14, 4000: 0.151, 6000: 0.49, 8000: 0.52, 10000: 0.40}
    run = tmp_path / "seed7-pope"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as f:
        for it, acc in accs.items():
            f.write(json.dumps({"iter": it, "loss": 1.0, "dt_ms": 1.0, "tok_per_s": 1.0}) + "\n")
            f.write(json.dumps({"iter": it, "eval": {"val": {"loss": 2.0, "acc": acc}}}) + "\n")
    (tmp_path / "seed7-rope.log").write_text("model: ...\n" + "".join(
        f"iter {it}: loss 1.0\nstep {it}: train loss 1.5 acc 0.9, val loss 2.0 acc {acc * 0.5:.4f}\n"
        for it, acc in accs.items()))
    rows = summarize("--takeoff", "15,50", run / "metrics.jsonl", tmp_path / "seed7-rope.log")
    assert rows["seed7-pope"] == ["4000", "8000", "40.00"]
    assert rows["seed7-rope"] == ["6000", "–", "20.00"]  # halved: 0.245 at 6000, never above 50%


def test_mean_and_std_over_seeds(tmp_path):
    """Runs differing only in the seed form a group with the sample mean ± std."""
    for seed, acc in ((101, 0.2), (102, 0.4), (103, 0.9)):
        (tmp_path / f"seed{seed}-pope").mkdir()
        (tmp_path / f"seed{seed}-pope" / "eval.json").write_text(
            json.dumps({"iter": 100, "test": {"loss": acc, "acc": acc}}))
    rows = summarize(*sorted(tmp_path.glob("seed*-pope/eval.json")))
    assert rows["seed102-pope"] == ["100", "0.4000", "40.00"]
    assert rows["pope"] == ["3", "0.5000 ± 0.3606", "50.00 ± 36.06"]  # stdev([.2,.4,.9]) = 0.36056


def png_size(path):
    """(width, height) from a PNG's header."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_plot_one_panel_per_group_and_errors(tmp_path):
    """--plot draws one panel per --panel (the figure widens with them) from metrics.jsonl files and
    logs alike; --panel without --plot, or a panel without files, is an error that says how to call it."""
    pytest.importorskip("matplotlib")
    run = tmp_path / "seed7-pope"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"iter": it, "eval": {"val": {"loss": 2.0 - it / 1e4, "acc": it / 1e4}}}) + "\n" for it in (0, 2000, 4000)))
    (tmp_path / "seed7-rope.log").write_text("".join(
        f"step {it}: train loss 1.5 acc 0.9, val loss 2.0 acc {it / 2e4:.4f}\n" for it in (0, 2000, 4000)))
    summarize("--plot", tmp_path / "one.png", run / "metrics.jsonl", tmp_path / "seed7-rope.log")
    summarize("--plot", tmp_path / "two.png", "--panel", "a", run / "metrics.jsonl",
              "--panel", "b", tmp_path / "seed7-rope.log", "--floor", "0.1")
    (w1, h1), (w2, h2) = png_size(tmp_path / "one.png"), png_size(tmp_path / "two.png")
    assert 1.7 < w2 / w1 < 2.3 and abs(h2 - h1) < 0.1 * h1, ((w1, h1), (w2, h2))
    for args, msg in ((["--panel", "a", run / "metrics.jsonl"], "--panel goes with --plot"),
                      (["--plot", tmp_path / "x.png", "--panel", "a"], "at least one file each")):
        r = subprocess.run([sys.executable, str(REPO / "results" / "summarize.py"), *map(str, args)],
                           capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


def check_numbers(tmp_path, *args):
    r = subprocess.run([sys.executable, str(REPO / "results" / "check_numbers.py"), *map(str, args)],
                       capture_output=True, text=True, cwd=tmp_path)
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in r.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| file:line")]
    return r.returncode, [(row[0], row[1], row[2], row[4]) for row in rows]


def test_check_numbers_finds_each_number_or_says_no_file(tmp_path):
    """A made-up RESULTS.md and results/ tree: every number the rule counts, with the file that holds it
    (the same digits, or a value that rounds to it), only the files its section names, or NO FILE."""
    run = tmp_path / "results" / "run"
    run.mkdir(parents=True)
    (run / "eval.json").write_text(json.dumps({"test": {"acc": 0.87491, "loss": 1.23456}, "mem_mb": 774.3}))
    (run / "train.log").write_text("step 500: val loss 0.5649\nthroughput 398875 tok/s\n")
    (tmp_path / "results" / "other").mkdir()
    (tmp_path / "results" / "other" / "x.txt").write_text("loss 1.0\n")
    (tmp_path / "results" / "README.md").write_text("made up: 99.99\n")  # a page written by hand: no source
    (tmp_path / "results" / "run.sh").write_text("echo 42.42\n")  # a script: no source
    doc = tmp_path / "RESULTS.md"
    doc.write_text("""# Results

Paper: arXiv 2509.10534. Measured 2026-11-30, commit 4ca9acc and 4512832, torch 2.11.0, on 2 H200s.

## 1. Task

Model: 6 layers, 8 heads, 384 wide, 1,200 steps of 32 × 512 tokens, seeds 1337 / 1338, batch 64,
10× the context. Test accuracy 87.49% and loss 1.235 (`results/run/eval.json`), peak 774 MB; throughput
398,875 tok/s (`results/run/`). Val loss 0.565 (paper: 0.4889), lower on 2 of 3 pairs.

    python train.py --lr 3.14159

```
12.345 in a fenced block
```

| model | accuracy | paper |
|---|---:|---:|
| 2048 | 87.5% | 94.82% |
| paper | 11.16% | 1.5 |

## 2. Other

Only `results/other/x.txt` here: 0.5649 is in the run folder, which this section does not name; 1.0 is here.

## 3. No path named: every source is checked

A mean 42.42 and 99.99; 0.5649 again.
""")
    rc, rows = check_numbers(tmp_path, doc, "--results", tmp_path / "results")
    assert rc == 0
    assert rows == [
        ("RESULTS.md:8", "1. Task", "87.49%", "results/run/eval.json (≈ 0.87491 × 100)"),
        ("RESULTS.md:8", "1. Task", "1.235", "results/run/eval.json (≈ 1.23456)"),
        ("RESULTS.md:8", "1. Task", "774", "results/run/eval.json (≈ 774.3)"),
        ("RESULTS.md:9", "1. Task", "398,875", "results/run/train.log"),
        ("RESULTS.md:9", "1. Task", "0.565", "results/run/train.log (≈ 0.5649)"),
        ("RESULTS.md:19", "1. Task", "87.5%", "results/run/eval.json (≈ 0.87491 × 100)"),
        ("RESULTS.md:24", "2. Other", "0.5649", "NO FILE"),
        ("RESULTS.md:24", "2. Other", "1.0", "results/other/x.txt"),
        ("RESULTS.md:28", "3. No path named: every source is checked", "42.42", "NO FILE"),  # scripts and pages
        ("RESULTS.md:28", "3. No path named: every source is checked", "99.99", "NO FILE"),  # are no sources
        ("RESULTS.md:28", "3. No path named: every source is checked", "0.5649", "results/run/train.log"),
    ]
    rc, rows = check_numbers(tmp_path, doc, "--results", tmp_path / "results", "--missing", "--strict")
    assert rc == 1 and [r[2] for r in rows] == ["0.5649", "42.42", "99.99"]


@pytest.mark.parametrize("env,message", [
    ({"EXTRA": "--weight_decay=0.0"}, "name the setting with LABEL="),
    ({"OBJECTIVE": "every"}, "OBJECTIVE must be target or all"),
    ({"VARIANT": "reversed"}, "VARIANT must be empty, shift_token or question_first"),
])
def test_indirect_indexing_script_refuses_settings_that_would_mix_runs(tmp_path, env, message):
    """results/indirect_indexing.sh stops before any data or run is made: EXTRA without LABEL would
    put runs of another setting into the default's folders (where finished runs are kept)."""
    r = subprocess.run(["bash", str(REPO / "results" / "indirect_indexing.sh")], capture_output=True, text=True,
                       env={**os.environ, "RESULTS": str(tmp_path / "r"), "SEEDS": "", **env}, cwd=tmp_path)  # (no runs if it went on)
    assert r.returncode == 1 and message in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)
    assert not (tmp_path / "r").exists()


def test_results_scripts_name_only_configs_that_exist():
    """Every config file a results/*.sh command line names exists (config/rope_124m.py, since merged into
    config/pope_124m.py, failed lm.sh's last step and train_speed.sh's RoPE run). A path built from a
    variable is refused, except tasks.sh's config/$task.py, checked for each task its case statement names."""
    checked = 0
    for script in sorted((REPO / "results").glob("*.sh")):
        text = script.read_text()
        commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))  # (prose)
        for path in re.findall(r"config/[\w${}./-]+?\.py", commands):
            if script.name == "tasks.sh" and path == "config/$task.py":
                tasks = re.findall(r"^\s+(\w+)\)\s+python prepare/\1\.py", text, flags=re.M)
                assert sorted(tasks) == ["genome", "jsb", "maestro"], tasks
                names = [f"config/{t}.py" for t in tasks]
            else:
                assert "$" not in path, f"{script.name} builds a config path from a variable: {path}"
                names = [path]
            for name in names:
                assert (REPO / name).is_file(), f"{script.name} names {name}, which does not exist"
                checked += 1
    assert checked >= 11, checked  # (the command lines that name a config today: none goes unread)


def test_plot_legend_names_say_the_folder_only_where_two_runs_share_a_name():
    import importlib.util
    spec = importlib.util.spec_from_file_location("summarize", REPO / "results" / "summarize.py")
    s = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s)
    one = ["r/all/seed1337-pope/metrics.jsonl", "r/all/seed1337-rope/metrics.jsonl"]
    assert s.legend_names(one) == ["seed1337-pope", "seed1337-rope"]
    two = ["r/all-question_first/seed1337-pope/metrics.jsonl", "r/all-shift_token/seed1337-pope/metrics.jsonl"]
    assert s.legend_names(two) == ["all-question_first/seed1337-pope", "all-shift_token/seed1337-pope"]


def test_delta_stats_table_and_a_checkpoint_without_delta(tmp_path):
    """Each run's row against a float64 reference of the phases (clamp bound: the parameter clamped into
    [-2pi, 0], then its angle in (-pi, pi]); a RoPE checkpoint anywhere in the list is refused before the
    table starts (its header was printed, then the error on the same line)."""
    import math

    import numpy as np
    import torch
    from helpers import run_here
    sys.path.insert(0, str(REPO))
    from model import GPT, GPTConfig
    rng = np.random.default_rng(5)
    paths, want = [], {}
    for name, pe in (("pope-a", "pope"), ("pope-b", "pope"), ("rope-c", "rope")):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=16, pos_emb=pe,
                              pope_delta_bound="clamp"))
        sd = model.state_dict()
        raw = []
        for k in sd:
            if k.endswith("attn.delta"):
                sd[k] = torch.from_numpy(rng.uniform(-8.0, 1.0, tuple(sd[k].shape))).float()
                raw.append(sd[k].double().numpy().ravel())
        (tmp_path / name).mkdir()
        args = {f: getattr(model.config, f) for f in model.config.__dataclass_fields__}
        torch.save({"model": sd, "model_args": args}, path := tmp_path / name / "ckpt.pt")
        paths.append(path)
        if raw:
            raw = np.concatenate(raw)
            used = np.clip(raw, -2 * math.pi, 0.0)
            phase = np.abs(np.angle(np.exp(1j * used)))
            want[name] = [name, "clamp", str(raw.size), f"{(phase > 0.01).mean():.1%}",
                          f"{np.sort(phase)[(raw.size - 1) // 2]:.3f}",  # torch.median: the lower middle one
                          f"{((raw > 0) | (raw < -2 * math.pi)).mean():.1%}"]
    r = run_here([REPO / "results" / "delta_stats.py", *paths[:2]], tmp_path)
    lines = r.stdout.splitlines()
    assert lines[0].startswith("| run | bound") and lines[1].startswith("|---")
    assert [[c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]] == [want["pope-a"], want["pope-b"]]
    for order in (paths, paths[::-1]):
        r = run_here([REPO / "results" / "delta_stats.py", *order], tmp_path, check=False)
        assert r.returncode == 1 and r.stdout == "", r.stdout
        assert r.stderr == f"error: {paths[2]} has no PoPE delta (pos_emb='rope'); pass PoPE checkpoints only\n"


def test_extrapolation_groups_seeds_mean_std_labels_and_plot(tmp_path):
    """--extrapolation on an eval_extrapolation.py --json file: series whose labels differ only in the seed
    (also before a +YaRN suffix) form one group; each cell the mean ± sample std over its seeds, the value alone
    for one seed; --labels picks and orders the groups, an unknown one is a one-line error; --plot writes a PNG."""
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    lengths, bucket = [64, 128, 256], 64
    labels = ["PoPE-s1337", "RoPE-s1337+YaRN", "PoPE-s1338", "RoPE-s1338+YaRN", "PoPE-s1339", "RoPE-s1339+YaRN",
              "RoPE+YaRN-ft-s1337+YaRN"]
    models = {}
    for label in labels:
        results = {}
        for L in lengths:
            results[str(L)] = {"ppl": rng.uniform(10, 900), "nll": rng.uniform(2, 6), "tokens": 1024, "buckets": [
                {"start": a, "end": a + bucket, "nll": rng.uniform(2, 6), "ppl": 1.0, "tokens": 16}
                for a in range(0, L, bucket)]}
        models[label] = {"label": label, "block_size": 128 if "ft" in label else 64, "results": results}
    path = tmp_path / "extrapolation.json"
    path.write_text(json.dumps({"lengths": lengths, "bucket_size": bucket, "models": models}))
    groups = {"PoPE": labels[0:6:2], "RoPE+YaRN": labels[1:6:2], "RoPE+YaRN-ft+YaRN": labels[6:]}

    def cell(xs, nd):
        return f"{statistics.mean(xs):.{nd}f} ± {statistics.stdev(xs):.{nd}f}" if len(xs) > 1 else f"{xs[0]:.{nd}f}"

    rows = summarize("--extrapolation", path)
    assert list(rows) == ["group", *groups, "positions", "0–63", "64–127", "128–191", "192–255"], (seed, rows)
    assert rows["group"] == ["seeds", "64", "128", "256"] and rows["positions"] == list(groups), (seed, rows)
    for g, members in groups.items():
        want = [str(len(members))] + [cell([models[m]["results"][str(L)]["ppl"] for m in members], 1) for L in lengths]
        assert rows[g] == want, (seed, g, rows[g], want)
    for i, a in enumerate(range(0, 256, bucket)):
        want = [cell([models[m]["results"]["256"]["buckets"][i]["nll"] for m in members], 4) for members in groups.values()]
        assert rows[f"{a}–{a + bucket - 1}"] == want, (seed, a, rows[f"{a}–{a + bucket - 1}"], want)
    assert " ± " not in "".join(rows["RoPE+YaRN-ft+YaRN"]) and " ± " in rows["PoPE"][1], (seed, rows)

    rows = summarize("--extrapolation", path, "--labels", "RoPE+YaRN-ft+YaRN,PoPE", "--plot", tmp_path / "e.png")
    assert list(rows)[:3] == ["group", "RoPE+YaRN-ft+YaRN", "PoPE"] and "RoPE+YaRN" not in rows, (seed, rows)
    assert rows["positions"] == ["RoPE+YaRN-ft+YaRN", "PoPE"], (seed, rows)
    assert rows["0–63"] == [cell([models[m]["results"]["256"]["buckets"][0]["nll"] for m in groups[g]], 4)
                            for g in ("RoPE+YaRN-ft+YaRN", "PoPE")], (seed, rows["0–63"])
    png = (tmp_path / "e.png").read_bytes()
    assert len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.png", "extrapolation.json"]  # no temp file left

    r = subprocess.run([sys.executable, str(REPO / "results" / "summarize.py"), "--extrapolation", str(path),
                        "--labels", "PoPE,RoPE", "--plot", str(tmp_path / "x.png")], capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r
    assert "RoPE" in r.stderr and "the groups are PoPE,RoPE+YaRN,RoPE+YaRN-ft+YaRN" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()


def targets(*args):
    return subprocess.run([sys.executable, str(REPO / "results" / "kernel" / "targets.py"), *map(str, args)],
                          capture_output=True, text=True)


def test_kernel_targets_ratios_and_verdicts(tmp_path):
    """results/kernel/targets.py: each ratio is measured / reference from the raw lines, and a target is met only
    at or under its bound; a file without the lines it needs is a one-line error naming the command to run."""
    rows = {"pope kernel": (0.2, 0.9, 0.6, 80), "rope+SDPA d=64": (0.2, 0.75, 0.5, 100),
            "SDPA d=64": (0.05, 0.2, 0.25, 73), "SDPA d=128": (0.1, 0.3, 0.3, 150)}
    (tmp_path / "kernel.txt").write_text("# header\npath B,H,T,D fwd fwd+bwd graph TFLOP/s peak MB\n" + "".join(
        f"{name:26s} 8,12,1024,64   {f:7.3f} {fb:8.3f} {g:7.3f}    100.0 {mb:8d}\n"
        for name, (f, fb, g, mb) in rows.items()))
    (tmp_path / "train.txt").write_text("rope  attn_impl=auto      40.00 ms/step  1 tok/s\n"
                                        "pope  attn_impl=triton    41.00 ms/step  1 tok/s\n")
    (tmp_path / "host.txt").write_text("pope kernel fwd+bwd (with pope_delta, as model.py)   host    150.0   x\n"
                                       "rope + SDPA fwd+bwd                                  host    300.0   x\n")
    (tmp_path / "check.txt").write_text("ok a bitwise-deterministic=True\nok b bitwise-deterministic=False\n")
    paths = ["--kernel", tmp_path / "kernel.txt", "--train", tmp_path / "train.txt", "--host", tmp_path / "host.txt",
             "--check", tmp_path / "check.txt"]
    r = targets(*paths)
    assert r.returncode == 0, r.stderr
    cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in r.stdout.splitlines()[2:]]
    got = {(c[0], c[1]): c[2:] for c in cells}  # (target, shape) -> [measured, ratio, met]
    assert got["fwd+bwd graph ≤ SDPA d=128 graph", "8,12,1024,64"] == ["0.600 vs 0.300 ms", "2.00", "no"]
    assert got["fwd+bwd graph ≤ 1.4× SDPA d=64 graph", "8,12,1024,64"][1:] == ["2.40", "no"]  # 0.6 / 0.25
    assert got["fwd+bwd graph ≤ eager RoPE + SDPA", "8,12,1024,64"][1:] == ["0.80", "yes"]  # 0.6 / 0.75
    assert got["eager fwd+bwd ≤ eager RoPE + SDPA", "8,12,1024,64"][1:] == ["1.20", "no"]  # 0.9 / 0.75
    assert got["eager minus graph ≤ 0.2 ms", "8,12,1024,64"] == ["0.300 ms", "–", "no"]
    assert got["host time of an eager fwd+bwd ≤ 0.2 ms", "8,12,1024,64"][1:] == ["0.50 of RoPE's", "yes"]
    assert got["124M step ≤ 1.05× RoPE", "16 × 1024"][1:] == ["1.025", "yes"]  # 41 / 40
    assert got["peak memory ≤ RoPE + SDPA's", "8,12,1024,64"] == ["80 vs 100 MB", "0.80", "yes"]
    assert got["bitwise-deterministic gradients", "bench.py check"] == ["1 of 2 cases", "–", "no"]
    (tmp_path / "train.txt").write_text("rope  attn_impl=auto      40.00 ms/step\n")
    r = targets(*paths)
    assert r.returncode != 0 and "pope  attn_impl=triton" in r.stderr and "bench.py train" in r.stderr, r.stderr
    (tmp_path / "kernel.txt").write_text("nothing here\n")
    r = targets(*paths)
    assert r.returncode != 0 and "bench.py kernel" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_kernel_targets_page_is_the_scripts_output_on_the_committed_files():
    """results/kernel/targets.md is what targets.py prints from the raw files next to it (RESULTS.md quotes it)."""
    r = targets("--before", REPO / "results" / "kernel" / "bench-kernel-swept.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (REPO / "results" / "kernel" / "targets.md").read_text()
