"""The results/ scripts on made-up inputs: summarize.py's take-offs, means and extrapolation tables,
delta_stats.py's phases, its step targets, the drivers' refusals, configs and provenance file."""
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from test_results_tables import S  # results/summarize.py, loaded once

REPO = Path(__file__).resolve().parent.parent


def rows_of(stdout):
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in stdout.splitlines() if line.startswith("| ") and not line.startswith("| run")}


def run(script, *args, check=True):
    r = subprocess.run([sys.executable, str(REPO / "results" / script), *map(str, args)], capture_output=True,
                       text=True)
    assert r.returncode == 0 or not check, r.stderr
    return r


def test_takeoff_from_metrics_and_logs_and_mean_std_over_seeds(tmp_path):
    accs = {0: 0.01, 2000: 0.14, 4000: 0.151, 6000: 0.49, 8000: 0.52, 10000: 0.40}
    (tmp_path / "seed7-pope").mkdir()
    (tmp_path / "seed7-pope" / "metrics.jsonl").write_text("".join(
        json.dumps({"iter": i, "eval": {"val": {"loss": 2.0, "acc": a}}}) + "\n" for i, a in accs.items()))
    (tmp_path / "seed7-rope.log").write_text("".join(
        f"iter {it}: loss 1.0\nstep {it}: train loss 1.5 acc 0.9, val loss 2.0 acc {acc / 2:.4f}\n"
        for it, acc in accs.items()))
    rows = rows_of(run("summarize.py", "--takeoff", "15,50", tmp_path / "seed7-pope" / "metrics.jsonl",
                       tmp_path / "seed7-rope.log").stdout)
    assert rows["seed7-pope"] == ["4000", "8000", "40.00"] and rows["seed7-rope"] == ["6000", "–", "20.00"]
    for seed, acc in ((101, 0.2), (102, 0.4), (103, 0.9)):
        (tmp_path / f"seed{seed}-x").mkdir()
        (tmp_path / f"seed{seed}-x" / "eval.json").write_text(
            json.dumps({"iter": 9, "test": {"loss": acc, "acc": acc}}))
    rows = rows_of(run("summarize.py", *sorted(tmp_path.glob("seed*-x/eval.json"))).stdout)
    assert rows["x"] == ["3", "0.5000 ± 0.3606", "50.00 ± 36.06"]  # stdev(0.2, 0.4, 0.9) = 0.36056


def test_extrapolation_tables_group_seeds(tmp_path):
    """Labels that differ only in the seed (also before a +YaRN suffix) form a group: mean ± sample std."""
    rng = random.Random(3)
    labels = [f"{m}-s{s}{y}" for s in (1337, 1338, 1339) for m, y in (("PoPE", ""), ("RoPE", "+YaRN"))]
    labels.append("RoPE+YaRN-ft-s1337+YaRN")
    models = {lab: {"label": lab, "block_size": 64, "results": {str(L): {
        "ppl": rng.uniform(10, 900),
        "buckets": [{"start": a, "end": a + 64, "nll": rng.uniform(2, 6)} for a in range(0, L, 64)]}
        for L in (64, 128)}} for lab in labels}
    (tmp_path / "e.json").write_text(json.dumps({"lengths": [64, 128], "models": models}))
    rows = rows_of(run("summarize.py", "--extrapolation", tmp_path / "e.json").stdout)
    for g, members in (("PoPE", labels[0:6:2]), ("RoPE+YaRN", labels[1:6:2])):
        for j, L in enumerate((64, 128)):
            xs = [models[m]["results"][str(L)]["ppl"] for m in members]
            assert rows[g][1 + j] == f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}"
        xs = [models[m]["results"]["128"]["buckets"][1]["nll"] for m in members]
        assert f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f}" in rows["64–127"]
    ft = models[labels[6]]["results"]
    assert rows["RoPE+YaRN-ft+YaRN"] == ["1", f"{ft['64']['ppl']:.1f}", f"{ft['128']['ppl']:.1f}"]
    r = run("summarize.py", "--extrapolation", tmp_path / "e.json", "--labels", "PoPE,RoPE", check=False)
    assert r.returncode != 0 and r.stdout == ""


@pytest.mark.parametrize("env", [{"EXTRA": "--weight_decay=0.0"}, {"OBJECTIVE": "every"},
                                 {"VARIANT": "reversed"}])
def test_indirect_indexing_script_refuses_settings_that_would_mix_runs(tmp_path, env):
    """EXTRA without LABEL would put another setting's runs into the default's folders: stop first."""
    r = subprocess.run(["bash", str(REPO / "results" / "indirect_indexing.sh")], capture_output=True,
                       cwd=tmp_path, env={**os.environ, "RESULTS": str(tmp_path / "r"), "SEEDS": " ", **env})
    assert r.returncode == 1 and not (tmp_path / "r").exists()


