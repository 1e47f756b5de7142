"""Decoding (model.generate, KVCache, sample_next, sample.py) against the uncached
model: every cached logit is compared with a fresh forward over the whole
sequence at the same absolute positions, in float64. The CUDA graph itself is
captured only on a GPU: `python bench.py check` compares it with these eager
steps token for token."""
import importlib
import math
import os

import pytest
import torch
import torch.nn.functional as F
from helpers import large_weights_, rel_err, run_here

import model as model_lib
from model import GPT, GPTConfig, KVCache, sample_next

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(pos_emb, block_size=16, **kw):  # (its weights drawn from the caller's seeded generator)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=37, pos_emb=pos_emb,
               pope_delta_init="uniform", attn_impl="torch")  # uniform: delta far from 0
    cfg.update(kw)
    return large_weights_(GPT(GPTConfig(**cfg)).double().eval())


@torch.no_grad()
def cached_vs_uncached(model, idx, steps, context, cache=None):
    """Prefill idx, then feed random tokens one at a time through the cache: the
    largest relative error of each forward's last logits against the uncached
    forward over the whole sequence (positions 0..len-1)."""
    B = idx.size(0)
    cache = cache or KVCache(model, B, context, torch.float64)
    seq, worst = idx, 0.0
    logits, _ = model(idx, cache=cache)
    for i in range(steps + 1):
        ref, _ = model(seq)
        worst = max(worst, rel_err(logits[:, -1], ref[:, -1]))
        if i < steps:
            tok = torch.randint(0, 37, (B, 1))
            seq = torch.cat([seq, tok], 1)
            logits, _ = model(tok, cache=cache)
    return worst, cache


def greedy_recompute(model, idx, n, window):
    out = idx
    with torch.no_grad():
        for _ in range(n):
            logits, _ = model(out[:, -window:])
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], 1)
    return out


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_cached_decoding_equals_the_uncached_forward(pos_emb):
    """Prefill and one-token steps on the static cache give the uncached model's
    logits; generate()'s greedy tokens are those of recomputing from scratch. For
    PoPE the cache holds each key's magnitudes mu_k = softplus(k) alone (D numbers)."""
    torch.manual_seed(seed := 101)
    model = tiny(pos_emb)
    idx = torch.randint(0, 37, (2, 5))
    worst, cache = cached_vs_uncached(model, idx, 9, 16)
    assert worst < 1e-10, f"seed {seed}: {worst}"
    assert int(cache.pos) == 14
    out = model.generate(idx, 11, temperature=0.0)
    assert torch.equal(out, greedy_recompute(model, idx, 11, 16)), f"seed {seed}"
    if pos_emb == "pope":  # layer 0's keys as written, against pope_cartesian of its raw keys
        attn = model.transformer.h[0].attn
        with torch.no_grad():
            k = attn.c_attn(model.transformer.h[0].ln_1(model.transformer.wte(idx))).split(32, dim=2)[1]
            k = k.view(2, 5, 2, 16).transpose(1, 2)
            want = F.softplus(k)
        assert cache.k[0].shape == (2, 2, 16, 16), f"seed {seed}"
        assert rel_err(cache.k[0][:, :, :5], want) < 1e-14, f"seed {seed}"


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_decoding_past_block_size_equals_the_uncached_forward(pos_emb):
    """--context larger than block_size: positions count on (up to 44 here, block
    size 16) and every cached logit equals the uncached forward over the same
    absolute positions; greedy generate() equals recomputing without any crop."""
    torch.manual_seed(seed := 102)
    model = tiny(pos_emb)
    idx = torch.randint(0, 37, (2, 10))
    worst, cache = cached_vs_uncached(model, idx, 34, 48)
    assert worst < 1e-10 and int(cache.pos) == 44, f"seed {seed}: {worst}"
    out = model.generate(idx, 38, temperature=0.0, context=48)
    assert torch.equal(out, greedy_recompute(model, idx, 38, 48)), f"seed {seed}"


