"""Tests for eval_extrapolation.py and the fine-tuning config (CPU, tiny models).

Run: python -m pytest tests/test_extrapolation.py -q
Tiny PoPE / RoPE checkpoints are trained by train.py, run in this process
(helpers.run_here), on a character-level Tiny Shakespeare slice (block_size 32);
the rest builds models in the test. The whole file runs in well under two minutes
on 2 CPU cores."""

import errno
import json
import math
import os
import shutil
import sys
import types
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import eval_extrapolation as ex  # noqa: E402
import train  # noqa: E402
from helpers import run_here, script_error, script_help  # noqa: E402
from model import load_checkpoint  # noqa: E402
from model import GPT, GPTConfig, yarn_inv_freq  # noqa: E402
from prepare.common import PrepareError, codec, read_tokens  # noqa: E402

BLOCK = 32
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", f"--block_size={BLOCK}", "--device=cpu", "--compile=False"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one CPU thread is as fast, and robust on a loaded machine (no spinning)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_train(args, cwd):
    return run_here([os.path.join(ROOT, "train.py"), *args], cwd).stdout


@pytest.fixture(scope="module")
def env(tmp_path_factory, shared_data):
    """A char-level dataset (data/shk) and tiny PoPE and RoPE checkpoints trained by train.py."""
    root = tmp_path_factory.mktemp("extrap")
    with open(shared_data / "text" / "english" / "tinyshakespeare.txt", encoding="utf-8") as f:
        text = f.read()[:240_000]
    itos = sorted(set(text))
    stoi = {c: i for i, c in enumerate(itos)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    d = root / "data" / "shk"
    d.mkdir(parents=True)
    ids[:200_000].tofile(d / "train.bin")
    ids[200_000:220_000].tofile(d / "val.bin")
    ids[220_000:].tofile(d / "test.bin")
    meta = {"vocab_size": len(itos), "dtype": "uint16", "tokenizer": "itos", "itos": itos}
    (d / "meta.json").write_text(json.dumps(meta))
    ckpts = {}
    for pe in ("pope", "rope"):
        out = root / f"out-{pe}"
        run_train(["--dataset=shk", f"--data_dir={root / 'data'}", f"--out_dir={out}", f"--pos_emb={pe}", *TINY,
                   "--batch_size=8", "--gradient_accumulation_steps=1", "--max_iters=40", "--eval_interval=40",
                   "--eval_iters=2", "--log_interval=100", "--warmup_iters=5", "--lr_decay_iters=40",
                   "--learning_rate=3e-3"], cwd=root)
        ckpts[pe] = str(out / "ckpt.pt")
    return types.SimpleNamespace(root=root, data=str(d), val=str(d / "val.bin"), meta=meta, itos=itos,
                                 val_ids=ids[200_000:220_000], ckpts=ckpts)


def run_eval(args, tmp_path, name="r.json"):
    out = str(tmp_path / name)
    res = ex.main([*args, "--json", out, "--no_progress"])
    with open(out) as f:
        on_disk = json.load(f)
    return res, on_disk


def err(args):
    return script_error(ex.main, [*args, "--no_progress"])


# -----------------------------------------------------------------------------
# the 1x point is train.py's full-split val loss on the same tokens

@pytest.mark.parametrize("pe", ["pope", "rope"])
def test_1x_point_equals_train_evaluate(env, tmp_path, pe):
    _, js = run_eval(["--ckpt", env.ckpts[pe], "--data", env.val, "--lengths", str(BLOCK)], tmp_path)
    r = js["models"][f"out-{pe}"]["results"][str(BLOCK)]
    model, ckpt = load_checkpoint(env.ckpts[pe], device="cpu")
    data = train.Data(env.data, BLOCK, ["val"])
    ref = train.evaluate(model, data, "val", "cpu", nullcontext(), full=True)
    n = (len(env.val_ids) - 1) // BLOCK
    assert r["tokens"] == ref["tokens"] == n * BLOCK
    assert r["windows"] == n
    assert abs(r["nll"] - ref["loss"]) < 1e-5, (r["nll"], ref["loss"])
    assert math.isclose(r["ppl"], math.exp(r["nll"]), rel_tol=1e-12)


def test_1x_point_equals_train_eval_only_json(env, tmp_path):
    out = tmp_path / "out-pope-copy"
    shutil.copytree(os.path.dirname(env.ckpts["pope"]), out)
    # train.py's data windows follow the command line's block_size, even with init_from=resume
    run_train(["--dataset=shk", f"--data_dir={env.root / 'data'}", f"--out_dir={out}", "--init_from=resume",
               "--eval_only=True", "--eval_full=True", "--eval_splits=val", "--device=cpu",
               f"--block_size={BLOCK}"], cwd=tmp_path)
    ev = json.loads((out / "eval.json").read_text())["val"]
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", str(BLOCK)], tmp_path)
    r = js["models"]["out-pope"]["results"][str(BLOCK)]
    assert r["tokens"] == ev["tokens"]
    assert abs(r["nll"] - ev["loss"]) < 1e-5, (r["nll"], ev["loss"])


# -----------------------------------------------------------------------------
# YaRN

def test_yarn_frequencies_hand_computed():
    """Head dim 64, base 10000, train length 1024, s = 4, YaRN's published form (arXiv 2309.00071 and its
    reference code): theta_i = 10000^(-2i/64); the pair index that makes b rotations over the original
    context is d(b) = 64 ln(1024 / (2 pi b)) / (2 ln 10000); low = floor(d(32)), high = ceil(d(1));
    gamma_i = clip((i - low) / (high - low), 0, 1), h_i = (1 - gamma_i) theta_i + gamma_i theta_i / 4."""
    inv, mscale = yarn_inv_freq(64, 10000.0, 4.0, 1024)
    assert inv.shape == (32,) and inv.dtype == torch.float32
    # hand-computed values:
    # d(32) = 64 ln(5.09297) / 18.42068 = 5.656 -> low = 5;  d(1) = 64 ln(162.975) / 18.42068 = 17.697 -> high = 18
    # i = 0:  theta = 1,         gamma = 0     -> kept:        1.0
    # i = 5:  theta = 0.237137,  gamma = 0     -> kept:        0.237137
    # i = 6:  theta = 0.177828,  gamma = 1/13  -> h = 0.177828 * (1 - 0.75/13) = 0.167569
    # i = 10: theta = 0.0562341, gamma = 5/13  -> h = 0.0562341 * (1 - 3.75/13) = 0.0400127
    # i = 17: theta = 0.00749894, gamma = 12/13 -> h = 0.00749894 * (1 - 9/13) = 0.00230737
    # i = 18: theta = 0.00562341, gamma = 1   -> theta / 4:    0.00140585
    # i = 31: theta = 1.33352e-4              -> theta / 4:    3.33380e-5
    hand = {0: 1.0, 5: 0.237137, 6: 0.167569, 10: 0.0400127, 17: 0.00230737, 18: 0.00140585, 31: 3.33380e-5}
    for i, v in hand.items():
        assert math.isclose(inv[i].item(), v, rel_tol=2e-5), (i, inv[i].item(), v)
    assert math.isclose(mscale, 0.1 * math.log(4) + 1, rel_tol=1e-12)
    assert math.isclose(mscale, 1.1386294, rel_tol=1e-7)
    # every frequency against the formula, written out independently
    d = [64 * math.log(1024 / (2 * math.pi * b)) / (2 * math.log(10000)) for b in (32, 1)]
    low, high = math.floor(d[0]), math.ceil(d[1])
    assert (low, high) == (5, 18)
    for i in range(32):
        th = 10000.0 ** (-2 * i / 64)
        g = min(max((i - low) / (high - low), 0.0), 1.0)
        assert math.isclose(inv[i].item(), (1 - g) * th + g * th / 4, rel_tol=1e-6)
    # the three regimes: high frequencies kept, low ones divided by s, a ramp between
    th = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    ratio = (inv.double() / th).tolist()
    assert all(abs(x - 1) < 1e-6 for x in ratio[:6]) and all(abs(x - 0.25) < 1e-6 for x in ratio[18:])
    assert all(0.25 < x < 1 for x in ratio[6:18]) and ratio[6:18] == sorted(ratio[6:18], reverse=True)


def test_yarn_in_the_model_scale_and_temperature():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=128, block_size=1024, vocab_size=64, pos_emb="rope")
    model = GPT(cfg).eval()
    model.set_rope_scaling(4.0)  # orig_len defaults to block_size = 1024
    inv, mscale = yarn_inv_freq(64, 10000.0, 4.0, 1024)
    attn = model.transformer.h[0].attn
    assert torch.equal(attn.inv_freq, inv)
    assert math.isclose(attn.scale, mscale ** 2 / math.sqrt(64), rel_tol=1e-12)
    with pytest.raises(ValueError):
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64, pos_emb="pope")).set_rope_scaling(2.0)


