"""train.py on tiny seeded datasets (conftest's data_root). Its numbers: a resume goes on bitwise,
2-process DDP (gloo) equals one process, loss masks and fixed rows, the full-split eval, the
optimizer step against a float64 recomputation. Its refusals (exit status 1, one line naming the key
or file, nothing written or damaged): mistakes, one run per out_dir, data changed under a run or
before a resume, bad checkpoints, a diverging run. Runs are in this process (helpers.run_here), or
new ones where a process is tested."""
import copy
import fractions
import json
import math
import os
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_here, write_rows

import train
from configurator import configure
from model import GPT, GPTConfig

TRAIN = train.__file__
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
        "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--device=cpu",
        "--learning_rate=3e-3", "--lr_decay_iters=100"]


def start(argv, cwd):
    """`python *argv` as a new process (where a process is what is tested), with conftest's thread
    count."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(TRAIN))
    return subprocess.Popen([sys.executable] + argv, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def run(argv, cwd):
    out, err = (p := start(argv, cwd)).communicate(timeout=600)
    assert p.returncode == 0, f"{argv} failed:\n{out}\n{err}"


def records(out_dir, key):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if key in r]


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in records(out_dir, "loss")}


def test_resume_reproduces_uninterrupted_run(data_root, tmp_path):
    """8 steps at once, or 4 and a resume to 8 in a new process: the same losses, bitwise (with
    dropout)."""
    common = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=4",
              "--gradient_accumulation_steps=2", "--dropout=0.1", "--lr_decay_iters=8"] + TINY
    run_here(common + ["--max_iters=8", "--out_dir=full"], tmp_path)
    run_here(common + ["--max_iters=4", "--out_dir=part"], tmp_path)
    ck = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)
    assert ck["iter_num"] == 4 and ck["config"]["dropout"] == 0.1 and "optimizer" in ck
    # no .tmp, no lock left
    assert sorted(os.listdir(tmp_path / "part")) == ["ckpt.pt", "metrics.jsonl"]
    run(common + ["--max_iters=8", "--out_dir=part", "--init_from=resume"], tmp_path)
    full, part = losses(tmp_path / "full"), losses(tmp_path / "part")
    # bitwise; it learns
    assert full == part and sorted(full) == list(range(8)) and full[7] < full[0] - 0.3
    # a finished run's resume: one more eval, no step
    before = (tmp_path / "full" / "ckpt.pt").read_bytes()
    run_here(common + ["--max_iters=8", "--out_dir=full", "--init_from=resume"], tmp_path)
    assert (losses(tmp_path / "full") == full
            and (tmp_path / "full" / "ckpt.pt").read_bytes() == before)


def test_rows_loss_mask_and_full_eval(data_root, tmp_path):
    """Only masked targets count: a model learns the copy task. The full eval scores every row once,
    and a resume takes dataset and data_dir from its checkpoint (the README's command names
    neither)."""
    # (later keys override TINY's)
    run_here([TRAIN, f"--data_dir={data_root}", "--dataset=rows", "--out_dir=o"] + TINY + [
        "--block_size=11", "--max_iters=150", "--eval_interval=150", "--eval_iters=4",
        "--batch_size=32",
        "--gradient_accumulation_steps=1", "--lr_decay_iters=150"], tmp_path)
    ev = [r["eval"] for r in records(tmp_path / "o", "eval")]  # one scored token per row:
    assert (ev[0]["val"]["tokens"] == 4 * 32 and ev[-1]["val"]["acc"] > 0.9
            and ev[0]["val"]["acc"] < 0.3)
    log = (tmp_path / "o" / "metrics.jsonl").read_bytes()
    run_here([TRAIN, "--out_dir=o", "--init_from=resume", "--eval_only=True", "--eval_full=True",
              "--eval_splits=val"], tmp_path)
    assert (tmp_path / "o" / "metrics.jsonl").read_bytes() == log  # the run's log stays the run's
    full = json.load(open(tmp_path / "o" / "eval.json"))
    assert full["val"]["tokens"] == 200 and full["full"] is True and full["iter"] == 150


def test_train_mask_false_trains_on_every_token(data_root, tmp_path):
    """The logged iteration-0 loss, with train_mask True and False, against a float64 cross-entropy
    of the same initial model on the same batch; the eval scores the masked targets either way."""
    data, rng = train.Data(str(data_root / "rows"), 11, ["train", "val"]), np.random.default_rng(7)
    while True:  # a seed whose batch tells the two losses apart
        seed = int(rng.integers(1 << 30))
        torch.manual_seed(seed)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=11,
                              vocab_size=20)).double().eval()
        x, y, m = data.get_batch("train", data.starts("train", 4, train.make_gen(seed, 0, 0)),
                                 "cpu")
        with torch.no_grad():
            nll = F.cross_entropy(model(x, y)[0].double().flatten(0, 1), y.flatten(),
                                  reduction="none")
        nll = nll.view_as(y)
        want = {True: float((nll * m).sum() / m.sum()), False: float(nll.mean())}
        if abs(want[True] - want[False]) > 1e-3:
            break
    assert m.sum() == 4, seed
    args = [TRAIN, f"--data_dir={data_root}", "--dataset=rows"] + TINY + ["--block_size=11",
        "--max_iters=1", "--eval_interval=1", "--gradient_accumulation_steps=1", f"--seed={seed}"]
    for flag in (True, False):
        run_here(args + [f"--out_dir=o{flag}", f"--train_mask={flag}"], tmp_path)
        assert losses(tmp_path / f"o{flag}")[0] == pytest.approx(want[flag], abs=1e-4), (seed, flag)
    ev = [records(tmp_path / f"o{flag}", "eval")[0]["eval"] for flag in (True, False)]
    assert ev[0] == ev[1] and ev[0]["val"]["tokens"] == 2 * 4


def test_ddp_matches_single_process(data_root, tmp_path):
    """torchrun with 2 gloo ranks draws one process's global batch; its resume goes on with the same
    losses, and only rank 0 writes."""
    common = [f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=3", "--max_iters=6",
              "--gradient_accumulation_steps=4", "--lr_decay_iters=6"] + TINY
    ddp = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN]
    run_here([TRAIN, "--out_dir=one"] + common, tmp_path)
    run(ddp + ["--out_dir=two"] + common, tmp_path)
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(6)) and one[5] < one[0]
    assert two == pytest.approx(one, rel=1e-5)
    run(ddp + ["--out_dir=part"] + common + ["--max_iters=3"], tmp_path)
    assert torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)["iter_num"] == 3
    run(ddp + ["--out_dir=part", "--init_from=resume"] + common, tmp_path)
    assert sorted(os.listdir(tmp_path / "part")) == ["ckpt.pt", "metrics.jsonl"]
    assert losses(tmp_path / "part") == pytest.approx(two, rel=1e-6)


def test_train_step_against_float64_formulas(data_root):
    """Two train_steps of a float64 model against a float64 recomputation: the loss averaged over
    accum micro-batches, the gradient clipped to total norm clip, AdamW (bias-corrected moments,
    decoupled weight decay on the 2-D weights but PoPE's delta) and delta projected into
    [-2pi, 0]."""
    seed = 1234
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=11, vocab_size=20,
                          attn_impl="torch", pope_delta_init="uniform",
                          pope_delta_bound="project")).double()
    # half of delta above 0, half below -2pi: a step leaves them out, to be projected
    with torch.no_grad():
        model.transformer.h[0].attn.delta[:, 0::2] = 1.0
        model.transformer.h[0].attn.delta[:, 1::2] = -7.0
    ref = copy.deepcopy(model)
    lr, wd, (b1, b2), clip, accum, eps = 0.05, 0.1, (0.9, 0.95), 0.1, 2, 1e-8
    opt = model.configure_optimizers(wd, lr, (b1, b2), "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    data = train.Data(str(data_root / "rows"), 11, ["train"])
    batches = [[data.get_batch("train", data.starts("train", 4, train.make_gen(seed, it, micro)),
                               "cpu")
                for micro in range(accum)] for it in range(2)]
    got = [train.train_step(model, model, opt, scaler, nullcontext(), accum, clip,
                            lambda mi: batches[it][mi]).item() for it in range(2)]
    params = dict(ref.named_parameters())
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    want, clamped = [], 0
    for it in range(2):
        loss = sum(ref(x, y, m)[1] for x, y, m in batches[it]) / accum
        want.append(loss.item())
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
        with torch.no_grad():
            for n, p in params.items():
                g = grads[n] * min(1.0, clip / (norm + 1e-6))
                m1, m2 = moments[n]
                m1.mul_(b1).add_((1 - b1) * g)
                m2.mul_(b2).add_((1 - b2) * g * g)
                if p.dim() >= 2 and not n.endswith("attn.delta"):
                    p.mul_(1 - lr * wd)
                p.sub_(lr * (m1 / (1 - b1 ** (it + 1)))
                       / ((m2 / (1 - b2 ** (it + 1))).sqrt() + eps))
                if n.endswith("attn.delta"):
                    clamped += int(((p < -2 * math.pi) | (p > 0)).sum())
                    p.clamp_(-2 * math.pi, 0.0)
    assert clamped > 0 and norm > clip  # the projection and the clipping both acted
    assert got == pytest.approx(want, rel=1e-12)
    for n, p in model.named_parameters():
        assert torch.allclose(p, params[n], rtol=1e-5, atol=1e-7), (
            n, (p - params[n]).abs().max().item())


# -----------------------------------------------------------------------------
def test_a_float16_resume_keeps_the_loss_scale(data_root, tmp_path):
    """float16's GradScaler state is in the checkpoint and a resume goes on from it: a scale the
    checkpoint holds (as after overflows) is the resumed run's, not a fresh one."""
    common = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=2",
              "--dtype=float16", "--lr_decay_iters=4"] + TINY
    run_here(common + ["--max_iters=2", "--out_dir=o"], tmp_path)
    path = tmp_path / "o" / "ckpt.pt"
    ck = torch.load(path, weights_only=True)
    assert ck["iter_num"] == 2 and ck["scaler"]["scale"] > 1.0
    ck["scaler"]["scale"] = 1024.0  # fewer than the 2,000 clean steps that would double it
    torch.save(ck, path)
    run_here(common + ["--max_iters=4", "--out_dir=o", "--init_from=resume"], tmp_path)
    ck = torch.load(path, weights_only=True)
    assert ck["iter_num"] == 4 and ck["scaler"]["scale"] == 1024.0


