"""train.py under faults: one run per out_dir, data that changes under a run or
before a resume, damaged and foreign checkpoint files, read-only and full disks,
bad config files and devices, a folder with a log but no checkpoint, and the
progress output (the eval's bar, a smoothed ETA, MFU only on CUDA).

Runs whose process is not under test are `python train.py ...` run in this process
(helpers.run_here: the script's __main__, its exit status and output, without
importing torch again); a live run, two runs at once, the lock a normal exit removes
and a process started without TRITON_INTERPRET are new processes."""
import errno
import fractions
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from helpers import run_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TRAIN = os.path.join(ROOT, "train.py")
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
        "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--device=cpu", "--learning_rate=3e-3",
        "--lr_decay_iters=100"]
WAIT_S = 300  # a safety net for the polling loops below (never an assert on time)


def env():
    e = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    e.pop("TRITON_INTERPRET", None)
    return e


def run(args, cwd, check=True):
    """`python *args` as a new process (what a process is needed for; run_here otherwise)."""
    p = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, env=env(), timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed:\n{p.stdout}\n{p.stderr}")
    return p


def refused(p, *words):
    """Exit status not 0, one line on stderr, no traceback, every word in it."""
    err = p.stderr.strip()
    assert p.returncode != 0 and "Traceback" not in err and len(err.splitlines()) == 1, (p.returncode, err[-2000:])
    for w in words:
        assert w in err, (w, err)
    return err


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in records(out_dir) if "loss" in r}


def wait_until(cond, proc):
    """Poll until cond() holds; the process must stay alive meanwhile."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the run ended early (rc {proc.returncode}):\n{out}\n{err}")
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.05)


def logged_iter(out_dir):
    try:
        it = list(losses(out_dir))
    except (FileNotFoundError, json.JSONDecodeError):
        return -1
    return max(it, default=-1)


def write_rows(folder, row_len, seed, prepare="made by the test"):
    """A fixed-row dataset (the indirect-indexing layout): one scored target per row,
    with the "prepare" and "tokens" entries of a prepare script's meta.json."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    tokens = {}
    for split, n in (("train", 2000), ("val", 200)):
        rows = rng.integers(1, 20, size=(n, row_len)).astype(np.uint16)
        rows[:, -2] = 0
        rows[:, -1] = rows[:, -3]
        mask = np.zeros_like(rows, dtype=np.uint8)
        mask[:, -1] = 1
        rows.tofile(os.path.join(folder, f"{split}.bin"))
        mask.tofile(os.path.join(folder, f"{split}_mask.bin"))
        tokens[split] = rows.size
    meta = {"vocab_size": 20, "dtype": "uint16", "itos": [chr(97 + i) for i in range(20)], "row_len": row_len,
            "prepare": prepare, "tokens": tokens}
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


