"""eval_extrapolation.py and the fine-tuning config on the CPU: tiny PoPE / RoPE checkpoints trained by
train.py (run in this process, helpers.run_here) on a character-level Tiny Shakespeare slice (block_size 32);
every scored number against a float64 recomputation from the documented windows."""

import json
import math
import os
import sys
import types

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import eval_extrapolation as ex  # noqa: E402
from helpers import run_here, script_error  # noqa: E402
from model import GPT, GPTConfig, load_checkpoint, yarn_inv_freq  # noqa: E402
from prepare.common import PrepareError, codec, read_tokens  # noqa: E402

BLOCK = 32
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", f"--block_size={BLOCK}", "--device=cpu",
        "--compile=False"]


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
        run_train(["--dataset=shk", f"--data_dir={root / 'data'}", f"--out_dir={out}", f"--pos_emb={pe}",
                   *TINY, "--batch_size=8", "--gradient_accumulation_steps=1", "--max_iters=40",
                   "--eval_interval=40",
                   "--eval_iters=2", "--log_interval=100", "--warmup_iters=5", "--lr_decay_iters=40",
                   "--learning_rate=3e-3"], cwd=root)
        ckpts[pe] = str(out / "ckpt.pt")
    return types.SimpleNamespace(root=root, data=str(d), val=str(d / "val.bin"), meta=meta, itos=itos,
                                 val_ids=ids[200_000:220_000], ckpts=ckpts)


def run_eval(args, tmp_path, name="r.json"):
    out = str(tmp_path / name)
    res = ex.main([*args, "--json", out, "--no_progress", "--device", "cpu"])
    with open(out) as f:
        on_disk = json.load(f)
    return res, on_disk


def err(args):
    return script_error(ex.main, [*map(str, args), "--no_progress", "--device", "cpu"])


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
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                          pos_emb="rope")).eval()
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
    assert [b["nll"] for b in plain["results"]["96"]["buckets"]] == \
        [b["nll"] for b in yarn["results"]["96"]["buckets"]]


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