# refusals and faults

def args(data_root, *extra):
    return [TRAIN, f"--data_dir={data_root}", "--dataset=toy"] + TINY + list(extra)


def refused(p, *names):
    """Exit status 1, one line on stderr, no traceback, every name in it."""
    err = p.stderr.strip()
    assert (p.returncode == 1 and "Traceback" not in err
            and len(err.splitlines()) == 1), (p.returncode, err)
    assert all(n in err for n in names), (names, err)


def empty(d):
    """Nothing written: no folder d, or an empty one."""
    return not os.path.exists(d) or os.listdir(d) == []


def logged_iter(out_dir):
    try:
        return max(losses(out_dir), default=-1)
    except (FileNotFoundError, json.JSONDecodeError):  # (a line being written)
        return -1


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
    "missing data, its prepare command": (["--dataset=indirect_indexing_quick"],
                                          "indirect_indexing.py"),
    # (toy's val: 3,000 tokens)
    "a split shorter than block_size + 1": (["--block_size=3000"], "val.bin"),
    "rows of 12 at another block_size (TINY's 32)": (["--dataset=rows"], "block_size"),
    "a split the dataset has none of": (["--dataset=rows", "--eval_splits=val,test"],
                                        "eval_splits"),
    "no such checkpoint": (["--init_from=nothing.pt"], "nothing.pt"),
    "nothing to resume": (["--init_from=resume"], "ckpt.pt"),
}