def test_pope_magnitudes_have_one_definition(monkeypatch):
    """A forker changes the magnitude in the PoPE section (softplus -> softplus^2):
    the cached prefill and steps follow it, and still equal the uncached forward."""
    torch.manual_seed(seed := 103)
    model = tiny("pope")
    idx = torch.randint(0, 37, (2, 6))
    with torch.no_grad():
        before = model(idx)[0]
    monkeypatch.setattr(model_lib, "pope_magnitude", lambda x: F.softplus(x) ** 2)
    with torch.no_grad():
        assert rel_err(model(idx)[0], before) > 1e-3, f"seed {seed}: the patch changed nothing"
    worst, _ = cached_vs_uncached(model, idx, 6, 16)
    assert worst < 1e-10, f"seed {seed}: cached decoding ignores pope_magnitude ({worst})"


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_static_cache_steps_equal_dynamic_forward(pos_emb):
    """The static cache attends over all its slots with a mask: slots past the
    position, filled here with large junk, change nothing. A cache of 64 slots
    gives the logits of one sized to the sequence and of the uncached forward,
    whose shapes grow at every step."""
    torch.manual_seed(seed := 104)
    model = tiny(pos_emb)
    idx = torch.randint(0, 37, (2, 4))
    big = KVCache(model, 2, 64, torch.float64)
    for t in big.k + big.v:
        t.normal_(0, 100.0)
    worst, _ = cached_vs_uncached(model, idx, 12, 64, cache=big)
    assert worst < 1e-10, f"seed {seed}: {worst}"
    torch.manual_seed(seed + 1)
    a = model.generate(idx, 12, temperature=0.0, context=64)
    b = model.generate(idx, 12, temperature=0.0, context=16)
    assert torch.equal(a, b), f"seed {seed}"


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_past_the_context_each_token_sees_the_last_context_tokens(pos_emb):
    """prompt + new tokens > context: the tokens past it are those of recomputing
    from the last `context` tokens at positions 0.. (the crop of the uncached model)."""
    torch.manual_seed(seed := 105)
    model = tiny(pos_emb)
    idx = torch.randint(0, 37, (3, 5))
    assert torch.equal(model.generate(idx, 20, top_k=1, context=12), greedy_recompute(model, idx, 20, 12)), \
        f"seed {seed}"


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_greedy_batched_samples_equal_single_ones(pos_emb):
    """Three different prompts in one batch decode as each does alone, past block_size."""
    torch.manual_seed(seed := 106)
    model = tiny(pos_emb)
    prompts = torch.randint(0, 37, (3, 4))
    batch = model.generate(prompts, 20, temperature=0.0, context=24)
    for row, prompt in zip(batch, prompts):
        alone = model.generate(prompt[None], 20, temperature=0.0, context=24)[0]
        assert torch.equal(row, alone), f"seed {seed}"


def test_prompt_longer_than_the_context_and_graphs_on_the_cpu_are_errors():
    torch.manual_seed(0)
    model = tiny("pope")
    with pytest.raises(ValueError):
        model.generate(torch.zeros(1, 9, dtype=torch.long), 2, context=8)
    for mode in ("graph", "compile", "fast"):
        with pytest.raises(ValueError):
            model.generate(torch.zeros(1, 3, dtype=torch.long), 2, mode=mode)


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_a_step_makes_the_per_cache_constants_once(pos_emb):
    """PoPE's theta and bounded delta are made once per cache: a one-token step runs no logspace or ceil
    (theta from float64, the wrapped delta); RoPE's rotation once for all layers (KVCache.start): a 3-layer
    model's step runs as many cos and sin as a 1-layer model's. On a GPU each such op is a kernel of the
    graph."""
    torch.manual_seed(0)
    from torch.profiler import ProfilerActivity, profile
    counts = []
    for n_layer in (1, 3):
        model = tiny(pos_emb, n_layer=n_layer)
        cache = KVCache(model, 2, 16, torch.float64)
        with torch.no_grad():
            model(torch.zeros(2, 4, dtype=torch.long), cache=cache)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
        names = [e.name for e in prof.events()]
        counts.append({op: names.count(f"aten::{op}") for op in ("cos", "sin", "logspace", "ceil")})
    assert counts[0]["cos"] >= 1 and (pos_emb == "pope" or counts[0] == counts[1]), counts
    assert counts[1]["logspace"] == counts[1]["ceil"] == 0, counts


def test_cache_dtype_follows_autocast(monkeypatch):
    torch.manual_seed(0)
    seen = []
    real = KVCache.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        seen.append((self.k[0].dtype, self.v[0].dtype))
    monkeypatch.setattr(KVCache, "__init__", spy)
    model = tiny("pope").float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.generate(torch.zeros(1, 3, dtype=torch.long), 3, top_k=1)
    model.generate(torch.zeros(1, 3, dtype=torch.long), 3, top_k=1)
    assert seen == [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]


