"""Faults every script shares. Outputs: each script's final writes go through
prepare.common.output_file; in a read-only folder or on a full disk (simulated: os.open and
os.mkdir in the folder raise EROFS, os.write to a file there raises ENOSPC once `free` bytes are
written) each is one line naming the path, with the script's exit status, and nothing is written
or damaged (an old file kept, no .tmp left); the evals' early check fails on a full disk before a
checkpoint is read."""
import dataclasses
import errno
import json
import os
from functools import partial

import numpy as np
import pytest
import torch
from helpers import run_here, script_error
from test_train import TINY, TRAIN, refused

import eval_downstream as ed
import eval_extrapolation as ex
import eval_frequencies as ef
import sample
from model import GPT, GPTConfig
from prepare import common


@pytest.fixture
def disk(monkeypatch):
    """disk(folder, "read-only") or disk(folder, "full", free): its writes fail from now on."""
    real_open, real_mkdir, real_write = os.open, os.mkdir, os.write

    def install(folder, fault, free=0):
        folder, left = os.path.realpath(folder), [free]

        def inside(path):
            path = os.path.realpath(path)
            return path == folder or path.startswith(folder + os.sep)

        def open_(path, flags, *rest, **kw):
            writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            if fault == "read-only" and writes and inside(path):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_open(path, flags, *rest, **kw)

        def mkdir(path, *rest, **kw):
            if fault == "read-only" and inside(path):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return real_mkdir(path, *rest, **kw)

        def write(fd, data):
            if fault == "full" and inside(os.readlink(f"/proc/self/fd/{fd}")):
                if left[0] == 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                data = memoryview(data)[:left[0]]
                left[0] -= len(data)
            return real_write(fd, data)
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "mkdir", mkdir)
        monkeypatch.setattr(os, "write", write)
    return install


def tree(d):
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else "folder"
            for p in sorted(d.rglob("*"))}


def train(data_root, tmp_path, *extra, check=True):
    argv = [TRAIN, f"--data_dir={data_root}", "--dataset=toy", "--eval_interval=2", *TINY, *extra]
    return run_here(argv, tmp_path, check)


