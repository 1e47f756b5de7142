"""Decoding (model.generate, KVCache, sample_next, sample.py) against the uncached model in float64:
every cached logit equals a fresh forward over the whole sequence at the same absolute positions,
greedy tokens equal recomputation. The CUDA graph: tests/test_gpu.py. Every random draw seeded."""
import importlib
import os

import pytest
import torch
from helpers import large_weights_, pope_magnitude_f64, rel_err, run_here

import model as model_lib
from model import GPT, GPTConfig, KVCache, sample_next

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(pos_emb, **kw):  # (its weights drawn from the caller's seeded generator)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=37, pos_emb=pos_emb,
               pope_delta_init="uniform", attn_impl="torch")  # uniform: delta far from 0
    return large_weights_(GPT(GPTConfig(**{**cfg, **kw})).double().eval())


@torch.no_grad()
def cached_vs_uncached(model, idx, steps, cache):
    """Prefill idx, then random tokens one at a time through the cache: the largest relative error
    of each forward's last logits against the uncached forward over the whole sequence (positions
    0..len-1)."""
    seq, logits = idx, model(idx, cache=cache)[0]
    worst = rel_err(logits[:, -1], model(seq)[0][:, -1])
    for _ in range(steps):
        tok = torch.randint(0, 37, (idx.size(0), 1))
        seq, logits = torch.cat([seq, tok], 1), model(tok, cache=cache)[0]
        worst = max(worst, rel_err(logits[:, -1], model(seq)[0][:, -1]))
    return worst


@torch.no_grad()
def greedy_recompute(model, idx, n, window):
    for _ in range(n):
        idx = torch.cat([idx, model(idx[:, -window:])[0][:, -1].argmax(-1, keepdim=True)], 1)
    return idx


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_cached_decoding_equals_recompute(pos_emb):
    """A cache of 48 slots (block_size 16; the slots past pos hold large junk, masked): prefill and
    one-token steps up to position 44 give the uncached logits. Greedy generate() equals recomputing
    past block_size (context 48) and past the context (each token from the last 12, at positions
    0..), and a batch of prompts decodes as each alone. PoPE's cache holds the keys' magnitudes
    alone (model.pope_magnitude)."""
    torch.manual_seed(seed := 101)
    model, idx = tiny(pos_emb), torch.randint(0, 37, (3, 10))
    cache = KVCache(model, 3, 48, torch.float64)
    for t in cache.k + cache.v:
        t.normal_(0, 100.0)
    worst = cached_vs_uncached(model, idx, 34, cache)
    assert worst < 1e-10 and int(cache.pos) == 44, f"seed {seed}: cached logits rel err {worst:.1e}"
    if pos_emb == "pope":  # layer 0's keys as written
        with torch.no_grad():
            k = model.transformer.h[0].attn.c_attn(
                model.transformer.h[0].ln_1(model.transformer.wte(idx)))
        want = pope_magnitude_f64(k.split(32, dim=2)[1].view(3, 10, 2, 16).transpose(1, 2))
        assert cache.k[0].shape == (3, 2, 48, 16), tuple(cache.k[0].shape)
        err = rel_err(cache.k[0][:, :, :10], want)
        assert err < 1e-14, f"seed {seed}: layer 0's cached keys rel err {err:.1e}"
    for n, context in ((38, 48), (20, 12)):
        out = model.generate(idx, n, temperature=0.0, context=context)
        assert torch.equal(out, greedy_recompute(model, idx, n, context)), (
            f"seed {seed}, context {context}")
    alone = torch.cat([model.generate(p[None], 20, top_k=1, context=12) for p in idx])
    assert torch.equal(out, alone), f"seed {seed}"


def test_pope_magnitudes_have_one_definition(monkeypatch):
    """model.pope_magnitude replaced by a variant made from whatever it is now (2 mu + 0.1, so that
    this holds for a forker's variant too): the uncached forward changes, and the cached prefill and
    steps follow it (they equal the uncached forward)."""
    torch.manual_seed(seed := 103)
    model, idx, current = tiny("pope"), torch.randint(0, 37, (2, 6)), model_lib.pope_magnitude

    def variant(x):
        return 2.0 * current(x) + 0.1
    with torch.no_grad():
        before = model(idx)[0]
        monkeypatch.setattr(model_lib, "pope_magnitude", variant)
        assert rel_err(model(idx)[0], before) > 1e-3, f"seed {seed}: the patch changed nothing"
    worst = cached_vs_uncached(model, idx, 6, KVCache(model, 2, 16, torch.float64))
    assert worst < 1e-10, f"seed {seed}: cached logits rel err {worst:.1e} under the variant"


