"""eval_frequencies.py on tiny models saved as train.py saves them, run on the CPU (--device cpu, also where a
GPU is visible): magnitudes and weights against a float64 reference computed here from the weights, planted
models (hand-set q/k projections) with a known answer."""

import copy
import json
import math
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import eval_frequencies as ef  # noqa: E402
from helpers import script_error  # noqa: E402
from model import GPT, GPTConfig, yarn_inv_freq  # noqa: E402

ITOS = list("abcdefghijklmnop")
META = {"vocab_size": len(ITOS), "dtype": "uint16", "tokenizer": "itos", "itos": ITOS}
TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=len(ITOS))  # head dim D = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """val.bin (5000 random letters) with its meta.json."""
    d = tmp_path_factory.mktemp("freq") / "data"
    d.mkdir()
    np.random.default_rng(0).integers(0, len(ITOS), 5000).astype(np.uint16).tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps(META))
    return d / "val.bin"


def save(model, path):
    """A checkpoint with the keys train.py writes (no optimizer state: it is not read here)."""
    args = {f: getattr(model.config, f) for f in model.config.__dataclass_fields__}
    torch.save({"model": model.state_dict(), "model_args": args, "iter_num": 1, "best_val_loss": math.inf,
                "config": {}, "meta": META}, path)
    return str(path)


def tiny(seed, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **kw})).eval()


def run(args, tmp_path):
    out = tmp_path / "f.json"
    res = ef.main([*map(str, args), "--json", str(out), "--no_progress", "--device", "cpu"])
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(res))
    return on_disk


def err(args):
    return script_error(ef.main, [*args, "--no_progress", "--device", "cpu"])


@pytest.mark.parametrize("pe,extra", [("pope", dict(pope_base=500.0)), ("rope", {}),
                                      ("rope", dict(rope_scaling=4.0, rope_scaling_orig_len=8)),
                                      ("none", {})])