def test_json_has_every_length_and_consistent_buckets(env, tmp_path, capsys):
    res, js = run_eval(["--ckpt", env.ckpts["pope"], env.ckpts["rope"], "--data", env.val,
                        "--lengths", "96, 16,48,16", "--max_tokens", "1000", "--bucket_size", "20"], tmp_path)
    out = capsys.readouterr().out
    for m in js["models"].values():  # the table's last row: the longest length's ppl against the shortest's
        change = 100 * (m["results"]["96"]["ppl"] / m["results"]["16"]["ppl"] - 1)
        assert m["ppl_change_pct"] == pytest.approx(change, rel=1e-12)
    row = next(line for line in out.splitlines() if line.strip().startswith("96 vs 16"))
    assert row.split()[3:] == [f"{m['ppl_change_pct']:+.1f}%" for m in js["models"].values()]
    assert js["lengths"] == [16, 48, 96]
    assert set(js["models"]) == {"out-pope", "out-rope"}
    for m in js["models"].values():
        assert m["max_tokens"] == 960  # the largest multiple of 96 <= 1000: every length scores these
        assert set(m["results"]) == {"16", "48", "96"}
        for L in (16, 48, 96):
            r = m["results"][str(L)]
            assert (r["length"], r["windows"], r["short_window"], r["tokens"]) == (L, 960 // L, 0, 960)
            assert 0 < r["nll"] < 10 and math.isclose(r["ppl"], math.exp(r["nll"]))
            # buckets of 20 positions at every length, the last one cut at L; together the length's tokens
            assert [(b["start"], b["end"]) for b in r["buckets"]] == [(a, min(a + 20, L))
                                                                      for a in range(0, L, 20)]
            assert [b["tokens"] for b in r["buckets"]] == [960 // L * (b["end"] - b["start"])
                                                           for b in r["buckets"]]
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


def window_nll64(model, ids, L, B):
    """Per-token NLL of the documented windows at length L over targets t_1 .. t_B, in float64 from the
    formula logsumexp(z) - z_target: a list of (position in the window, nll) per scored token."""
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


@pytest.mark.parametrize("lengths, cap, short", [(None, 320, False), ("64,320", None, False),
                                               ("160,96", None, False), ("96,160", 400, False),
                                               ("96,160", None, True)])
def test_every_length_scores_the_same_tokens(env, tmp_path, lengths, cap, short):
    """B, the scored tokens: the largest multiple of the longest length within the cap and the data's targets
    (a 400-token file: 320); every length scores t_1 .. t_B, one that does not divide B ending in a shorter
    window (no least common multiple needed); the default lengths are the block size x 1..10. At 96 and 160
    the NLL equals the documented windows' computed here in float64."""
    data = env.val
    if short:
        (tmp_path / "short").mkdir()
        (tmp_path / "short" / "meta.json").write_text(json.dumps(env.meta))
        env.val_ids[:400].tofile(data := tmp_path / "short" / "val.bin")
    args = ["--ckpt", env.ckpts["pope"], "--data", data] + (["--lengths", lengths] if lengths else []) + \
        (["--max_tokens", str(cap)] if cap else [])
    _, js = run_eval([*map(str, args)], tmp_path)
    m, Ls = js["models"]["out-pope"], sorted(int(x) for x in lengths.split(",")) if lengths else None
    Ls = Ls or [BLOCK * k for k in range(1, 11)]
    n = 400 if short else len(env.val_ids)
    B = min(cap or n, n - 1) // max(Ls) * max(Ls)
    assert js["lengths"] == Ls and js["bucket_size"] == BLOCK and m["tokens_available"] == n
    assert m["max_tokens"] == B and B == {(None, 320): 320, ("160,96", None): 19840}.get((lengths, cap), B)
    for L in Ls:
        r = m["results"][str(L)]
        assert (r["tokens"], r["windows"], r["short_window"]) == (B, *divmod(B, L)), (L, r)
    if lengths == "160,96":
        model, _ = load_checkpoint(env.ckpts["pope"], device="cpu")
        ids = torch.from_numpy(env.val_ids[:B + 1].astype(np.int64))
        for L in (96, 160):
            ref = window_nll64(model, ids, L, B)
            assert len(ref) == B and abs(m["results"][str(L)]["nll"] - sum(v for _, v in ref) / B) < 1e-5


@pytest.mark.parametrize("pe", ["pope", "rope"])
def test_position_buckets_against_a_float64_reference(env, tmp_path, pe):
    """The mean NLL per position bucket at every length, against per-token NLLs computed here in float64 from
    the documented windows: a random stretch of the val stream (seeded), lengths 48 and 80 (48 ends in a short
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


def test_plot(env, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    run_eval(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "32,64", "--max_tokens", "128",
              "--plot", str(png)], tmp_path)
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    assert width > 2.5 * height  # two panels side by side: perplexity by length, NLL by position
    assert sorted(os.listdir(tmp_path)) == ["p.png", "r.json"]  # no temp files left


def test_plot_without_matplotlib_is_an_error_before_the_run(env, tmp_path, monkeypatch):
    """It was a note on stdout and exit 0: the user asked for a plot."""
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib.figure raises ImportError
    monkeypatch.setattr(ex, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a checkpoint first"))
    png = tmp_path / "p.png"
    msg = err(["--ckpt", env.ckpts["pope"], "--data", env.val, "--lengths", "32", "--plot", str(png),
               "--json", str(tmp_path / "r.json")])
    assert "--plot" in msg
    assert os.listdir(tmp_path) == []


def test_the_checkpoints_attn_impl_is_kept_unless_asked(env, tmp_path, monkeypatch):
    """The fork trap of issue 41: a variant trained with attn_impl='torch' is evaluated with it, not with
    the kernel; --attn_impl overrides it."""
    model, ckpt = load_checkpoint(env.ckpts["pope"])
    ckpt = {**ckpt, "model_args": {**ckpt["model_args"], "attn_impl": "torch"}}
    torch.save(ckpt, tmp_path / "torch.pt")
    seen = []
    real = ex.run_series
    monkeypatch.setattr(ex, "run_series", lambda s, *a: seen.append(s["m"]["cfg"].attn_impl) or real(s, *a))
    args = ["--ckpt", str(tmp_path / "torch.pt"), "--data", env.val, "--lengths", "32", "--max_tokens", "64"]
    run_eval(args, tmp_path)
    run_eval([*args, "--attn_impl", "auto"], tmp_path)
    assert seen == ["torch", "auto"]


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
    _, js = run_eval(["--ckpt", env.ckpts["pope"], "--data", "hf:pg19", "--lengths", "32",
                      "--max_tokens", "256"],
                     tmp_path)
    assert calls == [("deepmind/pg19", "test", True)]
    assert js["models"]["out-pope"]["results"]["32"]["tokens"] == 256

    def offline(*a, **k):
        raise ConnectionError("no network")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    assert "deepmind/pg19" in err(["--ckpt", env.ckpts["pope"], "--data", "hf:pg19", "--lengths", "32"])


def test_clear_errors(env, tmp_path, monkeypatch):
    ck, val = env.ckpts["pope"], env.val
    ddir = tmp_path / "ds"
    ddir.mkdir()
    (ddir / "meta.json").write_text(json.dumps(env.meta))
    env.val_ids[:100].tofile(ddir / "val.bin")  # fewer tokens than the default lengths' longest window
    (tmp_path / "e.txt").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    (tmp_path / "lone").mkdir()
    env.val_ids.tofile(tmp_path / "lone" / "x.bin")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "meta.json").write_text(json.dumps({"vocab_size": 50304, "dtype": "uint16",
                                                            "tokenizer": "gpt2"}))
    env.val_ids.tofile(tmp_path / "gpt2" / "val.bin")
    for args, named in ((["--ckpt", "nope/ckpt.pt", "--data", val], "nope/ckpt.pt"),
                        (["--ckpt", ck, "--data", "missing.bin"], "missing.bin"),
                        (["--ckpt", ck, "--data", __file__], "--data"),
                        (["--ckpt", ck, "--data", tmp_path / "e.txt"], "e.txt"),
                        (["--ckpt", ck, "--data", tmp_path / "blank.jsonl"], "blank.jsonl"),
                        (["--ckpt", ck, "--data", val, "--lengths", "0,32"], "--lengths"),
                        (["--ckpt", ck, "--data", val, "--lengths", "1k"], "--lengths"),
                        (["--ckpt", ck, "--data", ddir / "val.bin"], str(ddir / "val.bin")),
                        (["--ckpt", ck, "--data", val, "--lengths", "64", "--max_tokens", "10"],
                         "--max_tokens"),
                        (["--ckpt", ck, "--data", val, "--lengths", "64", "--max_tokens", "20000"],
                         "--max_tokens"),
                        (["--ckpt", ck, "--data", tmp_path / "lone" / "x.bin"], "meta.json"),
                        (["--ckpt", tmp_path / "junk.pt", "--data", val], str(tmp_path / "junk.pt")),
                        (["--ckpt", ck, "--data", tmp_path / "gpt2" / "val.bin"], str(tmp_path / "gpt2")),
                        (["--ckpt", ck, "--data", val, "--yarn_only"], "--yarn_only"),
                        (["--ckpt", ck, "--data", val, "--yarn_scale", "0.5"], "--yarn_scale")):
        assert named in err(args), (args, named)
    monkeypatch.setitem(sys.modules, "datasets", None)  # hf:pg19 without the datasets package: never a hang
    assert "datasets" in err(["--ckpt", ck, "--data", "hf:pg19"])


@pytest.mark.parametrize("meta", ["{not json", "[1, 2]", {"dtype": "uint1x"}, {"dtype": 16},
                                  {"dtype": "float32"}])
def test_bad_meta_json_beside_the_bin_is_one_line(env, tmp_path, meta):
    """Raw JSONDecodeError / TypeError tracebacks before; float32 read the ids as floats."""
    d = tmp_path / "ds"
    d.mkdir()
    env.val_ids.tofile(d / "val.bin")
    (d / "meta.json").write_text(meta if isinstance(meta, str) else json.dumps({**env.meta, **meta}))
    args = ["--ckpt", env.ckpts["pope"], "--data", d / "val.bin", "--lengths", "32"]
    assert str(d / "meta.json") in err(args)


READER_META = {"vocab_size": 4, "dtype": "uint16", "tokenizer": "itos", "itos": list("ab\nc"),
               "tokens": {"val": 100}, "prepare": "python prepare/x.py"}


@pytest.mark.parametrize("name, meta, data, named", [
    ("nope.bin", {}, None, "nope.bin"),
    ("val.bin", None, None, "meta.json"),  # no meta.json beside the .bin
    ("val.bin", {"dtype": "float32"}, None, "meta.json"),
    ("val.bin", {"dtype": "uint32"}, None, "val.bin"),  # 200 bytes: 50 uint32 ids, not the 100 recorded
    ("val.bin", {}, b"\0" * 201, "val.bin"),  # not a multiple of the token size
    ("val.bin", {"tokens": {"val": 99}}, None, "val.bin"),
    ("val.bin", {"row_len": 30, "tokens": {}}, None, "val.bin"),
    ("val.bin", {"tokenizer": "gpt2", "vocab_size": 50257}, None, "val.bin"),
    ("val.md", {}, b"ab", "val.md"),
    ("val.txt", {}, b"ab\xff", "val.txt"),
    ("val.txt", {}, b"abd", "val.txt"),
    ("val.jsonl", {}, b'{"text": "ab"}\n\n{"text": ', "val.jsonl:3"),
    ("val.jsonl", {}, b'{"text": 3}', "val.jsonl:1"),
])
def test_read_tokens_refuses_bad_input(tmp_path, name, meta, data, named):
    """prepare.common.read_tokens, the eval scripts' reader: each bad file is a PrepareError of one line
    naming the file, where numpy read floats, memmapped a cut file or read the wrong ids before; the good file
    reads as written."""
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
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_unwritable_outputs_are_refused_before_the_run(env, tmp_path, monkeypatch, readonly):
    """A folder given as --json, a read-only folder for --json or --plot: refused before any checkpoint is
    read (with or without matplotlib), naming the option; nothing written."""
    ck, val = env.ckpts["pope"], env.val
    monkeypatch.setattr(ex, "load_checkpoint", lambda *a, **k: pytest.fail("loaded a checkpoint first"))
    assert "--json" in err(["--ckpt", ck, "--data", val, "--json", tmp_path])
    ro = tmp_path / "ro"
    ro.mkdir()
    readonly(ro)
    for option in ("--json", "--plot"):
        assert option in err(["--ckpt", ck, "--data", val, option, ro / "sub" / "r.out"])
    monkeypatch.undo()
    assert list(ro.iterdir()) == []


def test_tokenizer_offline_is_a_one_line_error(env, tmp_path, monkeypatch):
    """tiktoken without network or TIKTOKEN_CACHE_DIR: one line that names TIKTOKEN_CACHE_DIR."""
    import tiktoken
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=50304, pos_emb="pope")
    path = tmp_path / "gpt2.pt"
    torch.manual_seed(0)
    torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "config": {},
                "meta": {"tokenizer": "gpt2", "vocab_size": 50304}}, path)
    (tmp_path / "t.txt").write_text("Hello world. " * 50)

    def offline(name):
        raise ConnectionError("no network")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    assert "TIKTOKEN_CACHE_DIR" in err(["--ckpt", path, "--data", tmp_path / "t.txt", "--lengths", "16"])


def test_text_for_a_vocabulary_of_multi_character_tokens_asks_for_its_bin(tmp_path):
    """A JSB-like vocabulary (tokens of several characters) cannot tokenize a .txt: the error names the
    dataset's prepared split."""
    itos = ["<pad>", "N60", "N64", "N67", "SEP"]
    args = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(itos), pos_emb="pope")
    (tmp_path / "t.txt").write_text("N60 N64 N67 SEP " * 20)
    for name, config, ds in (("jsb.pt", {"dataset": "jsb"}, "jsb"), ("old.pt", {}, "<dataset>")):
        torch.manual_seed(0)
        torch.save({"model": GPT(GPTConfig(**args)).state_dict(), "model_args": args, "config": config,
                    "meta": {"vocab_size": len(itos), "dtype": "uint16", "tokenizer": "itos", "itos": itos}},
                   tmp_path / name)
        assert f"data/{ds}/val.bin" in err(["--ckpt", tmp_path / name, "--data", tmp_path / "t.txt",
                                            "--lengths", "16"])


def finetune(env, tmp_path, source, out_name, *extra):
    """train.py config/finetune_long.py for 3 steps at context 128 from the tiny <source>
    checkpoint, 1 warmup step, a cosine to 0 over 4 steps (were the lr decayed, step 2 would
    show it); returns (out_dir, its checkpoint, the lr of steps 0, 1, 2 from metrics.jsonl)."""
    out = tmp_path / out_name
    run_train([os.path.join(ROOT, "config", "finetune_long.py"), f"--init_from={env.ckpts[source]}",
               "--dataset=shk", f"--data_dir={env.root / 'data'}", f"--out_dir={out}", "--device=cpu",
               "--block_size=128", "--batch_size=2", "--gradient_accumulation_steps=1", "--max_iters=3",
               "--warmup_iters=1", "--lr_decay_iters=4", "--min_lr=0.0", "--log_interval=1",
               "--eval_interval=3",
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
