"""README.md's commands as a user types them: every `python ...` line of its ```bash blocks runs, in
the README's order, as a subprocess in a scratch copy of the repo, on tiny data this test makes,
with settings that shrink the run appended (the last value wins, as for any setting). Each must exit
0 and leave what it promises. With CUDA visible they run there with their defaults (compile, the
fused kernel, sample.py's CUDA graph); on a CPU, train.py's compile is off. `pip install` and the
test suite itself are not rerun here."""
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
SKIPPED = (("-m", "pip"), ("-m", "pytest"))  # the install, and this suite
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=64"]  # head dim 32, which the kernels take
# (--always_save_checkpoint: 2 steps may not beat step 0's val loss, the quick config's rule)
SHORT = ["--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=2",
         "--lr_decay_iters=2", "--warmup_iters=1", "--eval_interval=2", "--eval_iters=1",
         "--log_interval=1", "--always_save_checkpoint=True"]
SHRINK = {  # script: what is appended (train.py's depend on the command: see shrink())
    "prepare/openwebtext.py": ["--input", "owt.jsonl"],  # the README's offline form (no Hub here)
    "eval_extrapolation.py": ["--max_tokens", "1280"],
    "eval_downstream.py": ["--limit", "2"],
    "sample.py": [] if CUDA else ["--max_new_tokens=16"],  # (on CUDA: 200 tokens, a CUDA graph)
}
# script: the requirements-dev.txt package it cannot run without
NEEDS = {"eval_downstream.py": "lm_eval"}
WORDS = ("the model reads a long prompt and every position after it counts; attention decides "
         "which earlier token matters, and the phase of each key says where it stood. ").split()


def readme_commands():
    """Each python command of README.md's ```bash blocks, as argv lists (comments dropped, lines
    joined at a trailing backslash, && chains split), in the README's order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] == "python" and tuple(argv[1:3]) not in SKIPPED:
                    commands.append(argv)
    return commands


def setting(argv, key, default):
    """The last --key=value of argv, else its config file's (argv[2], if it is one), else
    default."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{key}=")]
    if given:
        return given[-1]
    if len(argv) > 2 and argv[2].endswith(".py"):
        return runpy.run_path(str(ROOT / argv[2])).get(key, default)
    return default


def shrink(argv):
    """The settings appended to argv: train.py's sizes (a fine-tune or resume keeps its checkpoint's
    model)."""
    if argv[1] != "train.py" or "--help" in argv:
        return SHRINK.get(argv[1], [])
    cpu = [] if CUDA else ["--compile=False"]
    if "--init_from=resume" in argv:
        return cpu
    short = SHORT + cpu
    if int(setting(argv, "block_size", 1024)) > 64:  # (a row dataset's config sets its rows')
        short = ["--block_size=64"] + short
    if setting(argv, "init_from", "scratch") != "scratch":
        return short
    return TINY + short


def missing(argv, cwd, out):
    """What a command that exited 0 did not leave in cwd: the files it names, a checkpoint or
    eval.json, the samples on stdout."""
    script = argv[1]
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--json", "--plot")]
    if script == "train.py" and "--help" not in argv:
        out_dir = setting(argv, "out_dir", "out")
        eval_only = setting(argv, "eval_only", False) in (True, "True")
        files.append(os.path.join(out_dir, "eval.json" if eval_only else "ckpt.pt"))
    lacking = [f for f in files if not (cwd / f).is_file() or (cwd / f).stat().st_size == 0]
    if script == "sample.py":  # each sample ends with a line of dashes
        want = int(setting(argv, "num_samples", 3))
        if out.count("\n---------------\n") != want:
            lacking.append(f"{want} samples on stdout")
    return lacking


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A copy of the repo's code (no tests, results or git) and the data the README's commands
    read."""
    root = tmp_path_factory.mktemp("readme")
    skip = shutil.ignore_patterns(".*", "tests", "results", "data", "out*", "__pycache__", "*.md")
    shutil.copytree(ROOT, root, ignore=skip, dirs_exist_ok=True)
    lines = []
    for doc in range(6):  # documents of ~400 tokens: the val split draws one, longer than a block
        words = [WORDS[(doc * 7 + i * 3) % len(WORDS)] for i in range(300)]
        lines.append(json.dumps({"text": " ".join(words)}))
    (root / "owt.jsonl").write_text("\n".join(lines) + "\n")
    (root / "long.txt").write_text(" ".join(WORDS * 20))
    shared = root / "shared"
    (shared / "text" / "english").mkdir(parents=True)
    (shared / "text" / "english" / "tinyshakespeare.txt").write_text(" ".join(WORDS * 60))
    (shared / "evals").mkdir()
    lambada = [{"text": " ".join(WORDS[i:i + 12])} for i in range(4)]
    (shared / "evals" / "lambada_openai.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lambada))
    return root


def run_commands(scratch, commands):
    """Each command, in order, exits 0 and leaves its files (a checkpoint, eval.json, --json/--plot,
    the samples); the first that fails is reported with its output."""
    env = dict(os.environ, POPE_SHARED_DATA=str(scratch / "shared"), PYTHONUNBUFFERED="1")
    for typed in commands:
        argv = [a.replace("$POPE_SHARED_DATA", env["POPE_SHARED_DATA"]) for a in typed]
        full = [sys.executable, *argv[1:], *shrink(argv)]
        p = subprocess.run(full, cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
        what = f"{shlex.join(typed)} (+ {shlex.join(shrink(argv))})"
        assert p.returncode == 0, (
            f"{what}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        lacking = missing(argv, scratch, p.stdout)
        assert not lacking, f"{what}: exit 0 but no {lacking}\n{p.stderr[-2000:]}"


def test_the_readme_commands_run_as_typed(scratch):
    """Every README command but those of NEEDS (the next test's), in the README's order."""
    commands = [argv for argv in readme_commands() if argv[1] not in NEEDS]
    scripts = {argv[1] for argv in commands}
    assert {"train.py", "sample.py", "eval_extrapolation.py", "bench.py"} <= scripts, scripts
    run_commands(scratch, commands)


def test_the_readme_commands_that_need_a_dev_package(scratch):
    """The commands of NEEDS, on the checkpoints the previous test trained; skipped where their
    package is not installed (requirements-dev.txt)."""
    commands = [argv for argv in readme_commands() if argv[1] in NEEDS]
    assert commands, "README.md has no eval_downstream.py command"
    for argv in commands:
        pytest.importorskip(NEEDS[argv[1]])
    run_commands(scratch, commands)