def test_yarn_at_s1_is_plain_rope(env, tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, pos_emb="rope")).eval()
    x = torch.randint(0, 64, (2, 48))
    with torch.no_grad():
        a, _ = model(x, x)
        model.set_rope_scaling(1.0)
        b, _ = model(x, x)
        model.set_rope_scaling(1.0, orig_len=7)  # orig_len is irrelevant at s = 1
        c, _ = model(x, x)
    assert torch.equal(a, b) and torch.equal(a, c)
    # through the script: a fixed s = 1 series equals the plain series bit for bit, at every length
    _, js = run_eval(["--ckpt", env.ckpts["rope"], "--data", env.val, "--lengths", "32,64,96",
                      "--max_tokens", "960", "--yarn_scale", "1"], tmp_path)
    plain, yarn = js["models"]["out-rope"], js["models"]["out-rope+YaRN"]
    for L in ("32", "64", "96"):
        assert plain["results"][L]["nll"] == yarn["results"][L]["nll"]
        assert yarn["results"][L]["rope_scaling"] == 1.0
    assert [b["nll"] for b in plain["results"]["96"]["buckets"]] == [b["nll"] for b in yarn["results"]["96"]["buckets"]]


def test_yarn_scale_rule_plain_rope(env, tmp_path):
    """s(L) = max(1, L / block_size): plain RoPE up to the training length, stretched beyond."""
    _, js = run_eval(["--ckpt", env.ckpts["rope"], "--data", env.val, "--lengths", "16,32,64,160",
                      "--max_tokens", "320", "--yarn"], tmp_path)
    plain, yarn = js["models"]["out-rope"], js["models"]["out-rope+YaRN"]
    assert [yarn["results"][L]["rope_scaling"] for L in ("16", "32", "64", "160")] == [1.0, 1.0, 2.0, 5.0]
    assert [plain["results"][L]["rope_scaling"] for L in ("16", "32", "64", "160")] == [1.0] * 4
    assert math.isclose(yarn["results"]["160"]["mscale"], 0.1 * math.log(5) + 1)
    assert yarn["results"]["32"]["nll"] == plain["results"]["32"]["nll"]
    assert yarn["results"]["64"]["nll"] != plain["results"]["64"]["nll"]
    # --yarn_only drops the plain series of RoPE checkpoints
    _, js = run_eval(["--ckpt", env.ckpts["rope"], "--data", env.val, "--lengths", "32",
                      "--yarn", "--yarn_only"], tmp_path)
    assert list(js["models"]) == ["out-rope+YaRN"]