def checkpoint(tmp_path):
    """A tiny PoPE checkpoint (a GPT-2 vocabulary: eval_downstream reads it too), a val.bin of 500
    tokens with its meta.json, and the evals' arguments for them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50304))
    meta = {"tokenizer": "gpt2", "vocab_size": 50257, "dtype": "uint16"}
    torch.save({"model": model.state_dict(), "model_args": dataclasses.asdict(model.config),
                "config": {}, "meta": meta}, tmp_path / "m.pt")
    (tmp_path / "data").mkdir()
    toks = np.random.default_rng(0).integers(0, 50257, 500).astype(np.uint16)
    toks.tofile(tmp_path / "data" / "val.bin")
    (tmp_path / "data" / "meta.json").write_text(json.dumps(meta))
    return ["--ckpt", tmp_path / "m.pt", "--data", tmp_path / "data" / "val.bin", "--device", "cpu",
            "--no_progress"]


def train_new_run(data_root, tmp_path, disk, monkeypatch):
    disk(tmp_path / "ro", "read-only")
    refused(train(data_root, tmp_path, "--out_dir=ro/o", "--max_iters=2", check=False), "ro")
    assert not (tmp_path / "ro").exists()


def train_old_run(data_root, tmp_path, disk, monkeypatch, fault="read-only"):
    """A resume, an evaluation, a new run with --overwrite=True."""
    train(data_root, tmp_path, "--out_dir=o", "--max_iters=2")
    before = tree(tmp_path / "o")
    disk(tmp_path / "o", fault)
    for extra in (["--init_from=resume", "--max_iters=4"],
                  ["--init_from=resume", "--eval_only=True"], ["--overwrite=True"]):
        p = train(data_root, tmp_path, "--out_dir=o", *extra, check=False)
        refused(p, os.path.join("o", ""))
        assert tree(tmp_path / "o") == before, extra


def train_checkpoint(data_root, tmp_path, disk, monkeypatch, eval_only=False):
    """The disk fills after the up-front check: the checkpoint (or eval.json) is refused, the old
    one kept."""
    train(data_root, tmp_path, "--out_dir=o", "--max_iters=2")
    ckpt = (tmp_path / "o" / "ckpt.pt").read_bytes()
    disk(tmp_path / "o", "full", common.PROBE_BYTES + 10)
    extra = ["--eval_only=True"] if eval_only else ["--max_iters=4"]
    p = train(data_root, tmp_path, "--out_dir=o", "--init_from=resume", *extra, check=False)
    refused(p, "eval.json" if eval_only else "ckpt.pt")
    assert (tmp_path / "o" / "ckpt.pt").read_bytes() == ckpt
    assert sorted(os.listdir(tmp_path / "o")) == ["ckpt.pt", "metrics.jsonl"]


def eval_output(script, option, fault):
    def case(data_root, tmp_path, disk, monkeypatch):
        few = {ef: ["--tokens", 64], ex: ["--lengths", 16, "--max_tokens", 64], ed: []}
        argv = checkpoint(tmp_path) + few[script]
        if script is ed:
            argv = argv[:2] + ["--device", "cpu"]
            monkeypatch.setattr(ed, "evaluate", lambda *a, **k: pytest.fail("ran the tasks first"))
        else:
            monkeypatch.setattr(script, "load_checkpoint", lambda *a, **k: pytest.fail("read"))
        (tmp_path / "out").mkdir()
        disk(tmp_path / "out", fault)
        out = tmp_path / "out" / "r"
        line = script_error(partial(common.run_main, script.main), argv + [option, out])
        assert option in line and str(out) in line
        assert os.listdir(tmp_path / "out") == []
    return case


def sample_save(meta, ext, fault):
    """sample.py --save into a read-only folder (refused before the checkpoint is read) or as the
    disk fills after that check: the format's file (JSB: .mid) or text."""
    def case(data_root, tmp_path, disk, monkeypatch):
        if ext == ".mid":
            pytest.importorskip("symusic")
        torch.manual_seed(0)
        V = meta["vocab_size"]
        cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=V)
        torch.save({"model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg),
                    "config": {}, "meta": meta}, tmp_path / "m.pt")
        (tmp_path / "out").mkdir()
        disk(tmp_path / "out", fault, common.PROBE_BYTES + 10)
        argv = [f"--ckpt={tmp_path / 'm.pt'}", "--device=cpu", "--num_samples=1",
                "--max_new_tokens=40", f"--save={tmp_path / 'out' / 's'}"]
        assert str(tmp_path / "out" / "s_0") in script_error(sample.main, argv)
        assert os.listdir(tmp_path / "out") == []
    return case


TEXT = {"vocab_size": 27, "itos": list("\nabcdefghijklmnopqrstuvwxyz")}  # (the prompt: "\n")
OUTPUTS = {
    "train: a new run in a read-only folder": train_new_run,
    "train: an old run's read-only out_dir": train_old_run,
    "train: an old run's out_dir on a full disk": partial(train_old_run, fault="full"),
    "train: a checkpoint as the disk fills": train_checkpoint,
    "train: eval.json as the disk fills": partial(train_checkpoint, eval_only=True),
    "eval_extrapolation --json on a full disk": eval_output(ex, "--json", "full"),
    "eval_extrapolation --plot in a read-only folder": eval_output(ex, "--plot", "read-only"),
    "eval_frequencies --plot on a full disk": eval_output(ef, "--plot", "full"),
    "eval_frequencies --json in a read-only folder": eval_output(ef, "--json", "read-only"),
    "eval_downstream --json on a full disk": eval_output(ed, "--json", "full"),
    "sample --save of a JSB sample (.mid) on a full disk": sample_save(
        {"format": "jsb", "vocab_size": 90, "itos": [str(i) for i in range(90)]}, ".mid", "full"),
    "sample --save of text on a full disk": sample_save(TEXT, ".txt", "full"),
    "sample --save of text in a read-only folder": sample_save(TEXT, ".txt", "read-only"),
}


@pytest.mark.parametrize("case", OUTPUTS)
def test_outputs_on_a_read_only_folder_or_a_full_disk(data_root, tmp_path, disk, monkeypatch, case):
    OUTPUTS[case](data_root, tmp_path, disk, monkeypatch)