def test_cache_dtype_follows_autocast(monkeypatch):
    torch.manual_seed(0)
    seen, real = [], KVCache.__init__
    monkeypatch.setattr(KVCache, "__init__",
                        lambda self, *a: real(self, *a) or seen.append(self.k[0].dtype))
    model = tiny("pope").float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 3, top_k=1)
    model.generate(torch.zeros(1, 3, dtype=torch.long), 3, top_k=1)
    assert seen == [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("top_k", [4, None])
def test_sampling_draws_from_the_tempered_top_k_softmax_of_the_real_ids(top_k):
    """40,000 draws from 6 logits at temperature 0.7, vocab_size 5, top_k 4 or none: each id's
    frequency within 5 standard errors of softmax(logits / 0.7) over the top_k largest real ids; the
    others never. A model whose padding rows (37 of 64) are the likeliest never draws them."""
    torch.manual_seed(seed := 1000 + (top_k or 0))
    logits, n = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.9, 9.0]]), 40000
    ids = sample_next(logits.repeat(n, 1), temperature=0.7, top_k=top_k, vocab_size=5)[:, 0]
    counts, p = torch.bincount(ids, minlength=6).double() / n, torch.zeros(6, dtype=torch.float64)
    keep = [0, 1, 3, 4] if top_k else [0, 1, 2, 3, 4]  # the top_k largest among ids < 5
    p[keep] = torch.softmax(logits[0, keep].double() / 0.7, 0)
    assert counts[5] == 0 and (top_k is None or counts[2] == 0), (seed, counts)
    assert ((counts - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12).all(), (seed, counts, p)
    assert torch.equal(sample_next(logits, temperature=0.0, vocab_size=5), torch.tensor([[3]]))
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                          attn_impl="torch"))
    with torch.no_grad():
        model.lm_head.weight[37:] += 5.0
    out = model.eval().generate(torch.zeros(4, 1, dtype=torch.long), 300, temperature=2.0,
                                top_k=top_k, vocab_size=37, context=301)
    assert out.max().item() < 37, f"seed {seed}"


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_bf16_weights_keep_the_phases_in_float32_and_decode_near_float32(pos_emb):
    """cast_weights_(bf16), sample.py's default on CUDA: the weights become bf16, PoPE's delta and
    theta and RoPE's inv_freq stay float32 (in bf16 a phase at position 1,000 is off by radians); a
    cached step at position 1,099 is within 3e-2 of the float32 model's uncached logits (measured
    6e-3 / 9e-3)."""
    torch.manual_seed(seed := 108)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=1200, vocab_size=64,
                      pos_emb=pos_emb, attn_impl="torch", pope_delta_init="uniform")).eval()
    large_weights_(m, 0.1)
    with torch.no_grad():
        idx = torch.randint(0, 64, (2, 1100))
        ref = m(idx)[0][:, -1]
        m.cast_weights_(torch.bfloat16)
        phases = [t for b in m.transformer.h
                  for t in ((b.attn.delta, b.attn.theta) if pos_emb == "pope"
                            else (b.attn.inv_freq,))]
        assert all(t.dtype == torch.float32 for t in phases), seed
        assert all(p.dtype == torch.bfloat16
                   for n, p in m.named_parameters() if not n.endswith("delta"))
        cache = KVCache(m, 2, 1100, m.lm_head.weight.dtype)
        m(idx[:, :-1], cache=cache)
        out = m(idx[:, -1:], cache=cache)[0][:, -1]
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 3e-2, (seed, rel_err(out, ref))


def save_ckpt(model, path, meta):  # a checkpoint as sample.py reads it
    args = {k: getattr(model.config, k)
            for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}
    torch.save({"model": model.state_dict(), "model_args": args, "config": {}, "meta": meta}, path)