# -----------------------------------------------------------------------------
# outputs

def test_json_has_every_length_and_consistent_buckets(env, tmp_path, capsys):
    res, js = run_eval(["--ckpt", env.ckpts["pope"], env.ckpts["rope"], "--data", env.val,
                        "--lengths", "96, 16,48,16", "--max_tokens", "1000", "--bucket_size", "20"], tmp_path)
    cap = capsys.readouterr()
    out = cap.out
    assert "perplexity by context length" in out and "NLL (nats/token) by position" in out
    assert "shorter" not in cap.err  # 16 and 48 divide 960
    for m in js["models"].values():  # the table's last row: the longest length's perplexity against the shortest's
        change = 100 * (m["results"]["96"]["ppl"] / m["results"]["16"]["ppl"] - 1)
        assert m["ppl_change_pct"] == pytest.approx(change, rel=1e-12)
    row = next(line for line in out.splitlines() if line.strip().startswith("96 vs 16"))
    assert row.split()[3:] == [f"{m['ppl_change_pct']:+.1f}%" for m in js["models"].values()]
    assert js["lengths"] == [16, 48, 96]
    assert set(js["models"]) == {"out-pope", "out-rope"}
    for m in js["models"].values():
        assert m["max_tokens"] == 960  # the largest multiple of 96 <= 1000: every length scores the same tokens
        assert set(m["results"]) == {"16", "48", "96"}
        for L in (16, 48, 96):
            r = m["results"][str(L)]
            assert r["length"] == L and r["windows"] == 960 // L and r["short_window"] == 0 and r["tokens"] == 960
            assert 0 < r["nll"] < 10 and math.isclose(r["ppl"], math.exp(r["nll"]))
            # buckets of 20 positions at every length, the last one cut at L; together the length's tokens
            assert [(b["start"], b["end"]) for b in r["buckets"]] == [(a, min(a + 20, L)) for a in range(0, L, 20)]
            assert [b["tokens"] for b in r["buckets"]] == [960 // L * (b["end"] - b["start"]) for b in r["buckets"]]
            mean = sum(b["nll"] * b["tokens"] for b in r["buckets"]) / r["tokens"]
            assert math.isclose(mean, r["nll"], rel_tol=1e-9)
        # the table on stdout shows the same numbers
        for L in (16, 48, 96):
            assert f"{m['results'][str(L)]['ppl']:.3f}" in out
        for b in m["results"]["96"]["buckets"]:
            assert f"{b['start']}-{b['end'] - 1}" in out and f"{b['nll']:.4f}" in out
    # main() returns what it wrote
    assert res["lengths"] == js["lengths"]


def test_scored_tokens_are_the_documented_windows(env, tmp_path):
    """Recompute the NLL at one length by hand from the documented windows."""
    L, B = 40, 200
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", f"{L},100",
                      "--max_tokens", str(B)], tmp_path)
    model, _ = load_checkpoint(env.ckpts["pope"], device="cpu")
    ids = torch.from_numpy(env.val_ids.astype(np.int64))
    x = torch.stack([ids[j * L:j * L + L] for j in range(B // L)])
    y = torch.stack([ids[j * L + 1:j * L + L + 1] for j in range(B // L)])
    with torch.no_grad():
        _, loss = model(x, y)
    assert abs(js["models"]["out-pope"]["results"][str(L)]["nll"] - loss.item()) < 1e-5


def test_default_lengths_are_block_size_times_1_to_10(env, tmp_path, capsys):
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--max_tokens", str(10 * BLOCK)], tmp_path)
    assert js["lengths"] == [BLOCK * k for k in range(1, 11)]
    m = js["models"]["out-pope"]
    # lcm(32 x 1..10) = 80640 > 320, yet every length scores the same 320 tokens: the lengths that do not divide
    # 320 end in one shorter window
    assert m["max_tokens"] == 320
    res = [m["results"][str(BLOCK * k)] for k in range(1, 11)]
    assert [r["tokens"] for r in res] == [320] * 10
    assert [(r["windows"], r["short_window"]) for r in res] == [divmod(320, 32 * k) for k in range(1, 11)]
    err = capsys.readouterr().err
    assert ("note: every length scores the same 320 tokens; the last window is shorter at L=96 (32 tokens), "
            "L=128 (64 tokens), L=192 (128 tokens), L=224 (96 tokens), L=256 (64 tokens), L=288 (32 tokens), "
            "40.00% of the scored tokens at most") in err
    assert js["bucket_size"] == BLOCK and len(m["results"]["320"]["buckets"]) == 10


def test_default_budget_uses_every_whole_longest_window(env, tmp_path):
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "64,320"], tmp_path)
    n = len(env.val_ids)
    m = js["models"]["out-pope"]
    assert m["tokens_available"] == n and m["max_tokens"] == (n - 1) // 320 * 320
    assert m["results"]["320"]["tokens"] == m["max_tokens"] == m["results"]["64"]["tokens"]


def window_nll64(model, ids, L, B):
    """Per-token NLL of the documented windows at length L over targets t_1 .. t_B, in float64 from the formula
    logsumexp(z) - z_target: a list of (position in the window, nll) per scored token."""
    out = []
    for a in range(0, B, L):
        T = min(L, B - a)
        x, y = ids[a:a + T].view(1, T), ids[a + 1:a + T + 1].view(1, T)
        with torch.no_grad():
            z, _ = model(x, y)
        z = z[0].double()
        nll = (torch.logsumexp(z, -1) - z.gather(-1, y.view(T, 1))[:, 0]).tolist()
        out += list(enumerate(nll))
    return out


def test_same_tokens_at_every_length_with_a_short_last_window(env, tmp_path, capsys):
    """96 and 160 do not divide each other, and lcm(96, 160) = 480 is not needed: the budget is the largest multiple
    of 160 in the data, and at 96 the last window is shorter, so both lengths score exactly t_1 .. t_B (the
    rule before scored 19776 vs 19840 tokens; the one before that, a multiple of the lcm, left 160 tokens out)."""
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "160,96"], tmp_path)
    n = len(env.val_ids)
    B = (n - 1) // 160 * 160
    assert B == 19840 and B % 96 == 64
    m = js["models"]["out-pope"]
    assert m["max_tokens"] == B
    assert [(m["results"][L]["tokens"], m["results"][L]["windows"], m["results"][L]["short_window"])
            for L in ("96", "160")] == [(B, 206, 64), (B, 124, 0)]
    assert "the last window is shorter at L=96 (64 tokens), 0.32% of the scored tokens at most" in \
        capsys.readouterr().err
    # the same NLL as the documented windows, computed here in float64
    model, _ = load_checkpoint(env.ckpts["pope"], device="cpu")
    ids = torch.from_numpy(env.val_ids[:B + 1].astype(np.int64))
    for L in (96, 160):
        ref = window_nll64(model, ids, L, B)
        assert len(ref) == B
        assert abs(m["results"][str(L)]["nll"] - sum(v for _, v in ref) / B) < 1e-5


def test_explicit_cap_is_floored_to_the_longest_length(env, tmp_path, capsys):
    # a cap of 400 with lengths 96 and 160: B = 320 at both; 96 scores 3 windows and one of 32
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "96,160",
                      "--max_tokens", "400"], tmp_path)
    m = js["models"]["out-pope"]
    assert m["max_tokens"] == 320
    assert [(m["results"][L]["tokens"], m["results"][L]["short_window"]) for L in ("96", "160")] == [(320, 32),
                                                                                                    (320, 0)]
    assert "L=96 (32 tokens), 10.00% of the scored tokens at most" in capsys.readouterr().err
    # data of 400 tokens, no cap given: the largest multiple of the longest length below the 399 targets
    ddir = tmp_path / "short"
    ddir.mkdir()
    (ddir / "meta.json").write_text(json.dumps(env.meta))
    env.val_ids[:400].tofile(ddir / "val.bin")
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", str(ddir / "val.bin"), "--lengths", "96,160"],
                     tmp_path, "short.json")
    m = js["models"]["out-pope"]
    assert m["max_tokens"] == 320 and [m["results"][L]["tokens"] for L in ("96", "160")] == [320, 320]


