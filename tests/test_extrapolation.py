"""eval_extrapolation.py, prepare.common.read_tokens (the eval scripts' reader) and
config/finetune_long.py on the CPU: tiny PoPE / RoPE checkpoints trained by train.py (in this
process, helpers.run_here) on a Tiny Shakespeare slice (characters, block_size 32); every scored
number against a float64 recomputation from the documented windows. What both eval scripts share
(attn_impl, outputs, refusals): test_frequencies.py."""

import json
import math
import os
import sys
import types

import numpy as np
import pytest
import torch

import eval_extrapolation as ex
from helpers import run_here, script_error
from model import load_checkpoint
from prepare import openwebtext as owt
from prepare.common import PrepareError, codec, read_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 32
READER_META = {"vocab_size": 4, "dtype": "uint16", "tokenizer": "itos", "itos": list("ab\nc"),
               "tokens": {"val": 100}, "prepare": "python prepare/x.py"}  # (read_tokens' tests)


def run_train(args, cwd):
    run_here([os.path.join(ROOT, "train.py"), *args], cwd)


@pytest.fixture(scope="module")
def env(tmp_path_factory, shared_data):
    """A char-level dataset (data/shk) and tiny PoPE and RoPE checkpoints trained by train.py."""
    root = tmp_path_factory.mktemp("extrap")
    path = shared_data / "text" / "english" / "tinyshakespeare.txt"
    text = path.read_text(encoding="utf-8")[:220_000]
    # the characters, sorted; each one's index
    itos, ids = np.unique(list(text), return_inverse=True)
    ids = ids.astype(np.uint16)
    d = root / "data" / "shk"
    d.mkdir(parents=True)
    ids[:200_000].tofile(d / "train.bin")
    ids[200_000:].tofile(d / "val.bin")
    meta = {"vocab_size": len(itos), "dtype": "uint16", "tokenizer": "itos", "itos": itos.tolist()}
    (d / "meta.json").write_text(json.dumps(meta))
    for pe in ("pope", "rope"):
        run_train(["--dataset=shk", f"--data_dir={root / 'data'}",
                   f"--out_dir={root / f'out-{pe}'}", f"--pos_emb={pe}", "--n_layer=2",
                   "--n_head=2", "--n_embd=32", f"--block_size={BLOCK}", "--device=cpu",
                   "--compile=False", "--batch_size=8", "--gradient_accumulation_steps=1",
                   "--max_iters=40", "--eval_interval=40", "--eval_iters=2", "--log_interval=100",
                   "--warmup_iters=5", "--lr_decay_iters=40", "--learning_rate=3e-3"], cwd=root)
    ckpts = {pe: str(root / f"out-{pe}" / "ckpt.pt") for pe in ("pope", "rope")}
    return types.SimpleNamespace(root=root, val=str(d / "val.bin"), meta=meta,
                                 val_ids=ids[200_000:], ckpts=ckpts)


def run_eval(args, tmp_path):
    """eval_extrapolation.py's result, as written to --json (and as main returns it)."""
    out = tmp_path / "r.json"
    res = ex.main([*map(str, args), "--json", str(out), "--no_progress", "--device", "cpu"])
    assert json.loads(out.read_text()) == res
    return res


def test_yarn_series_follow_the_scale_rule(env, tmp_path):
    """--yarn: s(L) = max(1, L / block_size), plain RoPE (bit for bit) up to the training length,
    stretched beyond with mscale = 0.1 ln s + 1; --yarn_scale 1: the plain series bit for bit at
    every length and position; --yarn_only drops the plain series."""
    Ls = ("16", "32", "64", "160")
    args = ["--ckpt", env.ckpts["rope"], "--data", env.val, "--lengths", ",".join(Ls),
            "--max_tokens", "320"]
    js = run_eval([*args, "--yarn"], tmp_path)
    plain, yarn = js["models"]["out-rope"], js["models"]["out-rope+YaRN"]
    assert [yarn["results"][L]["rope_scaling"] for L in Ls] == [1.0, 1.0, 2.0, 5.0]
    assert [plain["results"][L]["rope_scaling"] for L in Ls] == [1.0] * 4
    assert math.isclose(yarn["results"]["160"]["mscale"], 0.1 * math.log(5) + 1)
    assert yarn["results"]["32"]["nll"] == plain["results"]["32"]["nll"]
    assert yarn["results"]["64"]["nll"] != plain["results"]["64"]["nll"]
    js = run_eval([*args, "--yarn_scale", "1", "--yarn_only"], tmp_path)
    assert list(js["models"]) == ["out-rope+YaRN"]
    for L in Ls:
        assert [b["nll"] for b in js["models"]["out-rope+YaRN"]["results"][L]["buckets"]] == \
            [b["nll"] for b in plain["results"][L]["buckets"]]


