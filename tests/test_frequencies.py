"""eval_frequencies.py on tiny models, run on the CPU (--device cpu, also where a GPU is visible):
every number against a float64 reference computed here from the weights. Then what both eval scripts
(this one and eval_extrapolation.py) share: the checkpoint's attn_impl, outputs checked before the
run, the refusals."""

import copy
import dataclasses
import json
import sys

import numpy as np
import pytest
import torch

import eval_extrapolation as ex
import eval_frequencies as ef
from helpers import pope_magnitude_f64, script_error
from model import GPT, GPTConfig, yarn_inv_freq

ITOS = list("abcdefghijklmnop")
META = {"vocab_size": len(ITOS), "dtype": "uint16", "tokenizer": "itos", "itos": ITOS}
TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=len(ITOS))  # head dim D = 8
FEW = {ef: ["--tokens", "64"], ex: ["--lengths", "16", "--max_tokens", "64"]}  # a few windows of 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """val.bin (5000 random letters) with its meta.json."""
    d = tmp_path_factory.mktemp("freq") / "data"
    d.mkdir()
    np.random.default_rng(0).integers(0, len(ITOS), 5000).astype(np.uint16).tofile(d / "val.bin")
    (d / "meta.json").write_text(json.dumps(META))
    return d / "val.bin"


def save(model, path):
    """A checkpoint with the keys the scripts read (train.py's, less the optimizer state)."""
    torch.save({"model": model.state_dict(), "model_args": dataclasses.asdict(model.config),
                "config": {}, "meta": META}, path)
    return str(path)


def tiny(seed, **kw):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**TINY, **kw})).eval()


def main(script, args):
    return script.main([*map(str, args), "--no_progress", "--device", "cpu"])


def err(script, args):
    return script_error(script.main, [*args, "--device", "cpu"])


def run(args, tmp_path):
    """eval_frequencies.py's result, as written to --json (and as main returns it)."""
    res = json.loads(json.dumps(main(ef, [*args, "--json", tmp_path / "f.json"])))
    assert json.loads((tmp_path / "f.json").read_text()) == res
    return res


@pytest.mark.parametrize("pe,extra", [("pope", dict(pope_base=500.0)), ("rope", {}), ("none", {}),
                                      ("rope", dict(rope_scaling=4.0, rope_scaling_orig_len=8))])