@pytest.mark.parametrize("pe", ["pope", "rope"])
def test_position_buckets_against_a_float64_reference(env, tmp_path, pe):
    """The mean NLL per position bucket at every length, against per-token NLLs computed here in float64 from the
    documented windows: a random stretch of the val stream (seeded), lengths 48 and 80 (48 ends in a short
    window of 16), buckets of 20 (the last bucket of 48 is 8 positions)."""
    seed = 1234
    rng = np.random.default_rng(seed)
    a = int(rng.integers(0, len(env.val_ids) - 1000))
    d = tmp_path / "ds"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps(env.meta))
    env.val_ids[a:a + 1000].tofile(d / "val.bin")
    B = 400
    _, js = run_eval(["--ckpt", env.ckpts[pe], "--data", str(d / "val.bin"), "--lengths", "48,80",
                      "--max_tokens", str(B), "--bucket_size", "20"], tmp_path)
    m = js["models"][f"out-{pe}"]
    model, _ = load_checkpoint(env.ckpts[pe], device="cpu")
    ids = torch.from_numpy(env.val_ids[a:a + B + 1].astype(np.int64))
    for L in (48, 80):
        ref = window_nll64(model, ids, L, B)
        rows = m["results"][str(L)]["buckets"]
        assert [(b["start"], b["end"]) for b in rows] == [(s, min(s + 20, L)) for s in range(0, L, 20)]
        for b in rows:
            vals = [v for p, v in ref if b["start"] <= p < b["end"]]
            assert b["tokens"] == len(vals), (seed, L, b)
            assert abs(b["nll"] - sum(vals) / len(vals)) < 1e-5, (seed, L, b, sum(vals) / len(vals))
        # a trained model: the buckets differ (little context in the first), so a mix-up of positions shows
        assert max(b["nll"] for b in rows) - min(b["nll"] for b in rows) > 0.01, (seed, L, rows)
    assert [b["tokens"] for b in m["results"]["48"]["buckets"]] == [8 * 20 + 16, 8 * 20, 8 * 8]


def test_plot(env, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "32,64", "--max_tokens", "128",
              "--plot", str(png)], tmp_path)
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in capsys.readouterr().out
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width > 2.5 * height  # two panels side by side: perplexity by length, NLL by position
    assert sorted(os.listdir(tmp_path)) == ["p.png", "r.json"]  # no temp files left