@pytest.mark.parametrize("family", REFUSALS)
def test_refusals(data_root, tmp_path, family):
    settings, name = REFUSALS[family]
    (tmp_path / "bad.py").write_text("batch_size = 8\nn_layers = 3\n")
    p = run_here(args(data_root, "--out_dir=o", "--max_iters=2", *settings), tmp_path, check=False)
    refused(p, name)
    assert empty(tmp_path / "o")


def test_config_files_read_settings_and_a_flag_wins_wherever_typed(tmp_path):
    """A config file may read a setting (as nanoGPT's do: warmup from max_iters, a comprehension
    over n_layer); a --key=value typed before the file still wins over the file's value."""
    (tmp_path / "c.py").write_text("n_layer = 4\nwarmup_iters = max_iters // 10\n"
                                   "_sizes = [n_layer * i for i in range(3)]\n"
                                   "lr_decay_iters = _sizes[-1]\nmax_iters = 7\n")
    cfg, given = configure(["--max_iters=50", str(tmp_path / "c.py"), "--n_layer=6"],
                           train.DEFAULTS)
    assert (cfg["max_iters"], cfg["n_layer"], cfg["lr_decay_iters"]) == (50, 6, 8)
    assert cfg["warmup_iters"] == train.DEFAULTS["max_iters"] // 10
    assert given == {"max_iters", "n_layer", "warmup_iters", "lr_decay_iters"}


