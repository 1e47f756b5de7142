"""train.py's numbers on tiny seeded datasets (conftest's data_root): a resume goes on bitwise, 2-process
DDP (gloo) equals one process, loss masks and fixed rows, the full-split eval, the optimizer step against a
float64 recomputation. Runs are in this process (helpers.run_here), or new ones where a process is tested."""
import copy
import json
import math
import os
import subprocess
import sys
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run_here

import train
from model import GPT, GPTConfig

TRAIN = train.__file__
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4", "--eval_iters=2",
        "--log_interval=1", "--warmup_iters=2", "--device=cpu", "--learning_rate=3e-3"]


def run(args, cwd):
    """`python *args` as a new process, one thread (what a process is needed for)."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(TRAIN), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, f"{args} failed:\n{p.stdout}\n{p.stderr}"


def records(out_dir, key):
    return [r for r in map(json.loads, open(os.path.join(out_dir, "metrics.jsonl"))) if key in r]


def losses(out_dir):
    return {r["iter"]: r["loss"] for r in records(out_dir, "loss")}


def test_resume_reproduces_uninterrupted_run(data_root, tmp_path):
    """8 steps at once, or 4 and a resume to 8 in a new process: the same losses, bitwise (with dropout)."""
    common = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=4",
              "--gradient_accumulation_steps=2", "--dropout=0.1", "--lr_decay_iters=8"] + TINY
    run_here(common + ["--max_iters=8", "--out_dir=full"], tmp_path)
    run_here(common + ["--max_iters=4", "--out_dir=part"], tmp_path)
    ck = torch.load(tmp_path / "part" / "ckpt.pt", weights_only=True)
    assert ck["iter_num"] == 4 and ck["config"]["dropout"] == 0.1 and "optimizer" in ck
    assert sorted(os.listdir(tmp_path / "part")) == ["ckpt.pt", "metrics.jsonl"]  # no .tmp, no lock left
    run(common + ["--max_iters=8", "--out_dir=part", "--init_from=resume"], tmp_path)
    full, part = losses(tmp_path / "full"), losses(tmp_path / "part")
    assert full == part and sorted(full) == list(range(8)) and full[7] < full[0] - 0.3  # bitwise; it learns
    before = (tmp_path / "full" / "ckpt.pt").read_bytes()  # a finished run's resume: one more eval, no step
    run_here(common + ["--max_iters=8", "--out_dir=full", "--init_from=resume"], tmp_path)
    assert losses(tmp_path / "full") == full and (tmp_path / "full" / "ckpt.pt").read_bytes() == before


def test_rows_loss_mask_and_full_eval(data_root, tmp_path):
    """Only masked targets count: a model learns the copy task. The full eval scores every row once, and a
    resume takes dataset and data_dir from its checkpoint (the README's command names neither)."""
    run_here([TRAIN, f"--data_dir={data_root}", "--dataset=rows", "--out_dir=o"] + TINY + [
        "--max_iters=150", "--eval_interval=150", "--eval_iters=4", "--batch_size=32",
        "--gradient_accumulation_steps=1", "--lr_decay_iters=150"], tmp_path)  # (later keys override TINY's)
    ev = [r["eval"] for r in records(tmp_path / "o", "eval")]  # one scored token per row:
    assert ev[0]["val"]["tokens"] == 4 * 32 and ev[-1]["val"]["acc"] > 0.9 and ev[0]["val"]["acc"] < 0.3
    run_here([TRAIN, "--out_dir=o", "--init_from=resume", "--eval_only=True", "--eval_full=True",
              "--eval_splits=val"], tmp_path)
    full = json.load(open(tmp_path / "o" / "eval.json"))
    assert full["val"]["tokens"] == 200 and full["full"] is True and full["iter"] == 150


def test_train_mask_false_trains_on_every_token(data_root, tmp_path):
    """The logged iteration-0 loss, with train_mask True and False, against a float64 cross-entropy of the
    same initial model on the same batch; the eval scores the masked targets either way."""
    data, rng = train.Data(str(data_root / "rows"), 32, ["train", "val"]), np.random.default_rng(7)
    while True:  # a seed whose batch tells the two losses apart
        seed = int(rng.integers(1 << 30))
        torch.manual_seed(seed)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=20)).double().eval()
        x, y, m = data.get_batch("train", data.starts("train", 4, train.make_gen(seed, 0, 0)), "cpu")
        with torch.no_grad():
            nll = F.cross_entropy(model(x, y)[0].double().flatten(0, 1), y.flatten(), reduction="none")
        nll = nll.view_as(y)
        want = {True: float((nll * m).sum() / m.sum()), False: float(nll.mean())}
        if abs(want[True] - want[False]) > 1e-3:
            break
    assert m.sum() == 4, seed
    args = [TRAIN, f"--data_dir={data_root}", "--dataset=rows"] + TINY + [
        "--max_iters=1", "--eval_interval=1", "--gradient_accumulation_steps=1", f"--seed={seed}"]
    for flag in (True, False):
        run_here(args + [f"--out_dir=o{flag}", f"--train_mask={flag}"], tmp_path)
        assert losses(tmp_path / f"o{flag}")[0] == pytest.approx(want[flag], abs=1e-4), (seed, flag)
    ev = [records(tmp_path / f"o{flag}", "eval")[0]["eval"] for flag in (True, False)]
    assert ev[0] == ev[1] and ev[0]["val"]["tokens"] == 2 * 4


def test_ddp_matches_single_process(data_root, tmp_path):
    """torchrun with 2 gloo ranks draws one process's global batch; its resume goes on with the same losses,
    and only rank 0 writes."""
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
    """Two train_steps of a float64 model against a float64 recomputation: the loss averaged over accum
    micro-batches, the gradient clipped to total norm clip, AdamW (bias-corrected moments, decoupled weight
    decay on the 2-D weights but PoPE's delta) and delta projected into [-2pi, 0]."""
    seed = 1234
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=11, vocab_size=20, attn_impl="torch",
                          pope_delta_init="uniform", pope_delta_bound="project")).double()
    with torch.no_grad():  # half of delta above 0, half below -2pi: a step leaves them out, to be projected
        model.transformer.h[0].attn.delta[:, 0::2] = 1.0
        model.transformer.h[0].attn.delta[:, 1::2] = -7.0
    ref = copy.deepcopy(model)
    lr, wd, (b1, b2), clip, accum, eps = 0.05, 0.1, (0.9, 0.95), 0.1, 2, 1e-8
    opt = model.configure_optimizers(wd, lr, (b1, b2), "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    data = train.Data(str(data_root / "rows"), 11, ["train"])
    batches = [[data.get_batch("train", data.starts("train", 4, train.make_gen(seed, it, micro)), "cpu")
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
                p.sub_(lr * (m1 / (1 - b1 ** (it + 1))) / ((m2 / (1 - b2 ** (it + 1))).sqrt() + eps))
                if n.endswith("attn.delta"):
                    clamped += int(((p < -2 * math.pi) | (p > 0)).sum())
                    p.clamp_(-2 * math.pi, 0.0)
    assert clamped > 0 and norm > clip  # the projection and the clipping both acted
    assert got == pytest.approx(want, rel=1e-12)
    for n, p in model.named_parameters():
        assert torch.allclose(p, params[n], rtol=1e-5, atol=1e-7), (n, (p - params[n]).abs().max().item())