def test_plot_colours_stay_distinct_past_ten_series(tmp_path):
    """matplotlib's default cycle repeats after 10 colours (two of results/lm's 18 series shared one): up to 20
    series every line gets its own colour, in both panels, and the legend sits below the panels, not on them."""
    to_rgba = pytest.importorskip("matplotlib.colors").to_rgba
    for n in (3, 12, 20):
        series = [{"label": f"m{i}", "block_size": 32,
                   "results": {str(L): {"ppl": 10.0 + i, "buckets": [{"start": 0, "end": 32, "nll": 2.0 + i / 100}]}
                               for L in (32, 64)}} for i in range(n)]
        fig = ex.write_plot(str(tmp_path / f"p{n}.png"), series, [32, 64])
        for a in fig.axes:
            colours = {to_rgba(line.get_color()) for line in a.get_lines()
                       if line.get_label() in {s["label"] for s in series}}
            assert len(colours) == n, (n, len(colours))
            assert a.get_legend() is None
        assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == n


def test_plot_without_matplotlib_is_an_error_before_the_run(env, tmp_path, monkeypatch):
    """It was a note on stdout and exit 0: the user asked for a plot."""
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib.figure raises ImportError
    monkeypatch.setattr(ex, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a checkpoint first"))
    png = tmp_path / "p.png"
    msg = err(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "32", "--plot", str(png),
               "--json", str(tmp_path / "r.json")])
    assert msg == f"error: --plot {png} needs matplotlib: pip install matplotlib (or drop --plot)"
    assert os.listdir(tmp_path) == []


def test_progress_and_attention_path_on_stderr(env, tmp_path, capsys):
    ex.main(["--ckpt", env.ckpts["pope"], env.ckpts["rope"], "--data", env.val, "--lengths", "32",
             "--max_tokens", "64"])
    err = capsys.readouterr().err
    assert "out-rope L=32" in err and "win" in err  # the tqdm bar
    for pe in ("pope", "rope"):
        model, _ = load_checkpoint(env.ckpts[pe], device="cpu")
        want = model.attention_path() if hasattr(model, "attention_path") else f"pos_emb={pe}"
        assert sum(f"out-{pe}: attention " in x and want in x for x in err.splitlines()) == 1


def test_rows_note_only_for_a_split_of_rows(env, tmp_path, capsys):
    """eval_extrapolation runs windows across the rows of a row_len split (indirect indexing, JSB) and says so
    on stderr; a plain stream gets no such note."""
    args = ["--ckpt", env.ckpts["pope"], "--lengths", "32", "--max_tokens", "64", "--no_progress"]
    ex.main([*args, "--data", env.val])
    assert "windows run across rows" not in capsys.readouterr().err
    d = tmp_path / "rows"
    d.mkdir()
    env.val_ids[:20 * 100].tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps({**env.meta, "row_len": 20}))
    ex.main([*args, "--data", str(d / "val.bin")])
    assert f"note: {d / 'val.bin'} holds rows of 20 tokens; windows run across rows" in capsys.readouterr().err


def test_help():
    out = script_help(ex.main)
    assert "Usage:" in out and "--yarn_scale" in out and "Scored tokens: the same B targets" in out


def test_labels_and_nope_checkpoint_built_in_test(env, tmp_path):
    """A checkpoint written by hand (no train.py) with pos_emb='none' runs at any length."""
    torch.manual_seed(0)
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(env.itos), pos_emb="none")
    model = GPT(GPTConfig(**args))
    path = tmp_path / "nope.pt"
    torch.save({"model": model.state_dict(), "model_args": args, "config": {}, "meta": env.meta}, path)
    _, js = run_eval(["--ckpt", str(path), env.ckpts["pope"], "--labels", "NoPE,PoPE", "--data", env.val,
                      "--max_tokens", "400"], tmp_path)
    assert list(js["models"]) == ["NoPE", "PoPE"]
    assert js["lengths"] == [16 * k for k in range(1, 11)]  # the smallest block size sets the defaults
    assert all(math.isfinite(r["nll"]) for r in js["models"]["NoPE"]["results"].values())


# -----------------------------------------------------------------------------
# data sources

def test_txt_and_jsonl_match_bin(env, tmp_path):
    text = "".join(env.itos[i] for i in env.val_ids)
    txt = tmp_path / "val.txt"
    txt.write_text(text, encoding="utf-8")
    common = ["--ckpt", env.ckpts["pope"], "--lengths", "32,64", "--max_tokens", "640"]
    _, a = run_eval([*common, "--data", env.val], tmp_path, "a.json")
    _, b = run_eval([*common, "--data", str(txt)], tmp_path, "b.json")
    for L in ("32", "64"):
        assert a["models"]["out-pope"]["results"][L]["nll"] == b["models"]["out-pope"]["results"][L]["nll"]
    # jsonl: documents joined by "\n\n" for a character vocabulary
    jl = tmp_path / "docs.jsonl"
    jl.write_text(json.dumps({"text": "First Citizen:"}) + "\n\n" + json.dumps({"text": "Before we"}) + "\n")
    _, dec = codec(env.meta)
    toks = read_tokens(str(jl), env.meta, need=10 ** 6)
    assert dec(toks.tolist()) == "First Citizen:\n\nBefore we\n\n"
    assert len(read_tokens(str(jl), env.meta, need=5)) == 5