def test_shapes_and_frequency_order(data, tmp_path, pe, extra):
    path = save(tiny(0, pos_emb=pe, **extra), tmp_path / "m.pt")
    js = run(["--ckpt", path, "--data", data, "--tokens", 256], tmp_path)
    assert js["tokens"] == 256 and js["data"] == str(data)
    m = js["models"]["m"]
    D, C = 8, 8 if pe == "pope" else 4
    assert (m["ckpt"], m["pos_emb"], m["tokens"], m["window"]) == (path, pe, 256, 16)
    for key in ("q_mag", "k_mag", "weight"):
        assert np.array(m[key]).shape == (2, 2, C) and np.all(np.array(m[key]) > 0)
    share, freq = np.array(m["share"]), np.array(m["freq"])
    assert share.shape == (2, C) and np.allclose(share.sum(1), 1.0, atol=1e-12)
    assert np.all(np.diff(freq) < 0)  # highest frequency first
    if pe == "pope":  # theta_c = base^(-c/D), channel c = dim c
        assert m["dims"] == [[c] for c in range(D)]
        np.testing.assert_allclose(freq, 500.0 ** (-np.arange(D) / D), rtol=1e-12)
    else:  # apply_rope pairs dim i with i + D/2; the model's inv_freq (YaRN's where set) is the frequency
        assert m["dims"] == [[i, i + D // 2] for i in range(C)]
        ref = yarn_inv_freq(D, 10000.0, extra.get("rope_scaling", 1.0),
                            extra.get("rope_scaling_orig_len", 16))[0]
        np.testing.assert_allclose(freq, ref.double().numpy(), rtol=1e-6)
    n_top = max(1, C // 4)
    assert m["top_quarter"] == n_top
    np.testing.assert_allclose(m["top_quarter_share"], share[:, :n_top].sum(1), rtol=1e-12)
    assert m["top_quarter_share_mean"] == pytest.approx(np.mean(m["top_quarter_share"]), rel=1e-12)


def planted(pe, seed, channel):
    """q/k projections that ignore the input (weights 0) and put everything into one channel through the
    bias."""
    model = tiny(seed, pos_emb=pe, bias=True)
    C, D, g = 16, 8, torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in model.transformer.h:
            w, b = block.attn.c_attn.weight, block.attn.c_attn.bias
            w[:2 * C] = 0
            b[:2 * C] = -30.0 if pe == "pope" else 0.0  # softplus(-30) ~ 1e-13; RoPE: norm 0
            for h in range(2):
                for part in (0, C):  # q, then k
                    dims = [channel] if pe == "pope" else [channel, channel + D // 2]
                    b[[part + h * D + d for d in dims]] = 1.0 + 4.0 * torch.rand(len(dims), generator=g)
    return model


@pytest.mark.parametrize("pe,channel", [("pope", 1), ("pope", 5), ("rope", 0), ("rope", 2)])
def test_planted_channel_carries_the_weight(data, tmp_path, pe, channel):
    seed = 10 + channel
    model = planted(pe, seed, channel)
    m = run(["--ckpt", save(model, tmp_path / "m.pt"), "--data", data, "--tokens", 64],
            tmp_path)["models"]["m"]
    share = np.array(m["share"])
    C = len(m["freq"])
    assert (share.argmax(1) == channel).all(), f"seed {seed}: {share}"
    np.testing.assert_allclose(share[:, channel], 1.0, atol=1e-10, err_msg=f"seed {seed}")
    in_top = channel < max(1, C // 4)
    np.testing.assert_allclose(m["top_quarter_share"], 1.0 if in_top else 0.0, atol=1e-10,
                               err_msg=f"seed {seed}")
    b = model.transformer.h[1].attn.c_attn.bias.double()  # layer 1, head 1: its q and k magnitudes, by hand
    if pe == "pope":
        mq, mk = F.softplus(b[8 + channel]), F.softplus(b[16 + 8 + channel])
    else:
        mq, mk = torch.hypot(b[8 + channel], b[12 + channel]), torch.hypot(b[24 + channel], b[28 + channel])
    assert m["q_mag"][1][1][channel] == pytest.approx(mq.item(), rel=1e-6), f"seed {seed}"
    assert m["k_mag"][1][1][channel] == pytest.approx(mk.item(), rel=1e-6), f"seed {seed}"
    assert m["weight"][1][1][channel] == pytest.approx((mq * mk).item(), rel=1e-6), f"seed {seed}"


@pytest.mark.parametrize("pe", ["pope", "rope"])
def test_magnitudes_and_weight_match_a_float64_reference(data, tmp_path, pe):
    """mu = softplus(q) (PoPE) or the norm of (q_i, q_i+D/2) (RoPE) from the projections computed here in
    float64; weight = the mean over causal pairs s <= t by an explicit mask. rtol 2e-5: the script runs
    the model in float32 (on the CPU: no TF32)."""
    seed = 20
    model = tiny(seed, pos_emb=pe)
    with torch.no_grad():  # larger weights than the init, so that softplus is far from linear
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(40.0)
    m = run(["--ckpt", save(model, tmp_path / "m.pt"), "--data", data, "--tokens", 48],
            tmp_path)["models"]["m"]
    idx = torch.from_numpy(np.fromfile(data, dtype=np.uint16)[:48].astype(np.int64)).view(3, 16)
    ref = copy.deepcopy(model).double().requires_grad_(False)
    x = ref.transformer.wte(idx)
    causal = torch.tril(torch.ones(16, 16, dtype=torch.float64))  # [t, s] = 1 where s <= t
    for layer, block in enumerate(ref.transformer.h):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * block.ln_1.weight
        qk = (h @ block.attn.c_attn.weight[:32].T).split(16, -1)
        q, k = (t.view(3, 16, 2, 8).transpose(1, 2) for t in qk)
        if pe == "pope":
            mq, mk = F.softplus(q), F.softplus(k)
        else:
            mq, mk = torch.hypot(q[..., :4], q[..., 4:]), torch.hypot(k[..., :4], k[..., 4:])
        w = torch.einsum("bhtc,ts,bhsc->hc", mq, causal, mk) / (3 * causal.sum())
        for key, want in (("q_mag", mq.mean((0, 2))), ("k_mag", mk.mean((0, 2))), ("weight", w)):
            np.testing.assert_allclose(m[key][layer], want.numpy(), rtol=2e-5,
                                       err_msg=f"seed {seed}, layer {layer}")
        x = block(x)  # the next layer's input


@pytest.mark.parametrize("pe", ["pope", "rope"])
def test_rows_are_read_a_window_per_row(tmp_path, pe):
    """A split of fixed rows (row_len 10, as train.py reads indirect indexing) with a block size of 16:
    windows are the first 9 tokens of each row, so the numbers equal those of the same weights (block
    size 9) over those windows laid back to back; the stream read in 16-token windows would differ."""
    rng = np.random.default_rng(1)
    rows, flat = tmp_path / "rows", tmp_path / "flat"
    toks = rng.integers(0, len(ITOS), (6, 10)).astype(np.uint16)
    for d, arr, meta in ((rows, toks, {**META, "row_len": 10}), (flat, toks[:, :9], META)):
        d.mkdir()
        arr.tofile(d / "val.bin")
        (d / "meta.json").write_text(json.dumps(meta))
    model = tiny(3, pos_emb=pe)
    got = run(["--ckpt", save(model, tmp_path / "m.pt"), "--data", rows / "val.bin", "--tokens", 60],
              tmp_path)
    model.config.block_size = 9
    want = run(["--ckpt", save(model, tmp_path / "w.pt"), "--data", flat / "val.bin", "--tokens", 54],
               tmp_path)
    g, w = got["models"]["m"], want["models"]["w"]
    assert (g["window"], g["tokens"]) == (w["window"], w["tokens"]) == (9, 54)
    for key in ("q_mag", "k_mag", "weight", "share"):
        np.testing.assert_allclose(g[key], w[key], rtol=1e-6, err_msg=key)


def test_text_data_matches_bin_and_table_matches_json(data, tmp_path, capsys):
    path = save(tiny(1, pos_emb="pope"), tmp_path / "m.pt")
    text = "".join(ITOS[i] for i in np.fromfile(data, dtype=np.uint16)[:160])
    (tmp_path / "t.txt").write_text(text)
    docs = [json.dumps({"text": text[:70]}), json.dumps({"text": text[70:]})]
    (tmp_path / "t.jsonl").write_text("\n\n".join(docs))
    ref = run(["--ckpt", path, "--data", data, "--tokens", 160], tmp_path)["models"]["m"]
    out = capsys.readouterr().out
    assert "  share " + "".join(f"{x:7.3f}" for x in ref["top_quarter_share"]) in out
    # (.jsonl documents end as in training: "\n\n" when the vocabulary has "\n"; this one has not)
    for name in ("t.txt", "t.jsonl"):
        got = run(["--ckpt", path, "--data", tmp_path / name, "--tokens", 160], tmp_path)
        assert got["models"]["m"] == ref


def test_plot_and_json_paths_are_checked_before_the_measurement(data, tmp_path, monkeypatch):
    """A PNG is written with matplotlib (without it, an error naming --plot); an output folder that cannot
    be written is refused before any model runs, naming the option."""
    path = save(tiny(0, pos_emb="pope"), tmp_path / "p.pt")
    path2 = save(tiny(0, pos_emb="rope"), tmp_path / "r.pt")
    args = ["--ckpt", path, path2, "--labels", "P,R", "--data", data, "--tokens", 64,
            "--plot", tmp_path / "f.png"]
    try:
        import matplotlib  # noqa: F401
        ef.main([*map(str, args), "--no_progress", "--device", "cpu"])
        assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    except ImportError:
        assert "--plot" in err(args)
    monkeypatch.setattr(ef, "measure", lambda *a, **k: pytest.fail("measured before checking the outputs"))
    (tmp_path / "file").write_text("")
    for option in ("--json", "--plot"):
        assert option in err(["--ckpt", path, "--data", data, option, tmp_path / "file" / "x"])


def test_default_tokens_use_a_smaller_file_whole(data, tmp_path, monkeypatch):
    """Without --tokens: up to DEFAULT_TOKENS, a smaller file whole in whole windows; the same numbers as the
    explicit --tokens. Less than one window is an error naming the data file."""
    ck = save(tiny(2, pos_emb="rope"), tmp_path / "m.pt")
    got = run(["--ckpt", ck, "--data", data], tmp_path)
    assert got["tokens"] == 65536 and got["models"]["m"]["tokens"] == 5000 // 16 * 16
    assert run(["--ckpt", ck, "--data", data, "--tokens", 4992], tmp_path)["models"] == got["models"]
    monkeypatch.setattr(ef, "DEFAULT_TOKENS", 160)  # a file larger than the default: its first 160 tokens
    got = run(["--ckpt", ck, "--data", data], tmp_path)
    assert got["tokens"] == 160
    assert got["models"] == run(["--ckpt", ck, "--data", data, "--tokens", 160], tmp_path)["models"]
    (tmp_path / "short").mkdir()
    np.fromfile(data, dtype=np.uint16)[:15].tofile(tmp_path / "short" / "val.bin")
    (tmp_path / "short" / "meta.json").write_text(json.dumps(META))
    short = tmp_path / "short" / "val.bin"
    assert str(short) in err(["--ckpt", ck, "--data", short])


def test_the_checkpoints_attn_impl_is_kept_unless_asked(data, tmp_path, monkeypatch):
    """A variant trained with attn_impl='torch' is measured with it; --attn_impl overrides it."""
    ck = save(tiny(0, pos_emb="pope", attn_impl="torch"), tmp_path / "m.pt")
    seen = []
    real = ef.measure
    monkeypatch.setattr(ef, "measure", lambda label, path, model, *a: seen.append(model.config.attn_impl) or
                        real(label, path, model, *a))
    run(["--ckpt", ck, "--data", data, "--tokens", 32], tmp_path)
    run(["--ckpt", ck, "--data", data, "--tokens", 32, "--attn_impl", "auto"], tmp_path)
    assert seen == ["torch", "auto"]


def test_clear_errors(data, tmp_path):
    """Every refusal is one line, exit status 2, naming the file or option at fault."""
    ck = save(tiny(0, pos_emb="pope"), tmp_path / "m.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    bad = tmp_path / "bad"  # a split whose meta.json is not JSON
    bad.mkdir()
    np.zeros(100, dtype=np.uint16).tofile(bad / "val.bin")
    (bad / "meta.json").write_text("{not json")
    (tmp_path / "bad.jsonl").write_text('{"text": "abc"}\n[1, 2]\n')
    (tmp_path / "x.txt").write_text("xyz" * 10)
    small = save(tiny(0, pos_emb="pope", vocab_size=8), tmp_path / "small_vocab.pt")
    for args, named in ((["--ckpt", "nope/ckpt.pt", "--data", data], "nope/ckpt.pt"),
                        (["--ckpt", ck, "--data", data, "--tokens", 0], "--tokens"),
                        (["--ckpt", ck, "--data", data, "--tokens", 6000], str(data)),
                        (["--ckpt", ck, "--data", "missing.bin"], "missing.bin"),
                        (["--ckpt", ck, "--data", bad / "val.bin"], "meta.json"),
                        (["--ckpt", ck, "--data", __file__], "--data"),
                        (["--ckpt", ck, "--data", data, "--labels", "a,b"], "--labels"),
                        (["--ckpt", ck, ck, "--data", data], "--labels"),
                        (["--ckpt", tmp_path / "junk.pt", "--data", data], str(tmp_path / "junk.pt")),
                        (["--ckpt", ck, "--data", tmp_path / "bad.jsonl"], "bad.jsonl:2"),
                        (["--ckpt", ck, "--data", tmp_path / "x.txt"], "x.txt"),
                        (["--ckpt", small, "--data", data, "--tokens", 64], small)):
        assert named in err(args), (args, named)