def test_every_number_against_a_float64_reference(data, tmp_path, pe, extra):
    """Frequencies: PoPE's channel c (dim c) at base^(-c/D); RoPE's pair (i, i + D/2) at the model's
    inv_freq (YaRN's where set), NoPE's at plain RoPE's. mu = model.pope_magnitude(q) (PoPE) or the
    pair's norm, from projections computed here in float64; weight = the mean over causal pairs
    s <= t by an explicit mask; share = weight summed over heads, each layer's row normalised. rtol
    2e-5: the script runs the model in float32 (on the CPU: no TF32)."""
    model = tiny(20, pos_emb=pe, **extra)
    with torch.no_grad():  # larger weights than the init, so that the magnitude is far from linear
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(40.0)
    m = run(["--ckpt", save(model, tmp_path / "m.pt"), "--data", data, "--tokens", 48],
            tmp_path)["models"]["m"]
    D, C = 8, 8 if pe == "pope" else 4
    assert (m["pos_emb"], m["tokens"], m["window"], m["top_quarter"]) == (pe, 48, 16, C // 4)
    if pe == "pope":
        assert m["dims"] == [[c] for c in range(D)]
        np.testing.assert_allclose(m["freq"], 500.0 ** (-np.arange(D) / D), rtol=1e-12)
    else:
        assert m["dims"] == [[i, i + D // 2] for i in range(C)]
        theta = 10000.0 ** (-np.arange(0, D, 2) / D)
        if extra:  # YaRN (its formula: test_model.py)
            theta = yarn_inv_freq(D, 10000.0, 4.0, 8)[0].double().numpy()
        np.testing.assert_allclose(m["freq"], theta, rtol=1e-6)
    idx = torch.from_numpy(np.fromfile(data, dtype=np.uint16)[:48].astype(np.int64)).view(3, 16)
    ref = copy.deepcopy(model).double().requires_grad_(False)
    x = ref.transformer.wte(idx)
    causal = torch.tril(torch.ones(16, 16, dtype=torch.float64))  # [t, s] = 1 where s <= t
    for layer, block in enumerate(ref.transformer.h):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * block.ln_1.weight
        qk = (h @ block.attn.c_attn.weight[:32].T).split(16, -1)
        q, k = (t.view(3, 16, 2, 8).transpose(1, 2) for t in qk)
        if pe == "pope":
            mq, mk = pope_magnitude_f64(q), pope_magnitude_f64(k)
        else:
            mq, mk = torch.hypot(q[..., :4], q[..., 4:]), torch.hypot(k[..., :4], k[..., 4:])
        w = torch.einsum("bhtc,ts,bhsc->hc", mq, causal, mk) / (3 * causal.sum())
        share = w.sum(0) / w.sum()
        for key, want in (("q_mag", mq.mean((0, 2))), ("k_mag", mk.mean((0, 2))), ("weight", w),
                          ("share", share), ("top_quarter_share", share[:C // 4].sum())):
            np.testing.assert_allclose(m[key][layer], want.numpy(), rtol=2e-5,
                                       err_msg=f"{key} {layer}")
        x = block(x)  # the next layer's input
    assert m["top_quarter_share_mean"] == pytest.approx(np.mean(m["top_quarter_share"]), rel=1e-12)


def test_rows_are_read_a_window_per_row(tmp_path):
    """A split of fixed rows (row_len 10, as train.py reads indirect indexing) with a block size of
    16: windows are the first 9 tokens of each row, so the numbers equal those of the same weights
    (block size 9) over those windows laid back to back; the stream read in 16-token windows would
    differ."""
    rows, flat = tmp_path / "rows", tmp_path / "flat"
    toks = np.random.default_rng(1).integers(0, len(ITOS), (6, 10)).astype(np.uint16)
    for d, arr, meta in ((rows, toks, {**META, "row_len": 10}), (flat, toks[:, :9], META)):
        d.mkdir()
        arr.tofile(d / "val.bin")
        (d / "meta.json").write_text(json.dumps(meta))
    model = tiny(3, pos_emb="pope")
    got = run(["--ckpt", save(model, tmp_path / "m.pt"), "--data", rows / "val.bin",
               "--tokens", 60], tmp_path)["models"]["m"]
    model.config.block_size = 9
    want = run(["--ckpt", save(model, tmp_path / "w.pt"), "--data", flat / "val.bin",
                "--tokens", 54], tmp_path)["models"]["w"]
    assert (got["window"], got["tokens"]) == (want["window"], want["tokens"]) == (9, 54)
    for key in ("q_mag", "k_mag", "weight", "share"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)


def test_default_tokens_use_a_smaller_file_whole(data, tmp_path, monkeypatch):
    """Without --tokens: up to DEFAULT_TOKENS, a smaller file whole in whole windows; the same
    numbers as the explicit --tokens."""
    ck = save(tiny(2, pos_emb="rope"), tmp_path / "m.pt")
    got = run(["--ckpt", ck, "--data", data], tmp_path)
    assert got["tokens"] == 65536 and got["models"]["m"]["tokens"] == 5000 // 16 * 16
    assert (run(["--ckpt", ck, "--data", data, "--tokens", 4992], tmp_path)["models"]
            == got["models"])
    # a file larger than the default: its first 160 tokens
    monkeypatch.setattr(ef, "DEFAULT_TOKENS", 160)
    got = run(["--ckpt", ck, "--data", data], tmp_path)
    assert got["tokens"] == 160
    assert got["models"] == run(["--ckpt", ck, "--data", data, "--tokens", 160], tmp_path)["models"]


@pytest.mark.parametrize("script", [ef, ex])
def test_the_checkpoints_attn_impl_is_kept_unless_asked(data, tmp_path, monkeypatch, script):
    """The fork trap of issue 41: a variant trained with attn_impl='torch' runs with it, not with
    the kernel; --attn_impl overrides it."""
    ck = save(tiny(0, pos_emb="pope", attn_impl="torch"), tmp_path / "m.pt")
    loaded, load = [], script.load_checkpoint
    monkeypatch.setattr(script, "load_checkpoint",
                        lambda *a, **k: loaded.append(load(*a, **k)) or loaded[-1])
    for extra in ([], ["--attn_impl", "auto"]):
        main(script, ["--ckpt", ck, "--data", data, *FEW[script], *extra])
    assert [model.config.attn_impl for model, _ in loaded] == ["torch", "auto"]


@pytest.mark.parametrize("script", [ef, ex])
def test_outputs_are_checked_before_any_checkpoint_is_read(data, tmp_path, monkeypatch, script):
    """--json or --plot where no file can be written, or --plot without matplotlib: refused naming
    the option before any checkpoint is read, nothing written; with matplotlib, --plot writes a
    PNG."""
    ck = save(tiny(0, pos_emb="pope"), tmp_path / "m.pt")
    (tmp_path / "file").write_text("")
    args = ["--ckpt", ck, "--data", data, *FEW[script]]
    with monkeypatch.context() as m:
        m.setattr(script, "load_checkpoint", lambda *a, **k: pytest.fail("read a checkpoint first"))
        for option in ("--json", "--plot"):
            assert option in err(script, [*args, option, tmp_path / "file" / "x"])
        for name in ("matplotlib", "matplotlib.figure"):
            m.setitem(sys.modules, name, None)  # import matplotlib raises ImportError
        assert "--plot" in err(script, [*args, "--plot", tmp_path / "p.png"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "m.pt"]
    pytest.importorskip("matplotlib")
    main(script, [*args, "--plot", tmp_path / "p.png"])
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("script", [ef, ex])
def test_refusals_name_the_file_or_option(data, tmp_path, monkeypatch, script):
    """Exit status 2 and one line (helpers.script_error) naming the file or option at fault. Each
    case overrides the good arguments (argparse keeps an option's last value)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ck = save(tiny(0, pos_emb="pope"), tmp_path / "m.pt")
    # the data holds ids up to 15
    small = save(tiny(0, pos_emb="pope", vocab_size=8), tmp_path / "small.pt")
    (tmp_path / "short").mkdir()
    # less than any window
    np.zeros(15, dtype=np.uint16).tofile(short := tmp_path / "short" / "val.bin")
    (tmp_path / "short" / "meta.json").write_text(json.dumps(META))
    (tmp_path / "empty.txt").write_text("")
    np.zeros(100, dtype=np.uint16).tofile(tmp_path / "lone.bin")  # no meta.json beside it
    cases = [
        (["--ckpt", "nope/ckpt.pt"], "nope/ckpt.pt"),
        (["--data", "missing.bin"], "missing.bin"),
        (["--data", __file__], "--data"),
        (["--data", tmp_path / "empty.txt"], "empty.txt"),
        (["--data", tmp_path / "lone.bin"], "meta.json"),
        (["--data", short], str(short)),
        (["--labels", "a,b"], "--labels"),
        (["--ckpt", small], small),
        (["--attn_impl", "triton"], "--attn_impl"),  # (err: --device cpu)
    ]
    cases += {
        ef: [
            (["--tokens", 0], "--tokens"),
            (["--tokens", 6000], str(data)),
            (["--ckpt", ck, ck], "--labels"),  # (two series, one label)
        ],
        ex: [
            (["--lengths", "0,32"], "--lengths"),
            (["--lengths", "1k"], "--lengths"),
            (["--max_tokens", "10"], "--max_tokens"),
            (["--max_tokens", "6000"], "--max_tokens"),
            (["--yarn_only"], "--yarn_only"),
            (["--yarn_scale", "0.5"], "--yarn_scale"),
            (["--yarn_scale", "nan"], "--yarn_scale"),
            (["--yarn_scale", "inf"], "--yarn_scale"),
        ],
    }[script]
    for args, named in cases:
        assert named in err(script, ["--ckpt", ck, "--data", data, *args]), args
    no_gpu = ["--ckpt", ck, "--data", data, "--device", "cuda:64"]  # (no machine has 65 GPUs)
    assert "--device" in script_error(script.main, no_gpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernel on the CPU, but not at head dim 8
    assert str(ck) in err(script, ["--ckpt", ck, "--data", data, "--attn_impl", "triton"])
    monkeypatch.delenv("TRITON_INTERPRET")  # a checkpoint trained on the kernel, on the CPU:
    tri = save(tiny(0, pos_emb="pope", n_embd=64, attn_impl="triton"), tmp_path / "tri.pt")
    assert "--attn_impl" in err(script, ["--ckpt", tri, "--data", data, *FEW[script]])
    main(script, ["--ckpt", tri, "--data", data, *FEW[script], "--attn_impl", "torch"])