def test_gpt2_text_chunked_tokenization_is_exact(tmp_path, shared_data):
    meta = {"tokenizer": "gpt2", "vocab_size": 50304}
    enc, _ = codec(meta)
    with open(shared_data / "text" / "english" / "webtext.txt", encoding="utf-8") as f:
        text = f.read()[:60_000]
    text += "\n  \nword \nX\n\n\nY <|endoftext|>Z"  # whitespace runs around newlines, a special token
    p = tmp_path / "t.txt"
    p.write_text(text, encoding="utf-8")
    whole = enc(text)
    chunked = read_tokens(str(p), meta, need=10 ** 9, chunk_chars=777)
    assert chunked.tolist() == whole
    assert len(read_tokens(str(p), meta, need=100, chunk_chars=777)) == 100
    jl = tmp_path / "d.jsonl"
    jl.write_text(json.dumps({"text": "Hello world"}) + "\n" + json.dumps({"text": "Bye"}) + "\n")
    toks = read_tokens(str(jl), meta, need=10 ** 6).tolist()
    assert toks == enc("Hello world") + [50256] + enc("Bye") + [50256]


def test_hf_source_through_datasets(env, tmp_path, monkeypatch):
    """hf:pg19 streams deepmind/pg19's test split through datasets.load_dataset (stubbed here)."""
    calls = []
    text = "".join(env.itos[i] for i in env.val_ids[:3000])

    def load_dataset(repo, split=None, streaming=False):
        calls.append((repo, split, streaming))
        return [{"text": text[:1500]}, {"text": text[1500:]}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", "hf:pg19", "--lengths", "32", "--max_tokens", "256"],
                     tmp_path)
    assert calls == [("deepmind/pg19", "test", True)]
    assert js["models"]["out-pope"]["results"]["32"]["tokens"] == 256

    def offline(*a, **k):
        raise ConnectionError("no network")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    msg = err(["--ckpt", env.ckpts["pope"], "--data", "hf:pg19", "--lengths", "32"])
    assert "could not load deepmind/pg19" in msg and "no network" in msg and "local file" in msg


# -----------------------------------------------------------------------------
# errors

def test_clear_errors(env, tmp_path, monkeypatch):
    ck, val = env.ckpts["pope"], env.val
    assert "checkpoint nope/ckpt.pt not found" in err(["--ckpt", "nope/ckpt.pt", "--data", val])
    assert "data file missing.bin not found" in err(["--ckpt", ck, "--data", "missing.bin"])
    assert "must be a .bin" in err(["--ckpt", ck, "--data", __file__])
    # empty files
    ddir = tmp_path / "ds"
    ddir.mkdir()
    (ddir / "meta.json").write_text(json.dumps(env.meta))
    (ddir / "val.bin").write_bytes(b"")
    assert "is empty" in err(["--ckpt", ck, "--data", str(ddir / "val.bin")])
    (tmp_path / "e.txt").write_text("")
    assert "is empty" in err(["--ckpt", ck, "--data", str(tmp_path / "e.txt")])
    (tmp_path / "blank.jsonl").write_text("\n\n")
    assert "no tokens" in err(["--ckpt", ck, "--data", str(tmp_path / "blank.jsonl")])
    # lengths below 1 and junk
    assert "must be >= 1, got [0]" in err(["--ckpt", ck, "--data", val, "--lengths", "0,32"])
    assert "must be >= 1, got [-3]" in err(["--ckpt", ck, "--data", val, "--lengths=-3"])
    assert "comma-separated integers" in err(["--ckpt", ck, "--data", val, "--lengths", "1k"])
    # fewer tokens than one window of the longest length: say how many are needed
    env.val_ids[:100].tofile(ddir / "val.bin")
    msg = err(["--ckpt", ck, "--data", str(ddir / "val.bin")])  # default lengths: up to 320
    assert "has 100 tokens" in msg and "need at least 321 tokens" in msg
    # budgets
    assert "less than the longest length 64" in err(["--ckpt", ck, "--data", val, "--lengths", "64",
                                                     "--max_tokens", "10"])
    assert "has only 20000 tokens" in err(["--ckpt", ck, "--data", val, "--lengths", "64", "--max_tokens", "20000"])
    # a .bin without meta.json, a file that is no checkpoint, a foreign vocabulary
    (tmp_path / "lone").mkdir()
    env.val_ids.tofile(tmp_path / "lone" / "x.bin")
    assert "no meta.json beside it" in err(["--ckpt", ck, "--data", str(tmp_path / "lone" / "x.bin")])
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert err(["--ckpt", str(tmp_path / "junk.pt"), "--data", val]).startswith(
        f"error: {tmp_path / 'junk.pt'} is not a checkpoint torch.save wrote, or it is cut short (")
    (ddir / "meta.json").write_text(json.dumps({"vocab_size": 50304, "dtype": "uint16", "tokenizer": "gpt2"}))
    env.val_ids.tofile(ddir / "val.bin")
    assert "different vocabulary" in err(["--ckpt", ck, "--data", str(ddir / "val.bin")])
    # hf:pg19 without the datasets package (a fast, clear failure; never a hang)
    monkeypatch.setitem(sys.modules, "datasets", None)
    msg = err(["--ckpt", ck, "--data", "hf:pg19"])
    assert "pip install datasets" in msg and "--data pg19_test.jsonl" in msg
    # option checks
    assert "--yarn_only needs --yarn" in err(["--ckpt", ck, "--data", val, "--yarn_only"])
    assert "--yarn_scale must be >= 1" in err(["--ckpt", ck, "--data", val, "--yarn_scale", "0.5"])