def window_nll64(model, ids, L, B):
    """Per-token NLL of the documented windows at length L over targets t_1 .. t_B, in float64 from
    the formula logsumexp(z) - z_target: a list of (position in the window, nll) per scored
    token."""
    out = []
    for a in range(0, B, L):
        T = min(L, B - a)
        x, y = ids[a:a + T].view(1, T), ids[a + 1:a + T + 1].view(1, T)
        with torch.no_grad():
            z = model(x, y)[0][0].double()
        out += list(enumerate((torch.logsumexp(z, -1) - z.gather(-1, y.view(T, 1))[:, 0]).tolist()))
    return out


def test_nll_by_length_and_position_against_a_float64_reference(env, tmp_path):
    """The NLL at each length and its mean per position bucket, against per-token NLLs computed here
    in float64 from the documented windows: the PoPE and RoPE checkpoints in one run, B = 400 scored
    tokens at lengths 48 and 80 (48 ends in a short window of 16), buckets of 20 (the last of 48: 8
    positions)."""
    B = 400
    js = run_eval(["--ckpt", env.ckpts["pope"], env.ckpts["rope"], "--data", env.val,
                  "--lengths", "48,80", "--max_tokens", str(B), "--bucket_size", "20"], tmp_path)
    ids = torch.from_numpy(env.val_ids[:B + 1].astype(np.int64))
    for pe, ckpt in env.ckpts.items():
        m, model = js["models"][f"out-{pe}"], load_checkpoint(ckpt, device="cpu")[0]
        for L in (48, 80):
            ref, r = window_nll64(model, ids, L, B), m["results"][str(L)]
            assert abs(r["nll"] - sum(v for _, v in ref) / B) < 1e-5, (pe, L)
            assert math.isclose(r["ppl"], math.exp(r["nll"]))
            starts = range(0, L, 20)
            assert ([(b["start"], b["end"]) for b in r["buckets"]]
                    == [(a, min(a + 20, L)) for a in starts])
            for b in r["buckets"]:
                vals = [v for p, v in ref if b["start"] <= p < b["end"]]
                assert (b["tokens"] == len(vals)
                        and abs(b["nll"] - sum(vals) / len(vals)) < 1e-5), (pe, L, b)
            # trained, the buckets differ (little context in the first): a position mix-up shows
            assert np.ptp([b["nll"] for b in r["buckets"]]) > 0.01, (pe, L, r)
        assert [b["tokens"] for b in m["results"]["48"]["buckets"]] == [8 * 20 + 16, 8 * 20, 8 * 8]
        # the longest vs shortest
        change = 100 * (m["results"]["80"]["ppl"] / m["results"]["48"]["ppl"] - 1)
        assert m["ppl_change_pct"] == pytest.approx(change, rel=1e-12)


@pytest.mark.parametrize("lengths, cap, short, B", [
    (None, 320, False, 320),
    ("64,320", None, False, 19840),
    ("160,96", None, False, 19840),
    ("96,160", 400, False, 320),
    ("96,160", None, True, 320),
])
def test_every_length_scores_the_same_tokens(env, tmp_path, lengths, cap, short, B):
    """B, the scored tokens: the largest multiple of the longest length within the cap and the
    data's targets (20,000 tokens: 19,999; 400: 399); every length scores t_1 .. t_B, one that does
    not divide B ending in a shorter window (no least common multiple needed); the default lengths:
    the block size x 1..10."""
    data = env.val
    if short:
        (tmp_path / "short").mkdir()
        (tmp_path / "short" / "meta.json").write_text(json.dumps(env.meta))
        env.val_ids[:400].tofile(data := tmp_path / "short" / "val.bin")
    js = run_eval(["--ckpt", env.ckpts["pope"], "--data", data]
                  + (["--lengths", lengths] if lengths else [])
                  + (["--max_tokens", cap] if cap else []), tmp_path)
    Ls = sorted(map(int, lengths.split(","))) if lengths else [BLOCK * k for k in range(1, 11)]
    assert js["lengths"] == Ls
    assert js["models"]["out-pope"]["max_tokens"] == B and js["bucket_size"] == BLOCK
    for L in js["lengths"]:
        r = js["models"]["out-pope"]["results"][str(L)]
        assert (r["tokens"], r["windows"], r["short_window"]) == (B, *divmod(B, L)), (L, r)