def test_sample_py_crops_a_long_prompt_and_refuses_bad_options(tmp_path):
    """sample.py (--device=cpu, also where a GPU is visible): a prompt longer than --context keeps
    its last tokens; a bad option or missing file: exit 1 or 2 with one line naming it."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20))
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": 20, "itos": [chr(97 + i) for i in range(20)]})
    cmd = [os.path.join(ROOT, "sample.py"), "--ckpt=ckpt.pt", "--num_samples=2", "--temperature=0",
           "--device=cpu"]
    p = run_here(cmd + ["--start=abcdefghijklmnopqrst", "--context=12", "--max_new_tokens=3"],
                 tmp_path)
    samples = [s.strip() for s in p.stdout.split("---------------") if s.strip()]
    assert len(samples) == 2 and all(s.startswith("ijklmnopqrst") and len(s) == 15
                                     for s in samples), samples
    cases = (
        (["--decode=graph"], "--decode"),
        (["--ckpt=nope.pt"], "nope.pt"),
        (["--start=FILE:nope.txt"], "nope.txt"),
        (["--temperature=inf"], "--temperature"),
        (["--top_k=0"], "--top_k"),
        (["--max_new_tokens=0"], "--max_new_tokens"),
    )
    for args, named in cases:
        p = run_here(cmd + args, tmp_path, check=False)
        assert (p.returncode in (1, 2) and len(p.stderr.strip().splitlines()) == 1
                and named in p.stderr), args


# GPT.generate as it is, what(model, idx) appended at each call
def spy_generate(monkeypatch, what):
    seen, generate = [], GPT.generate

    def spy(self, idx, *a, **k):
        seen.append(what(self, idx))
        return generate(self, idx, *a, **k)
    monkeypatch.setattr(GPT, "generate", spy)
    return seen


@pytest.mark.parametrize("dtype", ["bfloat16", "autocast"])
def test_sample_py_dtype(dtype, tmp_path, capsys, monkeypatch):
    """--dtype on the CPU: bfloat16 decodes a model whose weights are bf16 (delta float32), autocast
    one whose weights stay float32 under bf16 autocast; the greedy tokens are those of the float32
    run."""
    import sample
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20,
                      attn_impl="torch"))
    large_weights_(m, 0.5)  # logits far apart, so bf16 rounding cannot flip a greedy token
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": 20, "itos": [chr(97 + i) for i in range(20)]})
    seen = spy_generate(monkeypatch, lambda model, idx: (model.lm_head.weight.dtype,
                                                         model.transformer.h[0].attn.delta.dtype,
                                                         torch.is_autocast_enabled("cpu")))
    base = [f"--ckpt={tmp_path / 'ckpt.pt'}", "--device=cpu", "--num_samples=1",
            "--max_new_tokens=6", "--temperature=0", "--start=abcd"]
    sample.main(base)
    ref = capsys.readouterr().out
    sample.main(base + [f"--dtype={dtype}"])
    want = (torch.bfloat16, torch.float32, False) if dtype == "bfloat16" else \
        (torch.float32, torch.float32, True)
    assert (seen == [(torch.float32, torch.float32, False), want]
            and capsys.readouterr().out == ref), seen


# format: (vocab size, meta itos or None, its start id, a prompt, the ids sample.py gives it)
FORMATS = {
    "jsb": (90, None, 0, "<s> C5 G4", [0, 72 - 19, 67 - 19]),
    "maestro": (8, ["PAD_None", "BOS_None", "EOS_None", "Bar_None", "Pitch_60", "Velocity_63",
                    "Duration_1.0.8", "Position_0"], 1, "BOS_None Bar_None Pitch_60", [1, 3, 4]),
    # the prompt's contig stays open: 6-mer ACGTAC, then single nucleotides G and T, no <eos>
    "genome": (4107, None, 4, "ACGTACGT\n", [6 + int("012301", 4), 4102 + 2, 4102 + 3]),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_sample_py_prompts_a_prepared_format_with_its_own_start(fmt, tmp_path, monkeypatch, capsys):
    """Without --start the prompt is the format's start of a piece (JSB's <s>, MAESTRO's BOS,
    genome's <eos> before a new contig); a given prompt is encoded in the format; a genome prompt
    with no A/C/G/T: exit."""
    import sample
    V, itos, start_id, prompt, want = FORMATS[fmt]
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=V,
                      attn_impl="torch"))
    # (as prepare/<fmt>.py writes meta.json)
    itos = itos or importlib.import_module("prepare." + fmt).ITOS
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": V, "format": fmt, "itos": itos})
    prompts = spy_generate(monkeypatch, lambda model, idx: idx.tolist())
    base = [f"--ckpt={tmp_path / 'ckpt.pt'}", "--device=cpu", "--num_samples=1",
            "--max_new_tokens=3"]
    sample.main(base)
    sample.main(base + [f"--start={prompt}"])
    assert prompts == [[[start_id]], [want]], (fmt, prompts)
    assert capsys.readouterr().out.count("---------------") == 2
    if fmt == "genome":
        with pytest.raises(SystemExit) as e:
            sample.main(base + ["--start=hello"])
        assert "--start" in str(e.value.code)
