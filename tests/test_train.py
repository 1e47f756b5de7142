"""train.py end to end on a tiny synthetic dataset: smoke run, exact resume,
loss masks and fixed rows, sample.py, 2-process DDP (gloo), the configurator.

Most runs are `python train.py ...` run in this process (helpers.run_here: the script's
__main__, its exit status and output, without importing torch again); new processes
where a process is what is tested: a resume in a fresh interpreter, torchrun, and one
refusal through the real exit path."""
import json
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from helpers import run_here

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN, SAMPLE = os.path.join(ROOT, "train.py"), os.path.join(ROOT, "sample.py")
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
        "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--device=cpu", "--learning_rate=3e-3"]


def run(args, cwd, check=True, env_extra=None):
    """`python *args` as a new process (what a process is needed for; run_here otherwise)."""
    env = dict(os.environ, PYTHONPATH=ROOT, **(env_extra or {}))
    p = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed:\n{p.stdout}\n{p.stderr}")
    return p


def losses(out_dir):
    recs = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    return {r["iter"]: r["loss"] for r in recs if "loss" in r}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """A periodic-with-noise char dataset, and a fixed-row dataset with a loss mask
    that scores one target per row (the indirect-indexing layout)."""
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    os.makedirs(root / "toy")
    seq = ((np.arange(30000) % 17) + rng.integers(0, 3, 30000)).astype(np.uint16)
    seq[:27000].tofile(root / "toy" / "train.bin")
    seq[27000:].tofile(root / "toy" / "val.bin")
    json.dump({"vocab_size": 20, "dtype": "uint16", "itos": [chr(97 + i) for i in range(20)]},
              open(root / "toy" / "meta.json", "w"))
    # rows of 12 tokens: 10 random ones, a separator, then a copy of token #9; only that copy is scored
    os.makedirs(root / "rows")
    for split, n in (("train", 2000), ("val", 200)):
        rows = rng.integers(1, 20, size=(n, 12)).astype(np.uint16)
        rows[:, 10] = 0  # separator
        rows[:, 11] = rows[:, 9]
        mask = np.zeros_like(rows, dtype=np.uint8)
        mask[:, 11] = 1
        rows.tofile(root / "rows" / f"{split}.bin")
        mask.tofile(root / "rows" / f"{split}_mask.bin")
    json.dump({"vocab_size": 20, "dtype": "uint16", "itos": [chr(97 + i) for i in range(20)], "row_len": 12},
              open(root / "rows" / "meta.json", "w"))
    return root


def test_resume_reproduces_uninterrupted_run(data_root, tmp_path):
    common = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=4",
              "--gradient_accumulation_steps=2", "--dropout=0.1", "--lr_decay_iters=8"] + TINY
    run_here(common + ["--max_iters=8", "--out_dir=full"], tmp_path)
    run_here(common + ["--max_iters=4", "--out_dir=part"], tmp_path)
    ck = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=False)
    assert ck["iter_num"] == 4 and set(ck["rng"]) == {"python", "numpy", "torch", "cuda"}
    assert ck["meta"]["vocab_size"] == 20 and "optimizer" in ck and ck["config"]["dropout"] == 0.1
    assert not os.path.exists(tmp_path / "part" / "ckpt.pt.tmp")
    # the resume in a new process: only what the checkpoint holds carries over
    run(common + ["--max_iters=8", "--out_dir=part", "--init_from=resume"], tmp_path)
    full, part = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert sorted(full) == list(range(8)) and sorted(part) == list(range(8))
    for it in range(8):
        assert full[it] == part[it], (it, full[it], part[it])  # bitwise on CPU
    assert full[7] < full[0] - 0.3  # it learns
    # a resume with no step left says so (and that only an eval runs); one with steps left does not
    p = run_here(common + ["--max_iters=8", "--out_dir=full", "--init_from=resume"], tmp_path)
    assert "note: the run is at step 8, max_iters=8: nothing left to train" in p.stdout and losses(tmp_path / "full") == full
    assert "nothing left to train" not in run_here(common + ["--max_iters=9", "--out_dir=part", "--init_from=resume"],
                                                   tmp_path).stdout
    # sample.py runs on the checkpoint and decodes with the dataset's itos
    p = run_here([SAMPLE, "--out_dir=full", "--start=abc", "--num_samples=2",
                  "--max_new_tokens=10", "--device=cpu"], tmp_path)
    samples = [s.strip() for s in p.stdout.split("---------------") if s.strip()]
    assert len(samples) == 2 and all(s.startswith("abc") and len(s) == 13 for s in samples)


