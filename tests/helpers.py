"""Helpers the test files share (pytest puts tests/ on sys.path)."""
import contextlib
import io
import json
import math
import os
import random
import runpy
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import model as model_lib  # (conftest.py put the repo root on sys.path)
from prepare import common


@torch.no_grad()
def large_weights_(model, std=0.3):
    """The matrices but PoPE's delta drawn from N(0, std), above GPT-2's 0.02: a tiny random model's
    greedy tokens depend on the whole context, and a decoding bug changes them."""
    for name, p in model.named_parameters():
        if p.dim() == 2 and not name.endswith("delta"):
            p.normal_(0.0, std)
    return model


def read_bin(d, split, suffix=""):
    """A prepared split's tokens (suffix "_mask": JSB's loss mask, one byte a token)."""
    return np.fromfile(Path(d) / f"{split}{suffix}.bin", dtype=np.uint8 if suffix else np.uint16)


def rel_err(a, b):
    """||a - b|| / ||b||, in float64; NaN anywhere gives NaN, which no `< bound` passes."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def run_exit(main, args):
    """main(args) of a script, which must exit: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        main([str(a) for a in args])
    return e.value.code, out.getvalue(), err.getvalue()


def script_error(main, args):
    """The last line on stderr of main(args), with exit status 2 (argparse's) and no traceback
    (asserted)."""
    code, _, err = run_exit(main, args)
    line = err.rstrip("\n").split("\n")[-1]
    assert code == 2 and "Traceback" not in err, (code, err)
    return line


def run_here(argv, cwd, check=True):
    """`python *argv` run in this process as __main__ (runpy), without a new interpreter's start-up
    (about 3 s, most of it importing torch): a CompletedProcess with the exit status, stdout and
    stderr the process would have had (sys.exit(message): status 1 and the message; an exception:
    its traceback and status 1; the warnings Python shows by default); the locks the run took are
    released and the RNG states put back. What only a process shows (a live run's lock, kill -9,
    torchrun) needs subprocess. check: the run must end with status 0."""
    out, err = io.StringIO(), io.StringIO()
    held = set(common._LOCKS)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    old_argv, old_cwd = sys.argv, os.getcwd()
    argv = [str(a) for a in argv]
    try:
        os.chdir(cwd)
        sys.argv = argv
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as shown:
            warnings.resetwarnings()  # a new interpreter's filters (no -W): these are not shown
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            try:
                runpy.run_path(argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code
            except Exception:  # noqa: BLE001  (what the interpreter prints for it)
                traceback.print_exc()
                code = 1
        for w in shown:
            err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line))
    finally:
        # the OS drops a process's locks, atexit deletes the files
        for path in set(common._LOCKS) - held:
            common.unlock_folder(os.path.dirname(path), path)
        setters = (random.setstate, np.random.set_state, torch.set_rng_state)
        for set_state, state in zip(setters, rng):
            set_state(state)
        sys.argv = old_argv
        os.chdir(old_cwd)
    if code is not None and not isinstance(code, int):
        err.write(f"{code}\n")
    code = 0 if code is None else code if isinstance(code, int) else 1
    p = subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{argv} failed:\n{p.stdout}\n{p.stderr}")
    return p


def write_rows(folder, row_len, seed, n=(2000, 200), prepare="made by the test"):
    """Fixed rows: row_len - 3 random tokens, a separator 0, a copy of the token before it
    (the target)."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for split, rows_n in zip(("train", "val"), n):
        rows = rng.integers(1, 20, size=(rows_n, row_len)).astype(np.uint16)
        rows[:, -2], rows[:, -1] = 0, rows[:, -3]
        mask = np.zeros_like(rows, dtype=np.uint8)
        mask[:, -1] = 1
        rows.tofile(os.path.join(folder, f"{split}.bin"))
        mask.tofile(os.path.join(folder, f"{split}_mask.bin"))
    meta = {"vocab_size": 20, "dtype": "uint16", "itos": [chr(97 + i) for i in range(20)],
            "row_len": row_len, "prepare": prepare,
            "tokens": {"train": n[0] * row_len, "val": n[1] * row_len}}
    Path(folder, "meta.json").write_text(json.dumps(meta))


NAMES = ["out", "dq", "dk", "dv", "ddelta"]


def pope_magnitude_f64(x):
    """PoPE's magnitudes mu of x in float64, by model.pope_magnitude: the one definition, which
    every reference follows (a variant edited there is what the tests hold the kernels to)."""
    return model_lib.pope_magnitude(x.double())


def pope_einsum_f64(q, k, v, delta, causal=True, q_offset=0, base=10000.0):
    """softmax_s((1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s - t) theta_c + delta_c)) v, in
    float64; mu = pope_magnitude_f64 (model.py's definition), the rest written out here."""
    B, H, Tq, D = q.shape
    theta = base ** (-torch.arange(D, dtype=torch.float64, device=q.device) / D)
    t = (q_offset + torch.arange(Tq, dtype=torch.float64, device=q.device))[:, None, None]
    s = torch.arange(k.size(2), dtype=torch.float64, device=q.device)[None, :, None]
    ang = (s - t) * theta + delta[:, None, None, :]  # (H, Tq, Tk, D)
    mq, mk = pope_magnitude_f64(q), pope_magnitude_f64(k)
    scores = torch.einsum("bhtc,bhsc,htsc->bhts", mq, mk, torch.cos(ang)) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(~(s[..., 0] <= t[..., 0]), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
