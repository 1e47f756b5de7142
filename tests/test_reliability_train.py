"""train.py under mistakes and faults: the refusals (exit status 1, one line naming the key or file, nothing
written or damaged), one run per out_dir, data that changes under a run or before a resume, damaged and
foreign checkpoints, a diverging run."""
import fractions
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from helpers import run_here, write_rows

import train

TRAIN, ROOT = train.__file__, os.path.dirname(train.__file__)
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=2", "--device=cpu", "--learning_rate=3e-3",
        "--lr_decay_iters=100"]


def args(data_root, *extra):
    return [TRAIN, f"--data_dir={data_root}", "--dataset=toy"] + TINY + list(extra)


def refused(p, *names):
    """Exit status 1, one line on stderr, no traceback, every name in it."""
    err = p.stderr.strip()
    assert p.returncode == 1 and "Traceback" not in err and len(err.splitlines()) == 1, (p.returncode, err)
    assert all(n in err for n in names), (names, err)


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["iter"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def logged_iter(out_dir):
    try:
        return max(losses(out_dir), default=-1)
    except (FileNotFoundError, json.JSONDecodeError):  # (a line being written)
        return -1


def start(argv, cwd):
    return subprocess.Popen([sys.executable] + argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"))


def wait_until(cond, proc):
    """Poll until cond() holds while the process lives (300 s: a safety net, not a timed assert)."""
    deadline = time.monotonic() + 300
    while not cond():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


REFUSALS = {  # family: (settings, a name the one line must hold)
    "unknown key, the nearest named": (["--lerning_rate=1e-3"], "learning_rate"),
    "wrong type": (["--max_iters=ten"], "max_iters"),
    "unknown key in a config file": (["bad.py"], "n_layers"),
    "missing config file": (["nope.py"], "nope.py"),
    "unknown value: model": (["--pos_emb=alibi"], "pos_emb"),
    "unknown value: device": (["--device=tpu"], "device"),
    "unknown value: eval_splits": (["--eval_splits=tset"], "eval_splits"),
    "nonsense number": (["--batch_size=0"], "batch_size"),
    "model rule": (["--n_head=5"], "n_head"),
    "cuda_graph without CUDA": (["--cuda_graph=True"], "cuda_graph"),
    "missing data, its prepare command": (["--dataset=indirect_indexing_quick"], "indirect_indexing.py"),
    "no such checkpoint": (["--init_from=nothing.pt"], "nothing.pt"),
    "nothing to resume": (["--init_from=resume"], "ckpt.pt"),
}


@pytest.mark.parametrize("family", REFUSALS)
def test_refusals(data_root, tmp_path, family):
    settings, name = REFUSALS[family]
    (tmp_path / "bad.py").write_text("batch_size = 8\nn_layers = 3\n")
    p = run_here(args(data_root, "--out_dir=o", "--max_iters=2", *settings), tmp_path, check=False)
    refused(p, name)
    assert not os.path.exists(tmp_path / "o") or os.listdir(tmp_path / "o") == []  # nothing written


def test_checkpoints_are_never_lost(data_root, tmp_path):
    """A new run never replaces a checkpoint unless asked; a diverging run never saves; a resume that names
    another model is refused; --overwrite=True starts afresh."""
    def run(*extra):
        return run_here(args(data_root, "--out_dir=o", "--eval_interval=2", *extra), tmp_path, check=False)
    assert run("--max_iters=4").returncode == 0
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    for extra, name in ((["--max_iters=1"], "ckpt.pt"), (["--init_from=resume", "--n_embd=64"], "n_embd"),
                        (["--init_from=resume", "--max_iters=8", "--learning_rate=1e30", "--min_lr=1"], "")):
        refused(run(*extra), name)
        assert (tmp_path / "o" / "ckpt.pt").read_bytes() == good, extra
    assert run("--max_iters=2", "--overwrite=True").returncode == 0
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iter_num"] == 2
    assert sorted(losses(tmp_path / "o")) == [0, 1]


def test_a_second_run_on_a_live_out_dir_is_refused(data_root, tmp_path):
    """While a run trains in o, a new run, one with --overwrite=True and a resume are refused; the live run's
    log and checkpoint stay its own; once it is gone, o resumes, and a normal exit removes the lock."""
    out = tmp_path / "o"
    first = start(args(data_root, "--out_dir=o", "--max_iters=1000000", "--eval_interval=3", "--seed=1"),
                  tmp_path)
    try:
        wait_until(lambda: (out / "ckpt.pt").exists() and logged_iter(out) >= 4, first)
        for extra in ([], ["--overwrite=True"], ["--init_from=resume"]):
            refused(run_here(args(data_root, "--out_dir=o", "--max_iters=5", "--seed=2", *extra), tmp_path,
                             check=False), "o")
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate()
    its = sorted(losses(out))
    assert its == list(range(len(its))) and len(its) >= 5  # one run's log
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["config"]["seed"] == 1 and ck["iter_num"] % 3 == 0
    p = start(args(data_root, "--out_dir=o", "--init_from=resume", f"--max_iters={ck['iter_num'] + 1}"),
              tmp_path)
    assert p.wait(600) == 0 and sorted(os.listdir(out)) == ["ckpt.pt", "metrics.jsonl"]


def test_data_swapped_under_a_run_and_before_a_resume(data_root, tmp_path):
    """A prepare run swaps new data (rows of 23 tokens) into the folder a run trains on: the run goes on with
    its data (its losses equal those of a run on an untouched copy, bitwise); a resume on the new data is
    refused, naming the files, unless --data_changed_ok=True, which holds for that resume only."""
    from prepare.common import staged_dataset
    for d in ("data", "ref"):
        shutil.copytree(data_root / "rows", tmp_path / d / "rows")
    common = [TRAIN, "--dataset=rows", "--eval_interval=5", "--seed=5"] + TINY
    live = start(common + [f"--data_dir={tmp_path / 'data'}", "--out_dir=live", "--max_iters=1000000"],
                 tmp_path)
    try:
        wait_until(lambda: logged_iter(tmp_path / "live") >= 3, live)
        with staged_dataset(tmp_path / "data" / "rows") as stage:  # what prepare/*.py does
            write_rows(stage, 23, seed=2, prepare="regenerated")
        swapped_at = logged_iter(tmp_path / "live")
        wait_until(lambda: logged_iter(tmp_path / "live") >= swapped_at + 8, live)
    finally:
        live.kill()
        live.communicate()
    got = losses(tmp_path / "live")
    run_here(common + [f"--data_dir={tmp_path / 'ref'}", "--out_dir=ref", f"--max_iters={max(got) + 1}"],
             tmp_path)
    want = losses(tmp_path / "ref")
    assert all(got[i] == want[i] for i in got), (swapped_at, got, want)
    ck = torch.load(tmp_path / "live" / "ckpt.pt", weights_only=True)
    resume = common + [f"--data_dir={tmp_path / 'data'}", "--out_dir=live", "--init_from=resume"]
    before = (tmp_path / "live" / "ckpt.pt").read_bytes()
    refused(run_here(resume + [f"--max_iters={ck['iter_num'] + 2}"], tmp_path, check=False),
            "meta.json", "train.bin", "--data_changed_ok")
    assert (tmp_path / "live" / "ckpt.pt").read_bytes() == before
    run_here(resume + [f"--max_iters={ck['iter_num'] + 2}", "--data_changed_ok=True"], tmp_path)
    ck = torch.load(tmp_path / "live" / "ckpt.pt", weights_only=True)
    assert ck["data"]["bytes"]["train.bin"] == 2000 * 23 * 2 and ck["meta"]["row_len"] == 23
    with staged_dataset(tmp_path / "data" / "rows") as stage:
        write_rows(stage, 23, seed=3, prepare="regenerated with another seed")
    refused(run_here(resume + [f"--max_iters={ck['iter_num'] + 2}"], tmp_path, check=False), "meta.json")


def test_damaged_and_foreign_checkpoints_are_refused(data_root, tmp_path, damage):
    """Resume and fine-tune read through model.read_checkpoint (tests/test_checkpoint.py: every bad kind): a
    refusal names the file and changes nothing; so does a fine-tune on data of another vocabulary."""
    run_here(args(data_root, "--out_dir=o", "--max_iters=2", "--eval_interval=2"), tmp_path)
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    torch.save({**ck, "config": {**ck["config"], "odd": fractions.Fraction(1, 3)}}, tmp_path / "pk.pt")
    shutil.copy(tmp_path / "o" / "ckpt.pt", tmp_path / "bad.pt")
    damage(tmp_path / "bad.pt")
    for source, extra in (("bad.pt", []), ("pk.pt", []), ("o/ckpt.pt", ["--dataset=wide"])):
        p = run_here(args(data_root, "--out_dir=ft", f"--init_from={source}", *extra), tmp_path, check=False)
        refused(p, source if not extra else "vocab_size")
        assert os.listdir(tmp_path / "ft") == [] and (tmp_path / "o" / "ckpt.pt").read_bytes() == good
    for source in ("bad.pt", "pk.pt"):
        shutil.copy(tmp_path / source, tmp_path / "o" / "ckpt.pt")
        refused(run_here(args(data_root, "--out_dir=o", "--init_from=resume"), tmp_path, False), "ckpt.pt")