def test_rows_and_loss_mask(data_root, tmp_path):
    """Only masked targets count: a model learns the copy task to high accuracy."""
    args = [TRAIN, f"--data_dir={data_root}", "--dataset=rows", "--out_dir=o"] + TINY + [
        "--max_iters=150", "--eval_interval=150", "--eval_iters=4", "--batch_size=32",
        "--gradient_accumulation_steps=1", "--lr_decay_iters=150"]  # later keys override TINY's
    run_here(args, tmp_path)
    recs = [json.loads(line) for line in open(tmp_path / "o" / "metrics.jsonl")]
    ev = [r["eval"] for r in recs if "eval" in r]
    assert ev[0]["val"]["tokens"] == 4 * 32  # one scored token per row
    assert ev[-1]["val"]["acc"] > 0.9 and ev[0]["val"]["acc"] < 0.3
    # the whole split, once each row
    run_here([TRAIN, f"--data_dir={data_root}", "--dataset=rows", "--out_dir=o", "--init_from=resume",
              "--eval_only=True", "--eval_full=True", "--eval_splits=val", "--device=cpu"], tmp_path)
    full = json.load(open(tmp_path / "o" / "eval.json"))
    assert full["val"]["tokens"] == 200 and full["full"] is True


def test_train_mask_false_trains_on_every_token(data_root, tmp_path):
    """train_mask=False: the training loss covers every token of a row, the eval still
    scores the masked target only. The logged iteration-0 losses are checked against
    a float64 cross-entropy of the same initial model on the same batch."""
    import torch.nn.functional as F
    sys.path.insert(0, ROOT)
    from model import GPT, GPTConfig
    from prepare.common import Data, make_gen
    # the same model and batch as train.py's iteration 0, scored independently, for a seed whose
    # batch tells the two losses apart (they differ by less than the tolerance for some seeds)
    data, rng = Data(str(data_root / "rows"), 32, ["train", "val"]), np.random.default_rng()
    while True:
        seed = int(rng.integers(1 << 30))
        torch.manual_seed(seed)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=20)).double().eval()
        x, y, m = data.batch("train", data.starts("train", 4, make_gen(seed, 0, 0)), "cpu")
        with torch.no_grad():
            nll = F.cross_entropy(model(x, y)[0].double().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
        want = {True: float((nll * m).sum() / m.sum()), False: float(nll.mean())}
        if abs(want[True] - want[False]) > 1e-3:
            break
    assert m.sum() == 4, seed
    args = [TRAIN, f"--data_dir={data_root}", "--dataset=rows"] + TINY + [
        "--max_iters=1", "--eval_interval=1", "--gradient_accumulation_steps=1", f"--seed={seed}"]
    recs = {}
    for flag in (True, False):
        run_here(args + [f"--out_dir=o{flag}", f"--train_mask={flag}"], tmp_path)
        recs[flag] = [json.loads(line) for line in open(tmp_path / f"o{flag}" / "metrics.jsonl")]
    for flag in (True, False):
        got = next(r["loss"] for r in recs[flag] if r.get("iter") == 0 and "loss" in r)
        assert got == pytest.approx(want[flag], abs=1e-4), (seed, flag, got, want[flag])
    # the eval before the first step is the same (masked) evaluation for both settings
    ev = {flag: next(r["eval"] for r in recs[flag] if "eval" in r) for flag in (True, False)}
    assert ev[True] == ev[False] and ev[False]["val"]["tokens"] == 2 * 4, seed


def test_ddp_matches_single_process(data_root, tmp_path):
    common = [f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=3", "--max_iters=6",
              "--gradient_accumulation_steps=4", "--lr_decay_iters=6"] + TINY
    run_here([TRAIN, "--out_dir=one"] + common, tmp_path)
    run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         TRAIN, "--out_dir=two"] + common, tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(6))
    for it in one:
        assert abs(one[it] - two[it]) < 1e-5 * abs(one[it]), (it, one[it], two[it])
    assert one[5] < one[0]
    # resume under torchrun: stop at 3, continue to 6; the losses continue those of the
    # uninterrupted 2-process run, and only rank 0 writes the checkpoint
    ddp = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAIN,
           "--out_dir=part"] + common
    run(ddp + ["--max_iters=3"], tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    ck = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=False)
    assert ck["iter_num"] == 3 and len(ck["rng"]["torch"]) == 2  # one RNG state per rank
    run(ddp + ["--init_from=resume"], tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    assert sorted(os.listdir(tmp_path / "part")) == ["ckpt.pt", "metrics.jsonl"]
    part = losses(tmp_path / "part")
    assert sorted(part) == list(range(6))
    for it in part:
        assert abs(part[it] - two[it]) <= 1e-6 * abs(two[it]), (it, part[it], two[it])


def test_a_large_model_on_the_cpu_is_told_where_the_cpu_demo_is(data_root, tmp_path):
    """Over 50M parameters on the CPU, the model line says iterations will be slow and names the CPU demo
    config; a small model's line does not."""
    base = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--max_iters=0", "--eval_iters=1", "--device=cpu",
            "--batch_size=1", "--block_size=8"]
    big = run(base + ["--out_dir=big", "--n_layer=8", "--n_head=8", "--n_embd=768"], tmp_path).stdout  # 56.6M
    small = run(base + ["--out_dir=small", "--n_layer=7", "--n_head=8", "--n_embd=768"], tmp_path).stdout  # 49.5M
    assert "M parameters" in big and "the CPU demo: config/indirect_indexing_quick.py" in big, big
    assert "M parameters" in small and "CPU demo" not in small, small