def test_sampling_never_draws_padding_ids():
    """A padded vocabulary (64 rows, 37 real ids), random weights, temperature 2:
    no id >= the real vocabulary in 4 x 300 draws."""
    torch.manual_seed(seed := 107)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                          attn_impl="torch")).eval()
    with torch.no_grad():
        model.lm_head.weight[37:] += 5.0  # make the padding rows the likeliest
    out = model.generate(torch.zeros(4, 1, dtype=torch.long), 300, temperature=2.0, top_k=64, vocab_size=37,
                         context=301)
    assert out.max().item() < 37, f"seed {seed}"
    out = model.generate(torch.zeros(4, 1, dtype=torch.long), 20, temperature=0.0, vocab_size=37)
    assert out.max().item() < 37, f"seed {seed}"


@pytest.mark.parametrize("top_k", [4, None])
def test_sample_next_draws_from_the_tempered_top_k_softmax(top_k):
    """40,000 draws from 6 logits at temperature 0.7, vocab_size 5, top_k 4 or none:
    each id's frequency within 5 standard errors of softmax(logits / 0.7) over the
    top_k largest real ids (all 5 without top_k); the others are never drawn."""
    seed = 1000 + (top_k or 0)
    torch.manual_seed(seed)
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.9, 9.0]])
    n = 40000
    ids = sample_next(logits.repeat(n, 1), temperature=0.7, top_k=top_k, vocab_size=5)[:, 0]
    counts = torch.bincount(ids, minlength=6).double() / n
    p = torch.zeros(6, dtype=torch.float64)
    keep = [0, 1, 3, 4] if top_k else [0, 1, 2, 3, 4]  # the top_k largest among ids < 5
    p[keep] = torch.softmax(logits[0, keep].double() / 0.7, 0)
    sd = (p * (1 - p) / n).sqrt()
    assert counts[5] == 0 and (top_k is None or counts[2] == 0), (seed, counts)
    assert ((counts - p).abs() <= 5 * sd + 1e-12).all(), (seed, counts, p)
    assert torch.equal(sample_next(logits, temperature=0.0, vocab_size=5), torch.tensor([[3]]))


def save_ckpt(model, path, meta):
    """A checkpoint as sample.py reads it: the model's arguments, its weights and the data's meta."""
    args = {k: getattr(model.config, k)
            for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "pos_emb")}
    torch.save({"model": model.state_dict(), "model_args": args, "config": {}, "meta": meta}, path)


def spy_generate(monkeypatch, what):
    """GPT.generate as it is, appending what(model, idx) at each call to the list returned."""
    seen, generate = [], GPT.generate
    monkeypatch.setattr(GPT, "generate", lambda self, idx, *a, **k: (seen.append(what(self, idx)),
                                                                    generate(self, idx, *a, **k))[1])
    return seen


