"""The results/ scripts on made-up inputs: summarize.py's lift-off steps, run discovery, attention
paths, groups of seeds, frequency shares and step ratios; delta_stats.py's phases; the drivers'
refusals, configs and provenance file."""
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_results_tables import summarize  # a fresh results/summarize.py reading a given tree

REPO = Path(__file__).resolve().parent.parent


def rows_of(table):
    return {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines()[2:]}


def run(script, *args, check=True):
    r = subprocess.run([sys.executable, str(REPO / "results" / script), *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0 or not check, r.stderr
    return r


def test_lift_off_from_a_log_or_metrics_and_censored_runs(tmp_path):
    """The first periodic eval above each threshold, from the log where there is one, else from the
    metrics (never the whole-split evaluation at the end); a run that never passes it is
    censored."""
    folder = tmp_path / "indirect_indexing" / "target"
    accs = {0: 0.01, 2000: 0.14, 4000: 0.151, 6000: 0.49, 8000: 0.52, 10000: 0.40}
    for name in ("seed7-pope", "seed7-rope"):
        (folder / name).mkdir(parents=True)
        (folder / name / "eval.json").write_text(
            json.dumps({"iter": 10000, "test": {"loss": 1, "acc": 0.9}}))
    periodic = "".join(json.dumps({"iter": i, "eval": {"val": {"loss": 2.0, "acc": a}}}) + "\n"
                       for i, a in accs.items())
    final = {"iter": 10000,
             "eval": {"val": {"loss": 1, "acc": 0.9}, "test": {"loss": 1, "acc": 0.9}}}
    (folder / "seed7-pope" / "metrics.jsonl").write_text(periodic + json.dumps(final))
    (folder / "seed7-rope.log").write_text("".join(
        f"iter {i}: loss 1.0\nstep {i}: train loss 1.5 acc 0.9, val loss 2.0 acc {a / 2:.4f}\n"
        for i, a in accs.items()))
    s = summarize(tmp_path)
    runs = s.ii_runs()[("target", s.FULL)]
    # 85%: passed only by the final whole-split eval (0.9), which is not a periodic one
    assert [s.lift(runs[7, "pope"], p) for p in (15, 50, 85)] == [4000, 8000, None]
    assert [s.step_k(runs[7, "rope"], p) for p in (5, 15, 50)] == ["2k", "6k", "> 10k"]
    assert s.step_k(runs[7, "pope"], 85) == "> 10k"  # censored at the last periodic eval
    assert s.first(("target", s.FULL), "pope", ("target", s.FULL), "rope", 15)[:3] == (1, 0, 0)
    # 0.5%: PoPE passes at step 0 (counted as a pass, not as never), RoPE at 2,000
    assert s.first(("target", s.FULL), "pope", ("target", s.FULL), "rope", 0.5)[:3] == (1, 0, 0)


def test_runs_are_found_by_their_folders(tmp_path):
    """seed<S>-<pe>[-<N>steps] folders with an eval.json, by folder and steps."""
    for run in ("all/seed1-pope", "target-x/seed2-rope-200000steps", "target/seed3-none",
                "target/notes", "target/seed4-pope"):
        (tmp_path / "indirect_indexing" / run).mkdir(parents=True)
        if run != "target/seed4-pope":  # no eval.json: not a run
            (tmp_path / "indirect_indexing" / run / "eval.json").write_text("{}")
    s = summarize(tmp_path)
    assert {a: sorted(r) for a, r in s.ii_runs().items()} == {
        ("target", 100000): [(3, "none")],
        ("target-x", 200000): [(2, "rope")],
        ("all", 100000): [(1, "pope")]}
    assert s.arm_name(("target-x", 200000)) == "target-x, 200k steps"


@pytest.mark.parametrize("line, path", [
    ("attention: pope: the fused Triton kernel of pope_kernel.py (attn_impl='auto' on CUDA)",
     "kernel"),
    ("model: 4.75M parameters, pope: the PyTorch path of model.py "
     "(attn_impl='auto', torch.compile)", "PyTorch path"),
    ("model: 4.75M parameters, pope: the kernel of pope_kernel.py (attn_impl='auto')", "kernel"),
    ("attention: rope: PyTorch SDPA (model.py)", "SDPA")])
def test_attention_path_of_each_log_format(tmp_path, line, path):
    (tmp_path / "run.log").write_text(
        f"tokens per iteration: 3,264\n{line}\nstep 0: val loss 1 acc 0\n")
    s = summarize(tmp_path)
    assert s.attention("run.log") == path and s.attention("none.log") == "no log"


def test_tasks_split_by_the_attention_path_of_popes_training(tmp_path):
    """A task whose PoPE runs trained on two paths gets a paired row per path, over those seeds."""
    nll = {("pope", 1): 0.50, ("pope", 2): 0.52, ("pope", 3): 0.49,
           ("rope", 1): 0.53, ("rope", 2): 0.55, ("rope", 3): 0.50}
    for (pe, s), x in nll.items():
        run = tmp_path / "tasks" / f"jsb-{pe}-{s}-short"
        run.mkdir(parents=True)
        (run / "eval.json").write_text(
            json.dumps({"iter": 9, "val": {"loss": x}, "test": {"loss": x}}))
        path = ("PyTorch SDPA" if pe == "rope"
                else "the fused Triton kernel" if s < 3 else "the PyTorch path")
        (tmp_path / "tasks" / f"jsb-{pe}-{s}-short.log").write_text(
            f"attention: {pe}: {path} of x\n")
    s = summarize(tmp_path)
    s.TASKS = {("jsb", "short"): "JSB"}
    s.PAPER = {**s.PAPER, "jsb": (0.4, 0.5)}
    [(name, r, _, subs)] = s.task_rows()
    paths = dict(subs)
    assert name == "JSB" and list(paths) == ["PoPE on the kernel (seeds 1/2)",
                                             "PoPE on the PyTorch path (seeds 3)"]
    assert r["mean"] == pytest.approx(statistics.mean([-0.03, -0.03, -0.01]))
    assert paths["PoPE on the kernel (seeds 1/2)"]["keys"] == [1, 2]


def test_extrapolation_groups_seeds(tmp_path):
    """Labels that differ only in the seed (also before a +YaRN suffix) form a group: mean ± sample
    std."""
    rng = np.random.default_rng(3)
    labels = [f"{m}-s{s}{y}" for s in (1337, 1338, 1339)
              for m, y in (("PoPE", ""), ("RoPE", "+YaRN"))]
    models = {lab: {"results": {str(L): {"ppl": float(rng.uniform(10, 900))} for L in (64, 128)}}
              for lab in labels + ["PoPE-clamp-s1337"]}
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "extrapolation.json").write_text(
        json.dumps({"lengths": [64, 128], "models": models}))
    rows = rows_of(summarize(tmp_path).t_lm_ppl())
    for g, members in (("PoPE", labels[0:6:2]), ("RoPE+YaRN", labels[1:6:2])):
        xs = [models[m]["results"]["128"]["ppl"] for m in members]
        x64 = [models[m]["results"]["64"]["ppl"] for m in members]
        assert rows[g] == ["3", f"{statistics.mean(x64):.1f} ± {statistics.stdev(x64):.1f}",
                           f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}"]
    # the groups RESULTS shows, the runs there are of
    assert list(rows) == ["PoPE", "RoPE+YaRN"]


def test_slim_keeps_what_the_shares_come_from(tmp_path):
    """--slim drops q_mag, k_mag, share and the top-quarter shares; the shares made again from the
    weight equal those eval_frequencies.py wrote (a float64 reference here)."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0, 1, (3, 2, 8))  # (layer, head, channel)
    share = w.sum(1) / w.sum((1, 2))[:, None]
    m = {"weight": w.tolist(), "share": share.tolist(), "q_mag": w.tolist(), "k_mag": w.tolist(),
         "top_quarter_share": share[:, :2].sum(1).tolist(),
         "top_quarter_share_mean": share[:, :2].sum(1).mean()}
    path = tmp_path / "indirect_indexing" / "target" / "frequencies-seed5-pope.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"models": {"seed5-pope": m}}))
    run("summarize.py", "--slim", path)
    assert list(json.loads(path.read_text())["models"]["seed5-pope"]) == ["weight"]
    (tmp_path / "lm").mkdir()
    (tmp_path / "lm" / "frequencies.json").write_text(json.dumps({"models": {}}))
    top, even = summarize(tmp_path).freq()[("indirect_indexing/target", "seed5-pope")]
    assert top == pytest.approx(m["top_quarter_share"], abs=1e-12)
    assert even == pytest.approx(share.mean(0) * 8, abs=1e-12)


@pytest.mark.parametrize("env", [{"EXTRA": "--weight_decay=0.0"}, {"OBJECTIVE": "every"},
                                 {"VARIANT": "reversed"}])
def test_indirect_indexing_script_refuses_settings_that_would_mix_runs(tmp_path, env):
    """EXTRA without LABEL would put another setting's runs into the default's folders: stop
    first."""
    r = subprocess.run(["bash", str(REPO / "results" / "indirect_indexing.sh")],
                       capture_output=True, cwd=tmp_path,
                       env={**os.environ, "RESULTS": str(tmp_path / "r"), "SEEDS": " ", **env})
    assert r.returncode == 1 and not (tmp_path / "r").exists()


def test_results_scripts_name_only_configs_that_exist():
    names = []
    for script in sorted((REPO / "results").glob("*.sh")):
        text = script.read_text()
        commands = "\n".join(line for line in text.splitlines()
                             if not line.lstrip().startswith("#"))
        # tasks.sh: config/$task.py per task
        for path in re.findall(r"config/[\w${}./-]+?\.py", commands):
            tasks = (re.findall(r"^\s+(\w+)\)\s+python prepare/\1\.py", text, re.M)
                     if "$task" in path else [])
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
    """Each run's row: moved share, median |phase| and share outside [-2pi, 0] of the clamped
    parameter; a RoPE checkpoint anywhere in the list is refused (exit 1, nothing on stdout, its
    path named)."""
    import numpy as np
    import torch
    from model import GPT, GPTConfig
    rng = np.random.default_rng(5)
    paths, want = [], {}
    for name, pe in (("pope-a", "pope"), ("pope-b", "pope"), ("rope-c", "rope")):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=16,
                              pos_emb=pe, pope_delta_bound="clamp"))
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
                          # torch.median: the lower middle one
                          f"{np.sort(phase)[(raw.size - 1) // 2]:.3f}",
                          f"{((raw > 0) | (raw < -2 * math.pi)).mean():.1%}"]
    rows = rows_of(run("delta_stats.py", *paths[:2]).stdout)
    assert ([[k] + v for k, v in rows.items() if k.startswith("pope")]
            == [want["pope-a"], want["pope-b"]])
    for order in (paths, paths[::-1]):
        r = run("delta_stats.py", *order, check=False)
        assert r.returncode == 1 and r.stdout == "" and str(paths[2]) in r.stderr


def test_train_step_ratios(tmp_path):
    """Each path's ms/step over RoPE's of the same file, and PoPE's paths over the PyTorch
    path's."""
    (tmp_path / "kernel").mkdir()
    for name, ms in (("train-1024-b16", (40, 38, 41, 32)), ("train-1024", (78, 80, 77, 64)),
                     ("train-4096", (100, 95, 96, 80)), ("train-16384", (120, 130, 110, 100))):
        rows = [{"path": p, "batch": 2, "block_size": 8, "ms": m, "tok_s": 1000 / m,
                 "peak_alloc_gb": 20}
                for p, m in zip(("pope-kernel", "pope-torch", "pope-auto", "rope"), ms)]
        (tmp_path / "kernel" / f"{name}.json").write_text(json.dumps({"rows": rows}))
    cells = [[c.strip() for c in line.strip("|").split("|")]
             for line in summarize(tmp_path).t_train_step().splitlines()[2:]]
    assert [c[1] for c in cells] == ["pope-kernel", "pope-torch", "pope-auto", "rope"] * 4
    # 40/32, 40/38; 38/32; 41/32, 41/38
    assert [c[5:] for c in cells[:4]] == [["1.250", "1.053"], ["1.188", "1.000"],
                                          ["1.281", "1.079"], ["1.000", ""]]
    assert [c[5:] for c in cells[12:15]] == [["1.200", "0.923"], ["1.300", "1.000"],
                                             ["1.100", "0.846"]]