def test_configurator_errors(tmp_path):
    p = run_here([TRAIN, "--lerning_rate=1e-3"], tmp_path, check=False)
    assert p.returncode != 0 and "unknown config key 'lerning_rate'" in p.stderr and "learning_rate" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "min_lr" not in p.stderr  # one line; close matches only
    p = run_here([TRAIN, "--max_iters=ten"], tmp_path, check=False)
    assert p.returncode != 0 and "'max_iters'" in p.stderr and "must be int" in p.stderr
    cfgfile = tmp_path / "bad.py"
    cfgfile.write_text("batch_size = 8\nn_layers = 3\n")
    p = run_here([TRAIN, str(cfgfile)], tmp_path, check=False)
    assert p.returncode != 0 and "unknown config key 'n_layers'" in p.stderr and "n_layer" in p.stderr
    p = run_here([TRAIN, "--dataset=nope", "--device=cpu"], tmp_path, check=False)
    assert p.returncode != 0 and "no such dataset folder" in p.stderr and "prepare/indirect_indexing.py" in p.stderr
    p = run_here([TRAIN, "--compile_mode=fast", "--device=cpu"], tmp_path, check=False)
    assert p.returncode != 0 and "compile_mode must be default, reduce-overhead or max-autotune" in p.stderr
    # the quick demo's data, missing: the real command, and no empty out_dir left behind
    p = run_here([TRAIN, os.path.join(ROOT, "config", "indirect_indexing_quick.py"),
                  f"--data_dir={tmp_path / 'nodata'}", "--out_dir=o-quick"], tmp_path, check=False)
    assert p.returncode != 0 and "python prepare/indirect_indexing.py --quick" in p.stderr, p.stderr
    assert not (tmp_path / "o-quick").exists()
    p = run_here([TRAIN, "--help"], tmp_path)
    assert "--pos_emb='pope'" in p.stdout and "Usage" in p.stdout