@pytest.mark.parametrize("meta, want", [
    ("{not json", "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); "
                  "no prepare command is known for a dataset named 'ds'; the prepare scripts are python prepare/"),
    ("[1, 2]", "holds a JSON list, not an object; no prepare command is known for a dataset named 'ds'"),
    ({"dtype": "uint1x"}, "dtype is 'uint1x', expected an unsigned integer type such as uint16 or uint32"),
    ({"dtype": 16}, "dtype is 16, expected an unsigned integer type"),
    ({"dtype": "float32"}, "dtype is 'float32', expected an unsigned integer type"),
])
def test_bad_meta_json_beside_the_bin_is_one_line(env, tmp_path, meta, want):
    """Raw JSONDecodeError / TypeError tracebacks before; float32 read the ids as floats."""
    d = tmp_path / "ds"
    d.mkdir()
    env.val_ids.tofile(d / "val.bin")
    (d / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps({**env.meta, **meta}))
    msg = err(["--ckpt", env.ckpts["pope"], "--data", str(d / "val.bin"), "--lengths", "32"])
    assert msg.startswith(f"error: {d / 'meta.json'}") and want in msg and "\n" not in msg, msg


READER_META = {"vocab_size": 4, "dtype": "uint16", "tokenizer": "itos", "itos": list("ab\nc"), "tokens": {"val": 100},
               "prepare": "python prepare/x.py"}


@pytest.mark.parametrize("name, meta, data, want", [
    ("nope.bin", {}, None, "data file {d}/nope.bin not found"),
    ("val.bin", None, None, "{d}/val.bin: no meta.json beside it ({d}/meta.json); prepare/ writes each X.bin"),
    ("val.bin", {"dtype": "float32"}, None, "{d}/meta.json: dtype is 'float32', expected an unsigned integer type"),
    ("val.bin", {"dtype": "uint32"}, None,  # 200 bytes: 50 uint32 ids, not the 100 recorded
     "{d}/val.bin: holds 50 tokens but meta.json records 100 (files from different runs?); rebuild it with: python "
     "prepare/x.py"),
    ("val.bin", {}, b"\0" * 201, "{d}/val.bin: 201 bytes, not a multiple of 2 (the size of a uint16 token)"),
    ("val.bin", {"tokens": {"val": 99}}, None, "{d}/val.bin: holds 100 tokens but meta.json records 99"),
    ("val.bin", {"row_len": 30, "tokens": {}}, None, "{d}/val.bin: holds 100 tokens, not a multiple of row_len 30"),
    ("val.bin", {"tokenizer": "gpt2", "vocab_size": 50257}, None,
     "{d}/val.bin was tokenized with a different vocabulary than ck.pt's training data (gpt2 vs characters)"),
    ("val.md", {}, b"ab", "{d}/val.md: give a prepared split X.bin, a text X.txt or documents X.jsonl"),
    ("val.txt", {}, b"ab\xff", "{d}/val.txt is not UTF-8 text (byte 0xff); give a UTF-8 file"),
    ("val.txt", {}, b"abd", "{d}/val.txt: cannot tokenize with ck.pt's vocabulary: characters ['d']"),
    ("val.jsonl", {}, b'{"text": "ab"}\n\n{"text": ', "{d}/val.jsonl:3: not valid JSON (Expecting value"),
    ("val.jsonl", {}, b'{"text": 3}', '{d}/val.jsonl:1: expected an object with a "text" string'),
])
def test_read_tokens_refuses_bad_input(tmp_path, name, meta, data, want):
    """prepare.common.read_tokens, the eval scripts' reader: each bad file is a PrepareError of one line naming the
    file and the fix (a .bin's size and dtype as check_dataset checks them), where numpy read floats, memmapped
    a cut file or read the wrong ids before; the good file reads as written."""
    d = tmp_path / "ds"
    d.mkdir()
    ids = np.arange(100, dtype=np.uint16) % 4
    (d / "val.bin").write_bytes(ids.tobytes())
    (d / "meta.json").write_text(json.dumps(READER_META))
    assert np.array_equal(read_tokens(str(d / "val.bin"), READER_META, 10, "ck.pt"), ids)  # the whole file
    if data is not None:
        (d / name).write_bytes(data)
    if meta is None:
        (d / "meta.json").unlink()
    else:
        (d / "meta.json").write_text(json.dumps({**READER_META, **meta}))
    with pytest.raises(PrepareError) as e:
        read_tokens(str(d / name), READER_META, 10 ** 6, "ck.pt")
    assert str(e.value).startswith(want.format(d=d)) and "\n" not in str(e.value), str(e.value)


def test_unwritable_json_is_one_line(env, tmp_path, monkeypatch, readonly):
    """A folder, a read-only folder: refused before the run (EROFS / IsADirectoryError
    tracebacks after it before); a disk that fills up at the write: one line."""
    ck, val = env.ckpts["pope"], env.val
    monkeypatch.setattr(ex, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a checkpoint first"))
    assert err(["--ckpt", ck, "--data", val, "--json", str(tmp_path)]) == \
        f"error: --json {tmp_path} is a folder; give a file name"
    ro = tmp_path / "ro"
    ro.mkdir()
    readonly(ro)
    for option in ("--json", "--plot"):
        path = ro / "sub" / "r.out"
        assert err(["--ckpt", ck, "--data", val, option, str(path)]) == \
            f"error: {option} {path}: cannot write into {ro} (Read-only file system); give a path in a writable folder"
    monkeypatch.undo()
    assert list(ro.iterdir()) == []

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
    monkeypatch.setattr(Path, "write_text", full)
    out = tmp_path / "r.json"
    assert err(["--ckpt", ck, "--data", val, "--lengths", "32", "--max_tokens", "64", "--json", str(out)]) == \
        f"error: could not write --json {out} (No space left on device); the tables above hold the perplexities"


def test_tokenizer_offline_is_a_one_line_error(env, tmp_path, monkeypatch):
    """tiktoken without network or TIKTOKEN_CACHE_DIR: prepare.common's PrepareError, shown as one line."""
    import tiktoken
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50304, pos_emb="pope")
    path = tmp_path / "gpt2.pt"
    torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "config": {},
                "meta": {"tokenizer": "gpt2", "vocab_size": 50304}}, path)
    (tmp_path / "t.txt").write_text("Hello world. " * 50)

    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    msg = err(["--ckpt", str(path), "--data", str(tmp_path / "t.txt"), "--lengths", "16"])
    assert msg.startswith("error: tiktoken could not load the gpt2 encoding") and "TIKTOKEN_CACHE_DIR" in msg
    assert "\n" not in msg