def test_results_scripts_name_only_configs_that_exist():
    names = []
    for script in sorted((REPO / "results").glob("*.sh")):
        text = script.read_text()
        commands = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for path in re.findall(r"config/[\w${}./-]+?\.py", commands):  # tasks.sh: config/$task.py per task
            tasks = re.findall(r"^\s+(\w+)\)\s+python prepare/\1\.py", text, re.M) if "$task" in path else []
            assert "$" not in path or len(tasks) == 3, (script.name, path)
            names += [f"config/{t}.py" for t in tasks] or [path]
    assert len(names) >= 10 and [n for n in names if not (REPO / n).is_file()] == []


def test_setup_writes_the_provenance_with_the_commit_given_or_unknown(tmp_path):
    for env, commit, dirty in (({"POPE_COMMIT": "abc1234", "POPE_DIRTY": ""}, "abc1234", "no"),
                               ({}, "unknown", "unknown")):
        out = tmp_path / commit  # (the caller's own POPE_COMMIT / POPE_DIRTY are left out)
        base = {k: v for k, v in os.environ.items() if k not in ("POPE_COMMIT", "POPE_DIRTY")}
        subprocess.run(["bash", "-c", f"source {REPO}/results/setup.sh"], cwd=tmp_path, check=True,
                       env={**base, "OUT": str(out), "GIT_DIR": str(tmp_path / "none"), **env})
        text = (out / "env.txt").read_text()
        lines = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        assert lines["commit"] == commit and lines["dirty"] == dirty and lines["date"][:2] == "20"


def test_delta_stats_against_a_float64_reference(tmp_path):
    """Each run's row: moved share, median |phase| and share outside [-2pi, 0] of the clamped parameter; a
    RoPE checkpoint anywhere in the list is refused (exit 1, nothing on stdout, its path named)."""
    import numpy as np
    import torch
    from model import GPT, GPTConfig
    rng = np.random.default_rng(5)
    paths, want = [], {}
    for name, pe in (("pope-a", "pope"), ("pope-b", "pope"), ("rope-c", "rope")):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=16, pos_emb=pe,
                              pope_delta_bound="clamp"))
        sd, raw = model.state_dict(), []
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
            phase = np.abs(np.angle(np.exp(1j * np.clip(raw, -2 * math.pi, 0.0))))
            want[name] = [name, "clamp", str(raw.size), f"{(phase > 0.01).mean():.1%}",
                          f"{np.sort(phase)[(raw.size - 1) // 2]:.3f}",  # torch.median: the lower middle one
                          f"{((raw > 0) | (raw < -2 * math.pi)).mean():.1%}"]
    rows = rows_of(run("delta_stats.py", *paths[:2]).stdout)
    assert [[k] + v for k, v in rows.items() if k.startswith("pope")] == [want["pope-a"], want["pope-b"]]
    for order in (paths, paths[::-1]):
        r = run("delta_stats.py", *order, check=False)
        assert r.returncode == 1 and r.stdout == "" and str(paths[2]) in r.stderr


def test_train_step_ratios(tmp_path, monkeypatch):
    """Each path's ms/step over RoPE's of the same file, and PoPE's paths over the PyTorch path's."""
    (tmp_path / "kernel").mkdir()
    for name, ms in (("train-1024-b16", (40, 38, 41, 32)), ("train-1024", (78, 80, 77, 64)),
                     ("train-4096", (100, 95, 96, 80)), ("train-16384", (120, 130, 110, 100))):
        rows = [{"path": p, "batch": 2, "block_size": 8, "ms": m, "tok_s": 1000 / m, "peak_alloc_gb": 20}
                for p, m in zip(("pope-kernel", "pope-torch", "pope-auto", "rope"), ms)]
        (tmp_path / "kernel" / f"{name}.json").write_text(json.dumps({"rows": rows}))
    monkeypatch.setattr(S, "R", str(tmp_path))
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in S.t_train_step().splitlines()[2:]]
    assert [c[1] for c in cells] == ["pope-kernel", "pope-torch", "pope-auto", "rope"] * 4
    assert [c[5:] for c in cells[:4]] == [["1.250", "1.053"], ["1.188", "1.000"], ["1.281", "1.079"],
                                          ["1.000", ""]]  # 40/32, 40/38; 38/32; 41/32, 41/38
    assert [c[5:] for c in cells[12:15]] == [["1.200", "0.923"], ["1.300", "1.000"], ["1.100", "0.846"]]