NONSENSE = {  # setting: what the one-line error must say
    "--min_lr=-0.01": "min_lr must be in [0, learning_rate]",
    "--batch_size=0": "batch_size must be >= 1",
    "--gradient_accumulation_steps=0": "gradient_accumulation_steps must be >= 1",
    "--eval_iters=0": "eval_iters must be >= 1",
    "--pope_base=-1.0": "pope_base and rope_base must be > 1",
    "--block_size=0": "block_size must be >= 1",
    "--block_size=-4": "block_size must be >= 1",
    "--eval_interval=0": "eval_interval must be >= 1",
    "--log_interval=0": "log_interval must be >= 1",
    "--n_head=0": "n_layer, n_head and n_embd must be >= 1",
    "--learning_rate=0.0": "learning_rate must be a finite number > 0",
    "--dropout=1.0": "dropout must be in [0, 1)",
}
MODEL_RULES = {  # the model's own rules: the configurator builds a GPTConfig, which says them
    "--pos_emb=alibi": "pos_emb must be 'pope', 'rope' or 'none', got 'alibi'",
    "--n_head=5": "n_embd=768 must be divisible by n_head=5",
    "--attn_impl=cuda": "attn_impl must be 'auto', 'torch' or 'triton', got 'cuda'",
}


def test_nonsense_settings_are_refused(data_root, tmp_path):
    """Each setting gets its one line, naming the value it got; through the
    command line, nothing is written and the exit status is not 0."""
    sys.path.insert(0, ROOT)
    import train
    from configurator import config_problems, configure
    from model import GPTConfig
    defaults = {k: getattr(train, k) for k in train.config_keys}
    for setting, msg in {**NONSENSE, **MODEL_RULES}.items():
        cfg, given = configure([setting], defaults)
        key, value = setting[2:].split("=")
        problems = config_problems(cfg)
        line = [p for p in problems if msg in p]
        assert len(line) == 1 and key in line[0] and value in line[0], (setting, problems)
        if setting in MODEL_RULES:
            with pytest.raises(ValueError, match=re.escape(msg)):
                GPTConfig(**{key: cfg[key]})
    assert config_problems(dict(defaults)) == []
    assert config_problems(configure(["--n_head=0"], defaults)[0]) == [  # not also "must be divisible by n_head=0"
        "n_layer, n_head and n_embd must be >= 1 (got n_layer=12, n_head=0, n_embd=768)"]
    p = run([TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--out_dir=o"] + TINY
            + ["--batch_size=0", "--eval_interval=0"], tmp_path, check=False)
    assert p.returncode != 0 and "batch_size must be >= 1" in p.stderr and "eval_interval must be >= 1" in p.stderr
    assert not (tmp_path / "o").exists()


def test_all_zero_loss_mask_is_refused(data_root, tmp_path):
    import shutil
    shutil.copytree(data_root / "rows", tmp_path / "rows")
    np.zeros(2000 * 12, dtype=np.uint8).tofile(tmp_path / "rows" / "train_mask.bin")
    p = run_here([TRAIN, f"--data_dir={tmp_path}", "--dataset=rows", "--out_dir=o"] + TINY
                 + ["--max_iters=2"], tmp_path, check=False)
    assert p.returncode != 0 and "train_mask.bin: scores no token" in p.stderr, p.stderr[-500:]


def test_mixed_dataset_folder_is_refused(data_root, tmp_path):
    """A train.bin of another run beside the old meta.json (token counts disagree)."""
    import shutil
    shutil.copytree(data_root / "rows", tmp_path / "rows")
    meta = json.load(open(tmp_path / "rows" / "meta.json"))
    meta["tokens"] = {"train": 2000 * 12, "val": 200 * 12}
    json.dump(meta, open(tmp_path / "rows" / "meta.json", "w"))
    np.ones(1500 * 12, dtype=np.uint16).tofile(tmp_path / "rows" / "train.bin")
    np.ones(1500 * 12, dtype=np.uint8).tofile(tmp_path / "rows" / "train_mask.bin")
    p = run_here([TRAIN, f"--data_dir={tmp_path}", "--dataset=rows", "--out_dir=o"] + TINY
                 + ["--max_iters=2"], tmp_path, check=False)
    assert p.returncode != 0 and "train.bin" in p.stderr and "18000" in p.stderr.replace(",", ""), p.stderr[-500:]


class _Payload:
    """Unpickling this runs code: it creates the file named in MARKER."""
    def __reduce__(self):
        return (open, (os.environ["MARKER"], "w"))


def test_loading_a_file_never_runs_code_from_it(data_root, tmp_path):
    common = [f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=2", "--max_iters=2"] + TINY
    run_here([TRAIN, "--out_dir=o"] + common, tmp_path)
    ck = torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)  # a real checkpoint loads safely
    marker = tmp_path / "pwned"
    os.environ["MARKER"] = str(marker)
    ck["config"]["evil"] = _Payload()
    torch.save(ck, tmp_path / "o" / "ckpt.pt")
    p = run_here([TRAIN, "--out_dir=o", "--init_from=resume", "--max_iters=4"] + common,
                 tmp_path, check=False)
    assert p.returncode != 0 and not marker.exists()
    p = run_here([SAMPLE, "--ckpt=o/ckpt.pt", "--device=cpu", "--max_new_tokens=2"],
                 tmp_path, check=False)
    assert p.returncode != 0 and not marker.exists() and "ckpt.pt" in p.stderr, p.stderr[-800:]
    assert "Traceback" not in p.stderr


def test_checkpoints_are_never_lost(data_root, tmp_path):
    """A new run never replaces an old run's checkpoint unless asked; a diverging run
    never saves; a resume that names another model shape is refused."""
    common = [f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=2", "--out_dir=o"] + TINY
    run_here([TRAIN, "--max_iters=4"] + common, tmp_path)
    good = (tmp_path / "o" / "ckpt.pt").read_bytes()
    p = run_here([TRAIN, "--max_iters=1"] + common, tmp_path, check=False)
    assert p.returncode != 0 and "--init_from=resume" in p.stderr and "--out_dir" in p.stderr
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == good
    p = run_here([TRAIN, "--init_from=resume", "--max_iters=8"] + common
                 + ["--learning_rate=1e30", "--min_lr=1e29"], tmp_path, check=False)
    assert p.returncode != 0 and "not finite" in p.stderr and "iteration" in p.stderr, p.stderr[-500:]
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == good
    p = run_here([TRAIN, "--init_from=resume", "--max_iters=8"] + common
                 + ["--n_embd=64", "--n_layer=1"], tmp_path, check=False)
    assert p.returncode != 0 and "n_embd=64" in p.stderr and "n_layer=1" in p.stderr
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == good
    # --overwrite=True starts afresh: a new checkpoint and a new log
    run_here([TRAIN, "--max_iters=2", "--overwrite=True"] + common, tmp_path)
    assert torch.load(tmp_path / "o" / "ckpt.pt", weights_only=True)["iter_num"] == 2
    assert sorted(losses(tmp_path / "o")) == [0, 1]


def test_resume_takes_the_dataset_from_the_checkpoint(data_root, tmp_path):
    """The README's 'evaluate a checkpoint' command names neither dataset nor data_dir."""
    run_here([TRAIN, f"--data_dir={data_root}", "--dataset=rows", "--out_dir=o", "--max_iters=2",
              "--eval_interval=2"] + TINY, tmp_path)
    run_here([TRAIN, "--out_dir=o", "--init_from=resume", "--eval_only=True", "--eval_full=True",
              "--eval_splits=val"], tmp_path)
    assert json.load(open(tmp_path / "o" / "eval.json"))["val"]["tokens"] == 200


def test_sample_refuses_nonsense_settings(tmp_path):
    for arg, msg in (("--top_k=0", "--top_k must be >= 1"), ("--temperature=-1", "--temperature must be >= 0"),
                     ("--num_samples=0", "--num_samples must be >= 1"), ("--max_new_tokens=0", "--max_new_tokens must be >= 1")):
        p = run_here([SAMPLE, arg, "--device=cpu"], tmp_path, check=False)
        assert p.returncode == 2 and msg in p.stderr, (arg, p.stderr[-300:])
    p = run_here([SAMPLE, "--out_dir=nothing", "--device=cpu"], tmp_path, check=False)
    assert p.returncode == 1 and "checkpoint nothing/ckpt.pt not found" in p.stderr


# -----------------------------------------------------------------------------
# the optimizer step: one function, train_step, which the eager loop runs and
# GraphedStep captures (bench.py check compares the two on a GPU)

def test_the_eager_loop_runs_train_step(data_root, tmp_path, monkeypatch, capsys):
    """With train_step wrapped, every iteration goes through it, and the losses
    train.py logs are the ones it returned."""
    sys.path.insert(0, ROOT)
    import train
    real, returned = train.train_step, []

    def spy(*args):
        loss = real(*args)
        returned.append(loss.item())
        return loss
    monkeypatch.setattr(train, "train_step", spy)
    train.main([f"--data_dir={data_root}", "--dataset=toy", f"--out_dir={tmp_path / 'o'}", "--max_iters=5",
                "--eval_interval=100", "--gradient_accumulation_steps=2"] + TINY)
    logged = losses(tmp_path / "o")
    assert len(returned) == 5 and [logged[i] for i in range(5)] == returned, (logged, returned)


def test_train_step_against_float64_formulas(data_root):
    """Two train_steps of a float64 model against a float64 recomputation from the
    formulas: the loss averaged over accum micro-batches, the gradient clipped to total
    norm grad_clip, AdamW (bias-corrected moments, decoupled weight decay on the 2-D
    weights but PoPE's delta) and delta projected into [-2pi, 0]."""
    import copy
    import math
    sys.path.insert(0, ROOT)
    from contextlib import nullcontext
    from model import GPT, GPTConfig
    from prepare.common import Data, make_gen
    from train import train_step
    seed = int(np.random.default_rng().integers(1 << 30))
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=11, vocab_size=20, pope_delta_init="uniform",
                          pope_delta_bound="project", attn_impl="torch")).double()
    with torch.no_grad():  # half of delta above 0, half below -2pi: a step of lr leaves them out, to be projected
        model.transformer.h[0].attn.delta[:, 0::2] = 1.0
        model.transformer.h[0].attn.delta[:, 1::2] = -7.0
    ref = copy.deepcopy(model)
    lr, wd, (b1, b2), clip, accum, eps = 0.05, 0.1, (0.9, 0.95), 0.1, 2, 1e-8
    opt = model.configure_optimizers(wd, lr, (b1, b2), "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    data = Data(str(data_root / "rows"), 11, ["train"])
    batches = [[data.batch("train", data.starts("train", 4, make_gen(seed, it, micro)), "cpu")
                for micro in range(accum)] for it in range(2)]
    got = [train_step(model, model, opt, scaler, nullcontext(), accum, clip, lambda micro: batches[it][micro]).item()
           for it in range(2)]

    params = dict(ref.named_parameters())
    moments = {n: (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}
    want, clamped = [], 0
    for it in range(2):
        # the model's masked cross-entropy (checked against float64 in test_train_mask_false_...) of each micro-batch
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
                p.sub_(lr * (m1 / (1 - b1 ** (it + 1))) / ((m2 / (1 - b2 ** (it + 1))).sqrt() + eps))
                if n.endswith("attn.delta"):
                    clamped += int(((p < -2 * math.pi) | (p > 0)).sum())
                    p.clamp_(-2 * math.pi, 0.0)
    assert clamped > 0 and norm > clip, (seed, clamped, norm)  # the projection and the clipping both acted
    assert got == pytest.approx(want, rel=1e-12), (seed, got, want)
    for n, p in model.named_parameters():
        assert torch.allclose(p, params[n], rtol=1e-5, atol=1e-7), (seed, n, (p - params[n]).abs().max().item())


def test_bench_train_graph_check_compares_the_logged_losses(capsys, monkeypatch):
    """bench.py check's comparison of graphed and eager train.py steps, run on the CPU
    with both runs eager: equal runs pass; a run with another learning rate fails. Its
    train.py processes run in this process (run_here): the comparison is what is tested."""
    sys.path.insert(0, ROOT)
    import bench

    def here(cmd, **kwargs):  # bench's `python train.py ...` processes, run in this process
        assert cmd[0] == sys.executable and kwargs == {"capture_output": True, "text": True}, (cmd, kwargs)
        return run_here(cmd[1:], os.getcwd(), check=False)
    monkeypatch.setattr(bench, "subprocess", types.SimpleNamespace(run=here))
    assert bench.train_graph_check(steps=3, device="cpu", graphed=(), pos_embs=("rope",))
    out = capsys.readouterr().out
    assert out.startswith("ok  rope: 3 graphed steps vs 3 eager") and "largest |difference| 0.0e+00" in out, out
    assert not bench.train_graph_check(steps=3, device="cpu", graphed=("--learning_rate=3e-2",), pos_embs=("rope",))
    assert capsys.readouterr().out.startswith("BAD rope: 3 graphed steps vs 3 eager")


# -----------------------------------------------------------------------------
# what a fresh clone's first runs run into: empty keys, paths relative to the cwd, which data a run
# reads, a warm-up longer than the run, a prepare run still writing, configurator.py --help

def test_an_empty_out_dir_or_dataset_is_a_one_line_error(tmp_path):
    quick = os.path.join(ROOT, "config", "indirect_indexing_quick.py")
    for arg, key in (("--out_dir=", "out_dir"), ("--dataset=", "dataset"), ("--data_dir=", "data_dir")):
        p = run_here([TRAIN, quick, arg, "--max_iters=1"], tmp_path, check=False)
        assert p.returncode == 1 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert f"config key '{key}' (--{key}) is empty" in p.stderr and f"--{key}=" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == []


def test_paths_relative_to_the_cwd_name_the_repository_copy(data_root, tmp_path, monkeypatch):
    """Run from another folder: a config path or a dataset folder missing here but present in the repository
    says so, with the two ways out. (REPO_ROOT is a stand-in repository: the real data/ is not the tests'.)"""
    sys.path.insert(0, ROOT)
    import shutil

    import configurator
    import train
    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    shutil.copytree(data_root / "toy", repo / "data" / "toy")
    (repo / "config").mkdir()
    (repo / "config" / "toy.py").write_text("dataset = 'toy'\n")
    elsewhere.mkdir()
    monkeypatch.setattr(train, "REPO_ROOT", repo)
    monkeypatch.setattr(configurator, "REPO_ROOT", repo)
    monkeypatch.chdir(elsewhere)
    with pytest.raises(SystemExit) as e:
        train.main(["config/toy.py"])
    assert str(e.value.code) == (
        f"error: config file config/toy.py not found: paths are relative to the current directory ({elsewhere}); "
        f"it exists in {repo}: run from the repository root or pass {repo / 'config' / 'toy.py'}")
    with pytest.raises(SystemExit) as e:
        train.main([str(repo / "config" / "toy.py"), "--out_dir=o"] + TINY)
    assert str(e.value.code) == (
        f"error: dataset folder data/toy not found under ./data (paths are relative to the current directory, "
        f"{elsewhere}); it exists in {repo / 'data'}: run from the repository root or pass --data_dir={repo / 'data'}")
    assert os.listdir(elsewhere) == []
    with pytest.raises(SystemExit) as e:  # in neither place: the rebuild hint, as before
        train.main(["--dataset=nope", "--device=cpu"])
    assert "no such dataset folder" in str(e.value.code) and "exists in" not in str(e.value.code)
    with pytest.raises(SystemExit) as e:  # a config in neither place
        train.main(["config/nope.py"])
    assert str(e.value.code) == "error: config file config/nope.py not found (configs live in config/)"


def test_the_log_names_the_data_and_a_finetune_of_other_data_is_warned(data_root, tmp_path):
    base = [TRAIN, f"--data_dir={data_root}"] + TINY
    out = run_here(base + ["--dataset=toy", "--out_dir=o", "--max_iters=2"], tmp_path).stdout
    lines = out.splitlines()
    assert f"data: {data_root / 'toy'} (train 27,000 tokens, val 3,000)" in lines, out
    assert lines.index(f"data: {data_root / 'toy'} (train 27,000 tokens, val 3,000)") < 2  # early: before the model
    assert "warning" not in out  # max_iters 2 = warmup_iters 2, a scratch run
    # a fine-tune on the rows data of a checkpoint trained on toy: both named, and it trains on as asked
    out = run_here(base + ["--dataset=rows", "--out_dir=ft", "--init_from=o/ckpt.pt", "--max_iters=2"], tmp_path).stdout
    assert (f"warning: o/ckpt.pt was trained on dataset 'toy'; this fine-tune trains on 'rows' ({data_root / 'rows'}); "
            "pass --dataset=toy if that is not what you meant") in out.splitlines(), out
    assert f"data: {data_root / 'rows'} (train 24,000 tokens, val 2,400)" in out
    assert torch.load(tmp_path / "ft" / "ckpt.pt", weights_only=True)["config"]["dataset"] == "rows"
    out = run_here(base + ["--dataset=toy", "--out_dir=ft2", "--init_from=o/ckpt.pt", "--max_iters=2"], tmp_path).stdout
    assert "warning" not in out and f"data: {data_root / 'toy'} (train 27,000 tokens, val 3,000)" in out


def test_a_run_shorter_than_its_warmup_is_warned(data_root, tmp_path):
    p = run_here([TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--out_dir=o"] + TINY
                 + ["--max_iters=3", "--warmup_iters=5"], tmp_path)
    want = ("warning: max_iters=3 < warmup_iters=5: the run ends inside its warm-up and never reaches "
            "learning_rate=0.003; pass a smaller --warmup_iters (and --lr_decay_iters=max_iters to decay within "
            "the run)")
    assert p.stdout.splitlines()[0] == want, p.stdout
    lrs = [float(m) for m in re.findall(r"lr ([\d.e+-]+),", p.stdout)]
    assert lrs == pytest.approx([3e-3 * k / 6 for k in (1, 2, 3)]), lrs  # behaviour unchanged: warm-up as before


def test_rebuild_hints_follow_data_dir_and_see_a_live_prepare_run(data_root, tmp_path):
    p = run_here([TRAIN, os.path.join(ROOT, "config", "english_small.py"), f"--data_dir={tmp_path / 'x'}"],
                 tmp_path, check=False)
    from prepare.common import repo_path  # (how commands write a path: relative where it lies next to the repo)
    assert p.returncode == 1 and f"--out_dir {repo_path(tmp_path / 'x' / 'english')} --input" in p.stderr, p.stderr
    assert "data/english" not in p.stderr
    # toy.tmp-<pid> beside a missing data/toy: a live pid is a prepare run still writing it, a dead one a leftover
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()
    for pid, want in ((me, f"a prepare run (pid {me}) is still writing it, into toy.tmp-{me}"),
                      (dead.pid, f"an interrupted prepare run left toy.tmp-{dead.pid} beside it")):
        stage = tmp_path / "d" / f"toy.tmp-{pid}"
        stage.mkdir(parents=True)
        p = run_here([TRAIN, f"--data_dir={tmp_path / 'd'}", "--dataset=toy", "--device=cpu"], tmp_path, check=False)
        assert p.returncode == 1 and want in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        stage.rmdir()


def test_configurator_help_prints_its_docstring(tmp_path):
    p = run_here([os.path.join(ROOT, "configurator.py"), "--help"], tmp_path)
    assert "train.py's configurator" in p.stdout and "Usage: a module, not a script" in p.stdout, p.stdout
    p = run_here([os.path.join(ROOT, "configurator.py")], tmp_path)
    assert "is a module imported by train.py" in p.stderr and p.stdout == ""