def test_sample_py_crops_a_long_prompt(tmp_path):
    """sample.py on the CPU (--device=cpu: also where a GPU is visible): a prompt longer than --context keeps
    its last tokens; --decode=graph on the CPU, a missing checkpoint or --start file: one line naming the
    fix."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20))
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": 20, "itos": [chr(97 + i) for i in range(20)]})
    cmd = [os.path.join(ROOT, "sample.py"), "--ckpt=ckpt.pt", "--num_samples=2", "--temperature=0",
           "--device=cpu"]
    p = run_here(cmd + ["--start=abcdefghijklmnopqrst", "--context=12", "--max_new_tokens=3"], tmp_path)
    samples = [s.strip() for s in p.stdout.split("---------------") if s.strip()]
    assert len(samples) == 2 and all(s.startswith("ijklmnopqrst") and len(s) == 15 for s in samples), samples
    for args, named in ((["--decode=graph"], "--decode"), (["--ckpt=nope.pt"], "nope.pt"),
                        (["--start=FILE:nope.txt"], "nope.txt"), (["--temperature=inf"], "--temperature"),
                        (["--top_k=0"], "--top_k"), (["--max_new_tokens=0"], "--max_new_tokens")):
        p = run_here(cmd + args, tmp_path, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode in (1, 2) and len(lines) == 1 and named in p.stderr, p.stderr


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_bf16_weights_keep_the_phases_in_float32_and_decode_near_float32(pos_emb):
    """cast_weights_(bf16), sample.py's default on CUDA: the matmuls', embedding's and norms' weights become
    bf16, PoPE's delta and theta and RoPE's inv_freq stay float32 (a phase is position x frequency: bf16 would
    be off by radians at position 1,000); a cached step at position 1,099 is within 3e-2 of the float32
    model's uncached logits (measured 6e-3 / 9e-3, PoPE / RoPE, torch 2.13 CPU)."""
    torch.manual_seed(seed := 108)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=1200, vocab_size=64, pos_emb=pos_emb,
                      attn_impl="torch", pope_delta_init="uniform")).eval()
    large_weights_(m, 0.1)
    with torch.no_grad():
        idx = torch.randint(0, 64, (2, 1100))
        ref = m(idx)[0][:, -1]
        m.cast_weights_(torch.bfloat16)
        phases = [t for b in m.transformer.h for t in ((b.attn.delta, b.attn.theta) if pos_emb == "pope"
                                                        else (b.attn.inv_freq,))]
        assert all(t.dtype == torch.float32 for t in phases), (seed, [t.dtype for t in phases])
        weights = [p for n, p in m.named_parameters() if not n.endswith("delta")]
        assert all(p.dtype == torch.bfloat16 for p in weights), seed
        cache = KVCache(m, 2, 1100, m.lm_head.weight.dtype)
        m(idx[:, :-1], cache=cache)
        out = m(idx[:, -1:], cache=cache)[0][:, -1]
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert out.dtype == torch.bfloat16 and err < 3e-2, (seed, err)


@pytest.mark.parametrize("dtype", ["bfloat16", "autocast"])
def test_sample_py_dtype(dtype, tmp_path, capsys, monkeypatch):
    """sample.py --dtype on the CPU: bfloat16 decodes a model whose weights are bf16 (delta float32), autocast
    one whose weights stay float32 under bf16 autocast; stderr names the setting; greedy tokens are those of
    the float32 run (a tiny model with clear margins)."""
    import sample
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20, attn_impl="torch"))
    large_weights_(m, 0.5)  # logits far apart, so bf16 rounding cannot flip a greedy token
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": 20, "itos": [chr(97 + i) for i in range(20)]})
    seen = spy_generate(monkeypatch, lambda model, idx: (model.lm_head.weight.dtype,
                                                         model.transformer.h[0].attn.delta.dtype,
                                                         torch.is_autocast_enabled("cpu")))
    base = [f"--ckpt={tmp_path / 'ckpt.pt'}", "--device=cpu", "--num_samples=1", "--max_new_tokens=6",
            "--temperature=0", "--start=abcd"]
    sample.main(base)
    ref = capsys.readouterr().out
    sample.main(base + [f"--dtype={dtype}"])
    out = capsys.readouterr().out
    want = (torch.bfloat16, torch.float32, False) if dtype == "bfloat16" else \
        (torch.float32, torch.float32, True)
    assert seen == [(torch.float32, torch.float32, False), want], seen
    assert out == ref, (out, ref)


FORMATS = {  # format: (vocab size, meta itos or None, its start id, a prompt, the ids sample.py gives it)
    "jsb": (90, None, 0, "<s> C5 G4", [0, 72 - 19, 67 - 19]),
    "maestro": (8, ["PAD_None", "BOS_None", "EOS_None", "Bar_None", "Pitch_60", "Velocity_63",
                    "Duration_1.0.8",
                    "Position_0"], 1, "BOS_None Bar_None Pitch_60", [1, 3, 4]),
    # the prompt's contig stays open: 6-mer ACGTAC, then G and T as single nucleotides, no <eos> after them
    "genome": (4107, None, 4, "ACGTACGT\n", [6 + int("012301", 4), 4102 + 2, 4102 + 3]),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_sample_py_prompts_a_prepared_format_with_its_own_start(fmt, tmp_path, monkeypatch, capsys):
    """sample.py on a checkpoint of a prepare/ format: without --start the prompt is the format's start of a
    piece (JSB's <s>, MAESTRO's BOS, genome's <eos> before a new contig), not a newline that encodes to
    nothing; a given prompt is encoded in the format, a genome prompt left open; a genome prompt with no
    A/C/G/T is a one-line error."""
    import sample
    V, itos, start_id, prompt, want = FORMATS[fmt]
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=V, attn_impl="torch"))
    itos = itos or importlib.import_module("prepare." + fmt).ITOS  # (as prepare/<fmt>.py writes meta.json)
    save_ckpt(m, tmp_path / "ckpt.pt", {"vocab_size": V, "format": fmt, "itos": itos})
    prompts = spy_generate(monkeypatch, lambda model, idx: idx.tolist())
    base = [f"--ckpt={tmp_path / 'ckpt.pt'}", "--device=cpu", "--num_samples=1", "--max_new_tokens=3"]
    sample.main(base)
    sample.main(base + [f"--start={prompt}"])
    assert prompts == [[[start_id]], [want]], (fmt, prompts)
    assert capsys.readouterr().out.count("---------------") == 2
    if fmt == "genome":
        with pytest.raises(SystemExit) as e:
            sample.main(base + ["--start=hello"])
        assert str(e.value.code).startswith("error:") and "--start" in str(e.value.code)