def test_text_for_a_vocabulary_of_multi_character_tokens_asks_for_its_bin(tmp_path):
    """A JSB-like vocabulary (tokens of several characters) cannot tokenize a .txt: the error said to give "the
    prompt" as token ids, and this script has no prompt; it names the dataset's prepared split instead."""
    itos = ["<pad>", "N60", "N64", "N67", "SEP"]
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(itos), pos_emb="pope")
    (tmp_path / "t.txt").write_text("N60 N64 N67 SEP " * 20)
    for name, config, ds in (("jsb.pt", {"dataset": "jsb"}, "jsb"), ("old.pt", {}, "<dataset>")):
        torch.manual_seed(0)
        torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "config": config,
                    "meta": {"vocab_size": len(itos), "dtype": "uint16", "tokenizer": "itos", "itos": itos}},
                   tmp_path / name)
        assert err(["--ckpt", str(tmp_path / name), "--data", str(tmp_path / "t.txt"), "--lengths", "16"]) == \
            f"error: {tmp_path / 't.txt'}: cannot tokenize text with {tmp_path / name}'s vocabulary (it has " \
            f"multi-character tokens, e.g. JSB's); pass a prepared .bin of that model's dataset, e.g. --data " \
            f"data/{ds}/val.bin"


# -----------------------------------------------------------------------------
# the fine-tuning config (config/finetune_long.py), through train.py

def finetune(env, tmp_path, source, out_name, *extra):
    """train.py config/finetune_long.py for 3 steps at context 128 from the tiny <source>
    checkpoint, 1 warmup step, a cosine to 0 over 4 steps (were the lr decayed, step 2 would
    show it); returns (out_dir, its checkpoint, the lr of steps 0, 1, 2 from metrics.jsonl)."""
    out = tmp_path / out_name
    run_train([os.path.join(ROOT, "config", "finetune_long.py"), f"--init_from={env.ckpts[source]}",
               "--dataset=shk", f"--data_dir={env.root / 'data'}", f"--out_dir={out}", "--device=cpu",
               "--block_size=128", "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=3",
               "--warmup_iters=1", "--lr_decay_iters=4", "--min_lr=0.0", "--log_interval=1", "--eval_interval=3",
               "--eval_iters=1", *extra], cwd=tmp_path)
    with open(out / "metrics.jsonl") as f:
        lrs = [r["lr"] for r in map(json.loads, f) if "lr" in r]
    return out, torch.load(out / "ckpt.pt", map_location="cpu", weights_only=False), lrs


def test_finetune_yarn_end_to_end_and_eval_rule(env, tmp_path):
    """The README's RoPE+YaRN command (--rope_scaling=4.0) on the tiny RoPE checkpoint
    (context 32 -> 128, s = 4), then the eval: the checkpoint's own series keeps s = 4;
    --yarn uses max(4, L / 32)."""
    out, ck, _ = finetune(env, tmp_path, "rope", "out-rope-yarn", "--rope_scaling=4.0")
    ma = ck["model_args"]
    assert ma["pos_emb"] == "rope" and ma["block_size"] == 128
    assert ma["rope_scaling"] == 4.0 and ma["rope_scaling_orig_len"] == BLOCK
    _, js = run_eval(["--ckpt", str(out / "ckpt.pt"), "--data", env.val, "--lengths", "32,128,256",
                      "--max_tokens", "512", "--yarn"], tmp_path)
    plain, yarn = js["models"]["out-rope-yarn"], js["models"]["out-rope-yarn+YaRN"]
    assert plain["yarn"]["ckpt_scale"] == 4.0 and plain["yarn"]["orig_len"] == BLOCK
    assert [plain["results"][L]["rope_scaling"] for L in ("32", "128", "256")] == [4.0, 4.0, 4.0]
    assert [yarn["results"][L]["rope_scaling"] for L in ("32", "128", "256")] == [4.0, 4.0, 8.0]
    assert plain["results"]["128"]["nll"] == yarn["results"]["128"]["nll"]
    assert js["lengths"] == [32, 128, 256] and plain["block_size"] == 128


def test_finetune_pope_end_to_end(env, tmp_path):
    """The README's PoPE+ft command: the PoPE checkpoint as it is (no YaRN), at the recipe's
    lr: half of 6e-5 in the one warmup step, then 6e-5 with no decay."""
    _, ck, lrs = finetune(env, tmp_path, "pope", "out-pope-ft")
    assert ck["model_args"]["pos_emb"] == "pope" and ck["model_args"]["block_size"] == 128
    assert ck["model_args"]["rope_scaling"] == 1.0 and ck["iter_num"] == 3
    assert lrs == [3e-5, 6e-5, 6e-5], lrs