def test_text_reads_as_its_tokens(tmp_path, shared_data, monkeypatch):
    """read_tokens on text: a .txt of a character vocabulary is its ids, .jsonl documents end in
    "\\n\\n" (the vocabulary has "\\n"); GPT-2 text read in chunks is tokenized as a whole, .jsonl
    documents end in <|endoftext|>; text for a vocabulary of multi-character tokens (JSB's) is
    refused naming the dataset's prepared split; tiktoken offline: an error naming
    TIKTOKEN_CACHE_DIR."""
    ids = np.random.default_rng(0).integers(0, 4, 500)
    (tmp_path / "t.txt").write_text("".join(READER_META["itos"][i] for i in ids))
    assert read_tokens(str(tmp_path / "t.txt"), READER_META, 10 ** 6).tolist() == ids.tolist()
    (tmp_path / "d.jsonl").write_text('{"text": "ab"}\n\n{"text": "c\\na"}\n')
    assert codec(READER_META)[1](
        read_tokens(str(tmp_path / "d.jsonl"), READER_META, 10 ** 6).tolist()) == "ab\n\nc\na\n\n"
    gpt2 = {"tokenizer": "gpt2", "vocab_size": 50304}
    enc = owt.encode  # training's tokenizer (prepare/openwebtext.py's)
    text = (shared_data / "text" / "english" / "webtext.txt").read_text(encoding="utf-8")[:60_000]
    # whitespace runs around newlines, a literal <|endoftext|> (text in training too)
    text += "\n  \nword \nX\n\n\nY <|endoftext|>Z"
    (tmp_path / "g.txt").write_text(text, encoding="utf-8")
    assert (read_tokens(str(tmp_path / "g.txt"), gpt2, 10 ** 9, chunk_chars=777).tolist()
            == enc(text))
    assert len(read_tokens(str(tmp_path / "g.txt"), gpt2, 100, chunk_chars=777)) == 100
    (tmp_path / "g.jsonl").write_text('{"text": "Hello world"}\n{"text": "Bye"}')
    assert read_tokens(str(tmp_path / "g.jsonl"), gpt2, 10 ** 6).tolist() == \
        enc("Hello world") + [50256] + enc("Bye") + [50256]
    jsb = {"vocab_size": 3, "dtype": "uint16", "tokenizer": "itos", "itos": ["<pad>", "N60", "SEP"]}
    with pytest.raises(PrepareError, match="data/jsb/val.bin"):
        read_tokens(str(tmp_path / "t.txt"), jsb, 100, "ck.pt", dataset="jsb")
    import tiktoken
    monkeypatch.setattr(tiktoken, "get_encoding",
                        lambda name: (_ for _ in ()).throw(ConnectionError()))
    with pytest.raises(PrepareError, match="TIKTOKEN_CACHE_DIR"):
        read_tokens(str(tmp_path / "g.txt"), gpt2, 100)