BAD_SETTINGS = [  # (setting=value that its RULES row or GPTConfig refuses, other settings it needs)
    ("max_iters=-1", []), ("min_lr=1.0", []), ("min_lr=-1.0", []), ("warmup_iters=-1", []),
    ("weight_decay=-1.0", []), ("grad_clip=-1.0", []), ("dropout=1.0", []), ("dropout=-0.5", []),
    ("dropout=2.0", []), ("pope_base=1.0", []), ("rope_base=0.5", ["--pos_emb=rope"]),
    ("peak_flops=0.0", []), ("beta1=1.0", []), ("beta2=-0.5", []), ("beta2=1.5", []),
    ("n_head=0", []), ("n_head=-2", []), ("n_embd=0", []), ("n_embd=-4", []), ("seed=-1", []),
    (f"seed={10**20}", []), ("rope_scaling_orig_len=-1", []), ("batch_size=100000000", []),
    ("eval_only=True", []),  # (init_from: scratch, a random model's score)
    ("learning_rate=0.0", []), ("eval_splits=train,,val", []), ("out_dir=", []),
    ("device=cuda:64", []),  # (no machine has 65 GPUs)
    ("attn_impl=triton", ["--device=cpu"]),  # (the kernels run on CUDA or with TRITON_INTERPRET=1)
]