@pytest.fixture
def data(tmp_path):
    """tmp_path/data/{toy, rows, wide}: a char stream, fixed rows, and a stream with another vocabulary."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for name, V in (("toy", 20), ("wide", 30)):
        os.makedirs(root / name)
        seq = ((np.arange(30000) % 17) + rng.integers(0, 3, 30000)).astype(np.uint16)
        seq[:27000].tofile(root / name / "train.bin")
        seq[27000:].tofile(root / name / "val.bin")
        json.dump({"vocab_size": V, "dtype": "uint16", "itos": [chr(97 + i) for i in range(V)]},
                  open(root / name / "meta.json", "w"))
    write_rows(root / "rows", 12, seed=1)
    return root


def train(data, *args):
    return [TRAIN, f"--data_dir={data}", "--dataset=toy"] + TINY + list(args)


def start(args, cwd):
    return subprocess.Popen([sys.executable] + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())


def stop(proc):
    proc.kill()
    proc.communicate()


# -----------------------------------------------------------------------------
# 1. one run per out_dir

def test_a_second_run_on_a_live_out_dir_is_refused(data, tmp_path):
    """While a run trains in o: a new run, one with --overwrite=True and a resume are
    each refused in one line naming the live run's PID; its log is never replaced or
    interleaved, its checkpoint stays its own; once it is gone, o resumes."""
    out = tmp_path / "o"
    first = start(train(data, "--out_dir=o", "--max_iters=1000000", "--eval_interval=3", "--seed=1"), tmp_path)
    try:
        wait_until(lambda: (out / "ckpt.pt").exists() and logged_iter(out) >= 4, first)
        log_id = os.stat(out / "metrics.jsonl").st_ino
        for extra in ([], ["--overwrite=True"], ["--init_from=resume"]):
            p = run_here(train(data, "--out_dir=o", "--max_iters=5", "--eval_interval=1", "--seed=2") + extra,
                         tmp_path, check=False)
            refused(p, f"pid {first.pid}", "in use by another run", "--out_dir")
        assert first.poll() is None
    finally:
        stop(first)
    assert os.stat(out / "metrics.jsonl").st_ino == log_id
    its = [r["iter"] for r in records(out) if "loss" in r]
    assert its == list(range(len(its))) and len(its) >= 5  # one run's log: every iteration once, in order
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["config"]["seed"] == 1 and ck["iter_num"] % 3 == 0
    # the killed run's lock went with it (a new process: its normal exit removes its own)
    run(train(data, "--out_dir=o", "--init_from=resume", f"--max_iters={ck['iter_num'] + 1}"), tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "metrics.jsonl"]  # a normal exit removes .lock


def test_two_runs_started_together_leave_one_run(data, tmp_path):
    """Two scratch runs on one fresh out_dir at once: one trains, the other is refused
    (in use, or, when the first has already finished, its checkpoint already exists);
    the log holds one run."""
    procs = [start(train(data, "--out_dir=o", "--max_iters=30", "--eval_interval=10"), tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    rcs = sorted(p.returncode for p in procs)
    assert rcs[0] == 0 and rcs[1] != 0, [(p.returncode, o[1][-500:]) for p, o in zip(procs, outs)]
    err = next(o[1] for p, o in zip(procs, outs) if p.returncode != 0).strip()
    assert "Traceback" not in err and ("in use by another run" in err or "already exist" in err), err
    assert [r["iter"] for r in records(tmp_path / "o") if "loss" in r] == list(range(30))
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iter_num"] == 30


# -----------------------------------------------------------------------------
# 2. data that cannot change under a run

def test_a_running_job_keeps_its_data_when_prepare_swaps_the_folder(data, tmp_path):
    """A prepare run swaps a new set (rows of 23 tokens instead of 12) into the folder
    a run trains on: the run goes on with the data it started with (its losses equal,
    bitwise, those of a run on an untouched copy); a resume on the new data is then
    refused in one line unless --data_changed_ok=True, which holds for one resume only."""
    from prepare.common import staged_dataset
    shutil.copytree(data / "rows", tmp_path / "ref" / "rows")
    args = [TRAIN, "--dataset=rows", "--eval_interval=5", "--seed=5"] + TINY
    live = start(args + [f"--data_dir={data}", "--out_dir=live", "--max_iters=1000000"], tmp_path)
    try:
        wait_until(lambda: logged_iter(tmp_path / "live") >= 3, live)
        with staged_dataset(data / "rows") as stage:  # what prepare/*.py does: stage, then swap the folder
            write_rows(stage, 23, seed=2, prepare="regenerated")
        swapped_at = logged_iter(tmp_path / "live")
        wait_until(lambda: logged_iter(tmp_path / "live") >= swapped_at + 8, live)
    finally:
        stop(live)
    assert json.load(open(data / "rows" / "meta.json"))["row_len"] == 23  # the swap happened
    got = losses(tmp_path / "live")
    n = max(got) + 1
    run_here(args + [f"--data_dir={tmp_path / 'ref'}", "--out_dir=ref-run", f"--max_iters={n}"], tmp_path)
    want = losses(tmp_path / "ref-run")
    assert n > swapped_at + 8 and all(got[i] == want[i] for i in range(n)), (swapped_at, got, want)
    ev = lambda d: [r["eval"] for r in records(d) if "eval" in r and r["iter"] < n]  # noqa: E731
    assert ev(tmp_path / "live") == ev(tmp_path / "ref-run")[:len(ev(tmp_path / "live"))]
    # resuming on the regenerated data: refused, then allowed when asked, once
    ck = torch.load(tmp_path / "live" / "ckpt.pt", weights_only=True)
    resume = args + [f"--data_dir={data}", "--out_dir=live", "--init_from=resume", f"--max_iters={ck['iter_num'] + 2}"]
    before = (tmp_path / "live" / "ckpt.pt").read_bytes()
    p = run_here(resume, tmp_path, check=False)
    refused(p, "is not the data", "meta.json differs", "train.bin: 48,000 bytes -> 92,000 bytes",
            "--data_changed_ok=True")
    assert (tmp_path / "live" / "ckpt.pt").read_bytes() == before
    run_here(resume + ["--data_changed_ok=True"], tmp_path)
    ck = torch.load(tmp_path / "live" / "ckpt.pt", weights_only=True)
    assert ck["data"]["bytes"]["train.bin"] == 2000 * 23 * 2 and ck["config"]["data_changed_ok"] is True
    with staged_dataset(data / "rows") as stage:
        write_rows(stage, 23, seed=3, prepare="regenerated with another seed")
    p = run_here(resume[:-1] + [f"--max_iters={ck['iter_num'] + 2}"], tmp_path, check=False)
    refused(p, "meta.json differs", "--data_changed_ok=True")


# -----------------------------------------------------------------------------
# 3. checkpoint integrity, 4. foreign checkpoint files

def test_damaged_and_foreign_checkpoints_are_refused(data, tmp_path, damage):
    """Resume and fine-tune go through model.read_checkpoint (tests/test_checkpoint.py has every kind of bad
    file): a refusal exits non-zero naming the file, changes nothing and starts no run."""
    run_here(train(data, "--out_dir=o", "--max_iters=2", "--eval_interval=2"), tmp_path)
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    resume = train(data, "--out_dir=o", "--init_from=resume", "--max_iters=4")
    damage(tmp_path / "o" / "ckpt.pt")
    bad = (tmp_path / "o" / "ckpt.pt").read_bytes()
    refused(run_here(resume, tmp_path, check=False), os.path.join("o", "ckpt.pt"))
    refused(run_here(train(data, "--out_dir=ft", "--init_from=o/ckpt.pt"), tmp_path, check=False), "o/ckpt.pt")
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == bad and not (tmp_path / "ft").exists()
    torch.save({**ck, "config": {**ck["config"], "odd": fractions.Fraction(1, 3)}}, tmp_path / "pk.pt")
    refused(run_here(train(data, "--out_dir=ft", "--init_from=pk.pt"), tmp_path, check=False), "pk.pt")
    # fine-tuning on data with another vocabulary: the weights that differ are named
    open(tmp_path / "o" / "ckpt.pt", "wb").write(good)
    p = run_here(train(data, "--out_dir=ft", "--init_from=o/ckpt.pt", "--dataset=wide"), tmp_path, check=False)
    refused(p, "transformer.wte.weight")
    assert not (tmp_path / "ft").exists()
    # an intact checkpoint still resumes, and evaluates with --eval_only into out_dir/eval.json
    run_here(resume, tmp_path)
    run_here(train(data, "--out_dir=o", "--init_from=resume", "--eval_only=True"), tmp_path)
    assert (tmp_path / "o" / "eval.json").is_file()


# -----------------------------------------------------------------------------
# 4. read-only and full disks (a mocked OSError at the write call)

def test_read_only_and_full_disks_get_one_line_and_keep_the_old_files(data, tmp_path, monkeypatch, readonly):
    def read_only(folder):  # every write under folder fails (conftest's readonly), torch.save's too
        def save(obj, f, *a, **k):  # (its zip writer opens the file in C++, past the patched open)
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(f))
        readonly(tmp_path / folder)
        monkeypatch.setattr(torch, "save", save)

    def full_disk(code):  # the write of a checkpoint fails after part of the file was written
        def save(obj, f, *a, **k):
            with open(f, "wb") as part:
                part.write(b"PK\x03\x04" + bytes(4000))
            if code == 0:  # what torch.save itself raises on a full disk
                raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4480 vs 4374")
            raise OSError(code, os.strerror(code), os.fsdecode(f))
        monkeypatch.setattr(torch, "save", save)

    def under(fault, args):  # train.py's __main__, its handler of OSError included, under the fault
        fault()
        try:
            return run_here(args, tmp_path, check=False)
        finally:
            monkeypatch.undo()

    run_here(train(data, "--out_dir=o", "--max_iters=2", "--eval_interval=2"), tmp_path)
    files = lambda: {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}  # noqa: E731
    old = files()
    for args in (["--overwrite=True"], ["--init_from=resume", "--max_iters=4"],
                 ["--init_from=resume", "--eval_only=True"]):  # a read-only out_dir: scratch, resume, eval_only
        p = under(lambda: read_only("o"), train(data, "--out_dir=o", "--max_iters=2", "--eval_interval=2") + args)
        err = refused(p, "Read-only file system", "o")
        assert "wait for it to end" not in err, err  # nothing to wait for
        assert files() == old, args
    # a new out_dir under a read-only folder
    os.makedirs(tmp_path / "ro")
    refused(under(lambda: read_only("ro"), train(data, "--out_dir=ro/o", "--max_iters=2")), "Read-only file system")
    # a full disk at the checkpoint's write: resume (the checkpoint before stays) and scratch
    p = under(lambda: full_disk(errno.ENOSPC), train(data, "--out_dir=o", "--init_from=resume", "--max_iters=4",
                                                     "--eval_interval=2"))
    refused(p, "could not write", "ckpt.pt", "No space left on device", "intact", "--init_from=resume")
    assert files()["ckpt.pt"] == old["ckpt.pt"] and "ckpt.pt.tmp" not in files()  # the part written is gone
    p = under(lambda: full_disk(0), train(data, "--out_dir=n", "--max_iters=2", "--eval_interval=2"))
    err = refused(p, "could not write", "unexpected pos", "this run saved no checkpoint", "start it again")
    assert "intact" not in err and "--init_from=resume" not in err, err  # there is nothing to resume
    assert sorted(os.listdir(tmp_path / "n")) == ["metrics.jsonl"]


# -----------------------------------------------------------------------------
# 4. settings refused before anything is written

def test_config_files_devices_and_kernels_refused_in_one_line(data, tmp_path):
    (tmp_path / "syntax.py").write_text("batch_size = 8\nn_layer = (3\n")
    refused(run_here([TRAIN, "syntax.py"], tmp_path, check=False), "config file syntax.py, line 2")
    (tmp_path / "raises.py").write_text("batch_size = 8\n\nn_layer = 1 // 0\n")
    refused(run_here([TRAIN, "raises.py"], tmp_path, check=False), "config file raises.py, line 3",
            "ZeroDivisionError: integer division or modulo by zero")
    p = run_here(train(data, "--out_dir=o", "--device=tpu"), tmp_path, check=False)
    refused(p, "device must be auto, cpu, cuda or cuda:N (got device='tpu')")
    # a new process, started without TRITON_INTERPRET (this one may have it)
    p = run(train(data, "--out_dir=o", "--attn_impl=triton", "--pos_emb=pope"), tmp_path, check=False)
    refused(p, "attn_impl='triton' cannot run here", "TRITON_INTERPRET=1", "--attn_impl=torch")
    assert not (tmp_path / "o").exists()


# -----------------------------------------------------------------------------
# 5. a folder with a log and no checkpoint

def test_a_log_without_a_checkpoint_is_not_a_run_to_protect(data, tmp_path):
    os.makedirs(tmp_path / "o")
    (tmp_path / "o" / "metrics.jsonl").write_text('{"iter": 0, "loss": 9.0}\n')
    args = train(data, "--out_dir=o", "--max_iters=2", "--eval_interval=2")
    p = run_here(args + ["--init_from=resume"], tmp_path, check=False)
    err = refused(p, "o/ckpt.pt not found", "nothing to resume", "start it anew: python train.py")
    fresh = shlex.split(err.split("start it anew: ")[1])
    assert fresh[:2] == ["python", "train.py"] and "--init_from=resume" not in fresh
    p = run_here([TRAIN] + fresh[2:], tmp_path)  # the command it gives works
    assert "this run's log replaces it" in p.stdout
    assert sorted(losses(tmp_path / "o")) == [0, 1] and 9.0 not in losses(tmp_path / "o").values()
    # a checkpoint, alone: "already exists", one file
    os.remove(tmp_path / "o" / "metrics.jsonl")
    refused(run_here(args, tmp_path, check=False), "o/ckpt.pt already exists:", "replaces it")
    # a missing dataset is said first: the fix of the out_dir would not make the run work
    p = run_here([a for a in args if not a.startswith("--dataset=")] + ["--dataset=nope"], tmp_path, check=False)
    assert "no such dataset folder" in refused(p, "nope") and "already exist" not in p.stderr


# -----------------------------------------------------------------------------
# 6. progress

def test_eval_progress_bar_on_a_terminal_only(data):
    import train as tr
    from contextlib import nullcontext
    from model import GPT, GPTConfig
    from prepare.common import Data

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    d = Data(str(data / "toy"), 32, ["val"])
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=20))
    cfg = {"batch_size": 4, "eval_iters": 7, "seed": 0}
    for bar, stream in ((True, Terminal()), (False, Terminal()), (True, io.StringIO())):
        old, sys.stderr = sys.stderr, stream
        try:
            tr.evaluate(model, d, "val", cfg, "cpu", nullcontext(), bar=bar)
        finally:
            sys.stderr = old
        text = stream.getvalue()
        if bar and stream.isatty():
            assert "eval val" in text and "/7" in text, text
        else:
            assert text == "", text  # no bar off the master rank, none in a log file


def test_eta_is_smoothed_and_mfu_is_cuda_only(data, tmp_path, monkeypatch, capsys):
    """A fake clock: 6 s per step, one step of 306 s at iteration 50. The ETA after
    it may not jump as the last step's rate would (51 min instead of 1.1). Iteration 0
    (compile, warm-up) takes 1006 s: its line has no ETA yet, and the rate leaves it out."""
    import train as tr
    calls = []

    def fake_time():
        calls.append(None)
        n = len(calls)
        # call n: iteration n - 3's log (after start and first eval); iteration 0 (compile) takes 1006 s
        return 6.0 * n + (1000.0 if n >= 3 else 0.0) + (300.0 if n >= 53 else 0.0)

    monkeypatch.setattr(tr, "time", types.SimpleNamespace(time=fake_time))
    tr.main([f"--data_dir={data}", "--dataset=toy", f"--out_dir={tmp_path / 'o'}", "--max_iters=60",
             "--eval_interval=1000"] + TINY)
    out = capsys.readouterr().out
    eta = {int(m[1]): float(m[2]) for m in re.finditer(r"iter (\d+): .*eta ([\d.]+) min", out)}
    assert eta[49] == pytest.approx(11 * 6 / 60, abs=0.051)
    assert eta[49] < eta[50] < 2 * eta[49], (eta[49], eta[50])
    dt = {r["iter"]: r["dt_ms"] for r in records(tmp_path / "o") if "loss" in r}
    # the clock is the one train.py read
    assert dt[50] == pytest.approx(306e3) and dt[49] == pytest.approx(6e3) and dt[0] == pytest.approx(1006e3)
    iter_lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert eta[1] == pytest.approx(59 * 6 / 60, abs=0.051)  # iteration 0's 1006 s left out of the rate
    assert len(eta) == len(iter_lines) - 1 == 59 and not any("mfu" in line for line in iter_lines)
    assert iter_lines[0].startswith("iter 0: ") and iter_lines[0].endswith(", eta ? min"), iter_lines[0]
    assert all("mfu" not in r for r in records(tmp_path / "o"))