@pytest.mark.parametrize("name, meta, data, named", [
    ("nope.bin", {}, None, "nope.bin"),
    ("val.bin", None, None, "meta.json"),  # no meta.json beside the .bin
    # (check_dataset's other refusals: test_prepare_*)
    ("val.bin", {"dtype": "float32"}, None, "meta.json"),
    ("val.bin", {"tokenizer": "gpt2", "vocab_size": 50257}, None, "val.bin"),
    ("val_mask.bin", {}, bytes(100), "val.bin"),  # a mask (read as ids before), its split named
    ("val.md", {}, b"ab", "val.md"),
    ("val.txt", {}, b"ab\xff", "val.txt"),
    ("val.txt", {}, b"abd", "val.txt"),
    ("val.jsonl", {}, b'{"text": "ab"}\n\n{"text": ', "val.jsonl:3"),
    ("val.jsonl", {}, b'{"text": 3}', "val.jsonl:1"),
])
def test_read_tokens_refuses_bad_input(tmp_path, name, meta, data, named):
    """Each bad file is a PrepareError of one line naming the file, where numpy read floats,
    memmapped a cut file or read the wrong ids before; the good file reads as written."""
    d = tmp_path / "ds"
    d.mkdir()
    ids = np.arange(100, dtype=np.uint16) % 4
    (d / "val.bin").write_bytes(ids.tobytes())
    (d / "meta.json").write_text(json.dumps(READER_META))
    # the whole file
    assert np.array_equal(read_tokens(str(d / "val.bin"), READER_META, 10, "ck.pt"), ids)
    if data is not None:
        (d / name).write_bytes(data)
    if meta is None:
        (d / "meta.json").unlink()
    else:
        (d / "meta.json").write_text(json.dumps({**READER_META, **meta}))
    with pytest.raises(PrepareError) as e:
        read_tokens(str(d / name), READER_META, 10 ** 6, "ck.pt")
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_hf_source_through_datasets(env, tmp_path, monkeypatch):
    """hf:pg19 streams deepmind/pg19's test split through datasets.load_dataset (stubbed here);
    without the network, or without the datasets package, an error naming it (never a hang)."""
    calls, text = [], "".join(env.meta["itos"][i] for i in env.val_ids[:3000])

    def load_dataset(repo, split=None, streaming=False):
        calls.append((repo, split, streaming))
        return [{"text": text[:1500]}, {"text": text[1500:]}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    args = ["--ckpt", env.ckpts["pope"], "--data", "hf:pg19", "--lengths", "32"]
    js = run_eval([*args, "--max_tokens", "256"], tmp_path)
    assert js["models"]["out-pope"]["results"]["32"]["tokens"] == 256
    assert calls == [("deepmind/pg19", "test", True)]
    offline = types.SimpleNamespace(
        load_dataset=lambda *a, **k: (_ for _ in ()).throw(ConnectionError()))
    for module, named in ((offline, "deepmind/pg19"), (None, "datasets")):
        monkeypatch.setitem(sys.modules, "datasets", module)
        assert named in script_error(ex.main, [*args, "--no_progress", "--device", "cpu"])


def test_finetune_long_end_to_end(env, tmp_path):
    """config/finetune_long.py as the README runs it, 3 steps at context 128 from the tiny
    checkpoints (1 warmup step, a cosine to 0 over 4 steps: were the lr decayed, step 2 would show
    it). PoPE as it is, at the recipe's lr: half of 6e-5 in the warmup step, then 6e-5 with no
    decay. RoPE+YaRN (--rope_scaling=4.0, context 32 -> 128), then the eval: the checkpoint's own
    series keeps s = 4; --yarn uses max(4, L / 32)."""
    for pe, extra in (("pope", []), ("rope", ["--rope_scaling=4.0"])):
        run_train([os.path.join(ROOT, "config", "finetune_long.py"), f"--init_from={env.ckpts[pe]}",
                   "--dataset=shk", f"--data_dir={env.root / 'data'}", f"--out_dir={tmp_path / pe}",
                   "--device=cpu", "--block_size=128", "--batch_size=2",
                   "--gradient_accumulation_steps=1", "--max_iters=3", "--warmup_iters=1",
                   "--lr_decay_iters=4", "--min_lr=0.0", "--log_interval=1", "--eval_interval=3",
                   "--eval_iters=1", *extra], cwd=tmp_path)
        ck = torch.load(tmp_path / pe / "ckpt.pt", map_location="cpu", weights_only=True)
        ma = ck["model_args"]
        assert (ma["pos_emb"], ma["block_size"], ck["iter_num"], ma["rope_scaling"]) == \
            (pe, 128, 3, 4.0 if extra else 1.0)
    assert ma["rope_scaling_orig_len"] == BLOCK
    lines = (tmp_path / "pope" / "metrics.jsonl").read_text().splitlines()
    assert [r["lr"] for r in map(json.loads, lines) if "lr" in r] == [3e-5, 6e-5, 6e-5]
    js = run_eval(["--ckpt", tmp_path / "rope" / "ckpt.pt", "--data", env.val,
                  "--lengths", "32,128,256", "--max_tokens", "512", "--yarn"], tmp_path)
    plain, yarn = js["models"]["rope"], js["models"]["rope+YaRN"]
    assert ((plain["yarn"]["ckpt_scale"], plain["yarn"]["orig_len"], plain["block_size"])
            == (4.0, BLOCK, 128))
    assert [plain["results"][L]["rope_scaling"] for L in ("32", "128", "256")] == [4.0, 4.0, 4.0]
    assert [yarn["results"][L]["rope_scaling"] for L in ("32", "128", "256")] == [4.0, 4.0, 8.0]
    assert plain["results"]["128"]["nll"] == yarn["results"]["128"]["nll"]
    # a fine-tune of that YaRN checkpoint stays YaRN at its original length, s given or not
    for extra, scale in (([], 4.0), (["--rope_scaling=8.0"], 8.0)):
        out = tmp_path / f"again{scale}"
        run_train([os.path.join(ROOT, "config", "finetune_long.py"),
                   f"--init_from={tmp_path / 'rope' / 'ckpt.pt'}", "--dataset=shk",
                   f"--data_dir={env.root / 'data'}", f"--out_dir={out}", "--device=cpu",
                   "--block_size=128", "--batch_size=2", "--max_iters=1", "--eval_iters=1",
                   *extra], cwd=tmp_path)
        ma = torch.load(out / "ckpt.pt", map_location="cpu", weights_only=True)["model_args"]
        assert (ma["rope_scaling"], ma["rope_scaling_orig_len"]) == (scale, BLOCK)