@pytest.mark.parametrize("setting, extra", BAD_SETTINGS, ids=[s for s, _ in BAD_SETTINGS])
def test_the_settings_table_refuses_before_anything_is_written(data_root, tmp_path, monkeypatch,
                                                                setting, extra):
    """A value out of its setting's range is one line naming the setting, before out_dir is made."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = run_here(args(data_root, "--out_dir=o", "--max_iters=2", *extra, f"--{setting}"), tmp_path,
                 check=False)
    refused(p, setting.split("=")[0])
    assert os.listdir(tmp_path) == []


def tree(d):
    """Every path under d: a file's bytes, a link's target, a folder or a fifo by kind."""
    def what(p):
        if p.is_symlink():
            return "-> " + os.readlink(p)
        return p.read_bytes() if p.is_file() else "folder" if p.is_dir() else "other"
    return {str(p.relative_to(d)): what(p) for p in sorted(d.rglob("*"))}


def lock_of(kind):
    """Makes tmp_path/o with a .lock of this kind."""
    def make(d):
        (d / "o").mkdir()
        (d / "mine").write_text("mine")
        lock = d / "o" / ".lock"
        if kind == "folder":
            lock.mkdir()
        elif kind == "fifo":
            os.mkfifo(lock)
        else:
            lock.symlink_to(d / "mine" if kind == "link" else d / "nowhere")
    return make


OUT_DIRS = {  # what out_dir is (made in tmp_path) -> (its --out_dir, the path the line names)
    "a file": (lambda d: (d / "o").write_text("mine"), "o", "o"),
    "in a file": (lambda d: (d / "f").write_text("mine"), "f/o", "f"),
    "/proc": (lambda d: None, "/proc", "/proc"),
    "its .lock a folder": (lock_of("folder"), "o", ".lock"),
    "its .lock a dangling link": (lock_of("dangling"), "o", ".lock"),
    "its .lock a link to a file": (lock_of("link"), "o", ".lock"),
    "its .lock a fifo": (lock_of("fifo"), "o", ".lock"),
}


@pytest.mark.parametrize("case", OUT_DIRS)
def test_an_out_dir_no_run_can_use_is_one_line_first(data_root, tmp_path, case):
    """A scratch run, a resume and --overwrite=True: one line naming the path, nothing written or
    changed (a lock that is a link: neither it nor its target)."""
    make, out_dir, named = OUT_DIRS[case]
    make(tmp_path)
    before = tree(tmp_path)
    for extra in ([], ["--init_from=resume"], ["--overwrite=True"]):
        p = run_here(args(data_root, f"--out_dir={out_dir}", "--max_iters=2", *extra), tmp_path,
                     check=False)
        refused(p, named)
        assert tree(tmp_path) == before, extra


TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # (it sets them all)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"RANK": "0", "WORLD_SIZE": "2"},
                                 {"LOCAL_RANK": "0"}])
def test_rank_without_torchrun_is_refused(data_root, tmp_path, monkeypatch, env):
    """Some of torchrun's variables without the others (a rank that would train and write nothing):
    one line naming one that is missing."""
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    p = run_here(args(data_root, "--out_dir=o", "--max_iters=2"), tmp_path, check=False)
    refused(p, "MASTER_ADDR")
    assert os.listdir(tmp_path) == []


def test_checkpoints_are_never_lost(data_root, tmp_path):
    """A new run never replaces a checkpoint unless asked; a diverging run never saves; a resume or
    a fine-tune that names another model is refused; --overwrite=True starts afresh, leaving nothing
    of the old run."""
    def run(*extra):
        return run_here(args(data_root, "--out_dir=o", "--eval_interval=2", *extra), tmp_path,
                        check=False)
    assert run("--max_iters=4").returncode == 0
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    cases = (
        (["--max_iters=1"], "ckpt.pt"),
        (["--init_from=resume", "--n_embd=64"], "n_embd"),
        (["--init_from=resume", "--max_iters=8", "--learning_rate=1e30", "--min_lr=1"], ""),
    )
    for extra, name in cases:
        refused(run(*extra), name)
        assert (tmp_path / "o" / "ckpt.pt").read_bytes() == good, extra
    refused(run("--out_dir=ft", "--init_from=o/ckpt.pt", "--n_layer=3", "--max_iters=1"), "n_layer")
    assert empty(tmp_path / "ft")
    (tmp_path / "o" / "eval.json").write_text("{}")
    assert run("--max_iters=2", "--overwrite=True").returncode == 0
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iter_num"] == 2
    assert sorted(losses(tmp_path / "o")) == [0, 1] and not (tmp_path / "o" / "eval.json").exists()
    # no step, so no checkpoint of its own
    assert run("--max_iters=0", "--overwrite=True").returncode == 0
    assert sorted(os.listdir(tmp_path / "o")) == ["metrics.jsonl"]


def test_a_second_run_on_a_live_out_dir_is_refused(data_root, tmp_path):
    """While a run trains in o, a new run, one with --overwrite=True and a resume are refused; the
    live run's log and checkpoint stay its own; once it is gone, o resumes, and a normal exit
    removes the lock."""
    out = tmp_path / "o"
    first = start(args(data_root, "--out_dir=o", "--max_iters=1000000", "--eval_interval=3",
                       "--seed=1"), tmp_path)
    try:
        wait_until(lambda: (out / "ckpt.pt").exists() and logged_iter(out) >= 4, first)
        for extra in ([], ["--overwrite=True"], ["--init_from=resume"]):
            refused(run_here(args(data_root, "--out_dir=o", "--max_iters=5", "--seed=2", *extra),
                             tmp_path, check=False), os.path.join("o", ".lock"))
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate()
    its = sorted(losses(out))
    assert its == list(range(len(its))) and len(its) >= 5  # one run's log
    ck = torch.load(out / "ckpt.pt", weights_only=True)
    assert ck["config"]["seed"] == 1 and ck["iter_num"] % 3 == 0
    p = start(args(data_root, "--out_dir=o", "--init_from=resume",
                   f"--max_iters={ck['iter_num'] + 1}"), tmp_path)
    assert p.wait(600) == 0 and sorted(os.listdir(out)) == ["ckpt.pt", "metrics.jsonl"]


def test_data_swapped_under_a_run_and_before_a_resume(data_root, tmp_path):
    """A prepare run swaps new data (fewer rows) into the folder a run trains on: the run
    goes on with its data (its losses equal those of a run on an untouched copy, bitwise); a resume
    on the new data is refused, naming the files, unless --data_changed_ok=True, which holds for
    that resume only."""
    from prepare.common import staged_dataset
    for d in ("data", "ref"):
        shutil.copytree(data_root / "rows", tmp_path / d / "rows")
    common = [TRAIN, "--dataset=rows", "--eval_interval=5", "--seed=5"] + TINY + ["--block_size=11"]
    live = start(common + [f"--data_dir={tmp_path / 'data'}", "--out_dir=live",
                           "--max_iters=1000000"], tmp_path)
    try:
        wait_until(lambda: logged_iter(tmp_path / "live") >= 3, live)
        with staged_dataset(tmp_path / "data" / "rows") as stage:  # what prepare/*.py does
            write_rows(stage, 12, seed=2, n=(1500, 200), prepare="regenerated")
        swapped_at = logged_iter(tmp_path / "live")
        wait_until(lambda: logged_iter(tmp_path / "live") >= swapped_at + 8, live)
    finally:
        live.kill()
        live.communicate()
    got = losses(tmp_path / "live")
    run_here(common + [f"--data_dir={tmp_path / 'ref'}", "--out_dir=ref",
                       f"--max_iters={max(got) + 1}"], tmp_path)
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
    assert (ck["data"]["bytes"]["train.bin"] == 1500 * 12 * 2
            and ck["meta"]["prepare"] == "regenerated")
    with staged_dataset(tmp_path / "data" / "rows") as stage:
        write_rows(stage, 12, seed=3, n=(1500, 200), prepare="regenerated with another seed")
    refused(run_here(resume + [f"--max_iters={ck['iter_num'] + 2}"], tmp_path, check=False),
            "meta.json")


def test_a_split_rewritten_in_place_before_a_resume_is_refused(data_root, tmp_path):
    """train.bin rewritten at the same size, one token changed within the vocabulary (meta.json and
    the sizes as before): the resume names it, the checkpoint unchanged; --data_changed_ok=True goes
    on."""
    shutil.copytree(data_root / "toy", tmp_path / "d" / "toy")
    common = [TRAIN, f"--data_dir={tmp_path / 'd'}", "--dataset=toy"] + TINY + ["--out_dir=o"]
    run_here(common + ["--max_iters=2", "--eval_interval=2"], tmp_path)
    before = (tmp_path / "o" / "ckpt.pt").read_bytes()
    tokens = np.fromfile(tmp_path / "d" / "toy" / "train.bin", np.uint16)
    tokens[100] = (tokens[100] + 1) % 20
    with open(tmp_path / "d" / "toy" / "train.bin", "r+b") as f:  # in place: the file, its size
        f.write(tokens.tobytes())
    resume = common + ["--init_from=resume", "--max_iters=4"]
    refused(run_here(resume, tmp_path, check=False), "train.bin", "--data_changed_ok")
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == before
    run_here(resume + ["--data_changed_ok=True"], tmp_path)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iter_num"] == 4


def test_damaged_and_foreign_checkpoints_are_refused(data_root, tmp_path, damage):
    """Resume and fine-tune read through model.read_checkpoint (tests/test_checkpoint.py: every bad
    kind): a refusal names the file and changes nothing; so does a fine-tune on data of another
    vocabulary."""
    run_here(args(data_root, "--out_dir=o", "--max_iters=2", "--eval_interval=2"), tmp_path)
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    torch.save({**ck, "config": {**ck["config"], "odd": fractions.Fraction(1, 3)}},
               tmp_path / "pk.pt")
    shutil.copy(tmp_path / "o" / "ckpt.pt", tmp_path / "bad.pt")
    damage(tmp_path / "bad.pt")
    for source, extra in (("bad.pt", []), ("pk.pt", []), ("o/ckpt.pt", ["--dataset=wide"])):
        p = run_here(args(data_root, "--out_dir=ft", f"--init_from={source}", *extra), tmp_path,
                     check=False)
        refused(p, source if not extra else "vocab_size")
        assert empty(tmp_path / "ft") and (tmp_path / "o" / "ckpt.pt").read_bytes() == good
    for key in ("optimizer", "meta"):  # (a fine-tune needs neither; a resume needs both)
        torch.save({k: v for k, v in ck.items() if k != key}, tmp_path / f"no-{key}.pt")
    for source in ("bad.pt", "pk.pt", "no-optimizer.pt", "no-meta.pt"):
        shutil.copy(tmp_path / source, tmp_path / "o" / "ckpt.pt")
        refused(run_here(args(data_root, "--out_dir=o", "--init_from=resume"), tmp_path, False),
                "ckpt.pt")
        assert (tmp_path / "o" / "ckpt.pt").read_bytes() == (tmp_path / source).read_bytes()



def test_a_diverged_run_saves_no_checkpoint(data_root, tmp_path):
    """A learning rate that drives the weights to inf/NaN: the run stops at its eval with exit 1,
    and no checkpoint holds the broken weights (always_save_checkpoint would write one)."""
    argv = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--out_dir=out", "--max_iters=4",
            "--eval_interval=2", "--always_save_checkpoint=True"] + TINY
    argv += ["--learning_rate=1e30", "--min_lr=0", "--grad_clip=0", "--warmup_iters=0"]
    p = start(argv, tmp_path)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 1, f"exit {p.returncode}:\n{err[-2000:]}"
    assert not (tmp_path / "out" / "ckpt.pt").exists()


def test_a_run_that_saves_no_checkpoint_says_why(data_root, tmp_path):
    """always_save_checkpoint=False saves only a better val loss; a resume's max_iters not past its
    checkpoint trains nothing: either way the old checkpoint stays and stderr names the setting."""
    run_here(args(data_root, "--out_dir=o", "--max_iters=2"), tmp_path)
    ckpt = (tmp_path / "o" / "ckpt.pt").read_bytes()
    p = run_here(args(data_root, "--out_dir=o", "--init_from=resume", "--max_iters=2"), tmp_path)
    assert "max_iters" in p.stderr and (tmp_path / "o" / "ckpt.pt").read_bytes() == ckpt
    # a fine-tune at a learning rate that wrecks the weights: its val loss never beats step 0's
    p = run_here(args(data_root, "--out_dir=f", "--init_from=o/ckpt.pt", "--max_iters=2",
                      "--always_save_checkpoint=False", "--learning_rate=1.0", "--min_lr=0.0",
                      "--warmup_iters=0"), tmp_path)
    assert "always_save_checkpoint" in p.stderr and not (tmp_path / "f" / "ckpt.pt").exists()
    p = run_here(args(data_root, "--out_dir=g", "--init_from=o/ckpt.pt", "--max_iters=2"),
                 tmp_path)
    assert "checkpoint" not in p.stderr and (tmp_path / "g" / "ckpt.pt").exists()


def test_full_eval_scores_every_target_once(data_root, tmp_path):
    """eval_full on a token stream: the whole windows, then one ending at the split's end whose
    targets past theirs count. Against a float64 NLL of those windows from the checkpoint."""
    run_here(args(data_root, "--out_dir=o", "--max_iters=2"), tmp_path)
    run_here([TRAIN, "--out_dir=o", "--init_from=resume", "--eval_only=True", "--eval_full=True",
              "--eval_splits=val"], tmp_path)
    got = json.loads((tmp_path / "o" / "eval.json").read_text())["val"]
    ids = torch.from_numpy(np.fromfile(data_root / "toy" / "val.bin", np.uint16).astype(np.int64))
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)
    model = GPT(GPTConfig(**ck["model_args"])).double().eval()
    model.load_state_dict(ck["model"])
    n, T = len(ids) - 1, 32  # targets, TINY's block_size
    tail = n % T
    assert tail > 0  # (the data leaves a tail: the case under test)
    nll = []
    with torch.no_grad():
        for s in [*range(0, n - tail, T), n - T]:
            w = ids[s:s + T + 1]
            out = F.cross_entropy(model(w[None, :-1], w[None, 1:])[0][0], w[1:], reduction="none")
            nll.append(out[T - tail:] if s == n - T else out)
    want = torch.cat(nll)
    assert got["tokens"] == n == len(want)
    assert got["loss"] == pytest.approx(float(want.mean()), abs=1e-5)
    # the same checkpoint from its path into another folder: the same numbers, its iteration
    run_here(args(data_root, f"--init_from={tmp_path / 'o' / 'ckpt.pt'}", "--out_dir=p",
                  "--eval_only=True", "--eval_full=True", "--eval_splits=val"), tmp_path)
    other = json.loads((tmp_path / "p" / "eval.json").read_text())
    assert other["iter"] == ck["iter_num"] == 2 and other["val"] == got


def test_the_kernel_at_a_head_dim_it_lacks_is_refused_before_anything_is_written(data_root,
                                                                                  tmp_path,
                                                                                  monkeypatch):
    """attn_impl='triton' where the kernel runs (TRITON_INTERPRET=1) but TINY's head dim, 16, is
    not one it takes: one line naming the setting, not a traceback at the first eval."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    p = run_here(args(data_root, "--out_dir=o", "--max_iters=2", "--attn_impl=triton"), tmp_path,
                 check=False)
    refused(p, "attn_impl")
    assert os.listdir(tmp_path) == []