def test_the_model_attention_equals_the_loop_reference():
    """The PyTorch path the model runs for PoPE (pope_cartesian + one SDPA call,
    uncached and on the cache) equals a_ts = sum_c mu_q mu_k cos((s-t) theta_c +
    delta_c) / sqrt(D) computed one (t, s) at a time."""
    torch.manual_seed(seed := 109)
    model = tiny("pope", n_layer=1)
    attn = model.transformer.h[0].attn
    B, T, H, D = 2, 7, 2, 16
    x = torch.randn(B, T, 32, dtype=torch.float64)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
    theta = torch.tensor([10000.0 ** (-c / D) for c in range(D)], dtype=torch.float64)
    mq, mk, delta = F.softplus(q), F.softplus(k), attn.delta.detach()
    ref = torch.zeros(B, H, T, D, dtype=torch.float64)
    for t in range(T):
        for s in range(t + 1):
            a = (mq[:, :, t] * mk[:, :, s] * torch.cos((s - t) * theta + delta)).sum(-1) / math.sqrt(D)
            ref[:, :, t] += torch.exp(a)[..., None] * v[:, :, s]
        ref[:, :, t] /= sum(torch.exp((mq[:, :, t] * mk[:, :, s] * torch.cos((s - t) * theta + delta)).sum(-1)
                                      / math.sqrt(D)) for s in range(t + 1))[..., None]
    want = attn.c_proj(ref.transpose(1, 2).reshape(B, T, 32))
    with torch.no_grad():
        assert rel_err(attn(x), want) < 1e-12, f"seed {seed}"
        cache = KVCache(model, B, 10, torch.float64)
        cache.start(T)
        assert rel_err(attn(x, cache), want) < 1e-12, f"seed {seed}"


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_the_attention_takes_q_k_v_as_c_attn_splits_them(pos_emb, monkeypatch):
    """q, k (as the probes see them) and v (as KVCache.attend gets it) are c_attn's output split into thirds,
    each viewed per head (B, H, T, D): bitwise, with those strides (eval_frequencies.py reads the probes; the
    kernel takes any), for a prefill and a one-token step."""
    torch.manual_seed(0)
    model = tiny(pos_emb, n_layer=1)
    attn, seen = model.transformer.h[0].attn, {}
    attn.q_probe.register_forward_hook(lambda m, i, o: seen.__setitem__("q", o))
    attn.k_probe.register_forward_hook(lambda m, i, o: seen.__setitem__("k", o))
    real = KVCache.attend
    monkeypatch.setattr(KVCache, "attend", lambda self, layer, q, k, v, s: seen.__setitem__("v", v) or
                        real(self, layer, q, k, v, s))
    attn.c_attn.register_forward_hook(lambda m, i, o: seen.__setitem__("qkv", o))
    cache = KVCache(model, 2, 16, torch.float64)
    with torch.no_grad():
        for T in (5, 1):
            model(torch.randint(0, 37, (2, T), generator=torch.Generator().manual_seed(T)), cache=cache)
            want = [t.view(2, T, 2, 16).transpose(1, 2) for t in seen["qkv"].split(32, dim=2)]
            for name, w in zip("qkv", want):  # (the strides of dims of size > 1: a size-1 dim's is arbitrary)
                strides = [[s for s, n in zip(t.stride(), t.shape) if n > 1] for t in (seen[name], w)]
                assert torch.equal(seen[name], w) and strides[0] == strides[1], (pos_emb, T, name, strides)
