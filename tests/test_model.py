"""PoPE/RoPE/YaRN against float64 references written from the formulas, the δ bounds, causality,
optimizer groups, the FLOP count, the attention rule (decoding: test_decode.py). Every random input
is seeded."""
import math

import pytest
import torch
from helpers import pope_magnitude_f64, rel_err

from model import (GPT, GPTConfig, KVCache, apply_rope, pope_attention_torch, pope_delta,
                   rope_cos_sin, use_pope_kernel, yarn_inv_freq)


def pope_loop_f64(q, k, v, delta, causal=True, q_offset=0, base=10000.0):
    """softmax_s((1/sqrt(D)) sum_c mu_q mu_k cos((s - t) theta_c + delta_c)) v, one (t, s) at a
    time; mu by model.pope_magnitude (the one definition), the rest written out here."""
    q, k, v, delta = (x.double() for x in (q, k, v, delta))
    (B, H, Tq, D), Tk = q.shape, k.size(2)
    theta = torch.tensor([base ** (-c / D) for c in range(D)], dtype=torch.float64)
    mq, mk = pope_magnitude_f64(q), pope_magnitude_f64(k)
    out = torch.zeros(B, H, Tq, D, dtype=torch.float64)
    for i in range(Tq):
        t = q_offset + i
        a = torch.full((B, H, Tk), -math.inf, dtype=torch.float64)
        for s in range(Tk if not causal else min(t + 1, Tk)):
            a[:, :, s] = (mq[:, :, i] * mk[:, :, s] * torch.cos((s - t) * theta + delta)).sum(-1)
        a = a / math.sqrt(D)
        out[:, :, i] = torch.einsum("bhs,bhsd->bhd", torch.softmax(a, -1), v)
    return out


@pytest.mark.parametrize("bound", ["wrap", "clamp"])
@pytest.mark.parametrize("Tq,Tk,q_offset,causal,seed", [(7, 7, 0, True, 1), (3, 9, 6, True, 2),
                                                        (1, 5, 4, True, 3), (2, 6, 1, True, 4),
                                                        (5, 8, 0, False, 5)])
def test_pope_attention_matches_the_loop(Tq, Tk, q_offset, causal, seed, bound):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 2, 8
    q, k, v = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk))
    delta = torch.empty(H, D).uniform_(-8.0, 2.0, generator=g)  # partly outside [-2pi, 0]
    # (wrap: cos is 2pi-periodic)
    used = delta if bound == "wrap" else delta.double().clamp(-2 * math.pi, 0)
    ref = pope_loop_f64(q, k, v, used, causal, q_offset)
    for dt, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        out = pope_attention_torch(q.to(dt), k.to(dt), v.to(dt), pope_delta(delta.to(dt), bound),
                                   causal=causal, q_offset=q_offset)
        err = rel_err(out, ref)
        assert out.dtype == dt and err < tol, f"seed {seed} {dt}: out rel err {err:.1e}"


def test_pope_gradients_and_the_model_layer_match_the_loop():
    """gradcheck of the PyTorch path; a PoPE layer (uncached, and on a KVCache) equals the loop
    reference."""
    torch.manual_seed(seed := 6)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    delta = torch.empty(2, 4, dtype=torch.float64).uniform_(-6.0, -0.3).requires_grad_()
    torch.autograd.gradcheck(lambda *a: pope_attention_torch(*a), (q, k, v, delta))
    model = tiny("pope", n_layer=1)
    attn, (B, T, H, D) = model.transformer.h[0].attn, (2, 7, 2, 16)
    x = torch.randn(B, T, 32, dtype=torch.float64)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in attn.c_attn(x).split(32, dim=2))
    want = attn.c_proj(pope_loop_f64(q, k, v, attn.delta).transpose(1, 2).reshape(B, T, 32))
    with torch.no_grad():
        assert rel_err(attn(x), want) < 1e-12, f"seed {seed}: the layer's output, uncached"
        cache = KVCache(model, B, 10, torch.float64)
        cache.start(T)
        assert rel_err(attn(x, cache), want) < 1e-12, (
            f"seed {seed}: the layer's output on a KVCache")


@pytest.mark.parametrize("bound", ["wrap", "clamp", "project"])
def test_delta_from_zero_init_keeps_learning(bound):
    """20 AdamW steps from delta = 0: wrap (the default) and project keep a gradient on every entry
    at every step, the clamp does not (entries pushed above 0 get none); the delta used stays in
    [-2pi, 0]."""
    torch.manual_seed(seed := 0)
    model = tiny("pope", n_layer=1, pope_delta_init="zero", pope_delta_bound=bound).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    delta = model.transformer.h[0].attn.delta
    idx = torch.randint(0, 37, (8, 17))
    live = []  # the share of delta's entries with a nonzero gradient, per step
    for _ in range(20):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        live.append((delta.grad != 0).float().mean().item())
        opt.step()
        # what train.py does after each step (a no-op unless bound="project")
        model.project_delta_()
    used = pope_delta(delta.detach(), bound)
    assert used.min().item() >= -2 * math.pi and used.max().item() <= 0.0, f"seed {seed}"
    assert delta.detach().abs().max().item() > 1e-3, f"seed {seed}: delta never moved"
    assert (live[-1] < 0.5) if bound == "clamp" else min(live) == 1.0, f"seed {seed}: {live}"
    if bound == "wrap":  # the same phase as the raw parameter
        torch.testing.assert_close(torch.polar(torch.ones_like(used), used),
                                   torch.polar(torch.ones_like(used), delta.detach()),
                                   atol=1e-5, rtol=0)


def test_rope_matches_complex_rotation():
    torch.manual_seed(7)
    B, H, T, D = 2, 3, 6, 8
    x = torch.randn(B, H, T, D, dtype=torch.float64)
    inv_freq = torch.tensor([10000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    out = apply_rope(x, *rope_cos_sin(inv_freq.float(), torch.arange(3, 3 + T)))
    # textbook: pair (x_i, x_{i+D/2}) as a complex number, multiplied by e^{i t theta_i}
    z = torch.complex(x[..., : D // 2], x[..., D // 2:])
    z = z * torch.exp(1j * torch.arange(3, 3 + T, dtype=torch.float64)[:, None] * inv_freq[None, :])
    # angles in float32
    assert (out - torch.cat([z.real, z.imag], -1)).abs().max().item() < 1e-5, "seed 7"


def tiny(pos_emb, **kw):
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=37, pos_emb=pos_emb,
               pope_delta_init="uniform", attn_impl="torch")
    return GPT(GPTConfig(**{**cfg, **kw})).double().eval()


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_causality(pos_emb):
    torch.manual_seed(9)
    model = tiny(pos_emb)
    idx = torch.randint(0, 37, (2, 12))
    logits, _ = model(idx, idx)
    for t in (0, 5, 10):
        idx2 = idx.clone()
        idx2[:, t + 1] = (idx2[:, t + 1] + 1) % 37
        logits2, _ = model(idx2, idx2)
        assert torch.equal(logits[:, : t + 1], logits2[:, : t + 1])
        assert not torch.allclose(logits[:, t + 1], logits2[:, t + 1])


def test_delta_init_and_optimizer_groups():
    torch.manual_seed(10)
    m = tiny("pope", pope_delta_init="uniform")
    d = m.transformer.h[0].attn.delta
    assert d.shape == (2, 16) and (d <= 0).all() and (d >= -2 * math.pi).all() and d.std() > 0.5
    assert (tiny("pope", pope_delta_init="zero").transformer.h[0].attn.delta == 0).all()
    opt = m.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert id(d) not in decayed and id(m.transformer.h[0].ln_1.weight) not in decayed
    assert id(m.transformer.h[0].attn.c_attn.weight) in decayed
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == m.get_num_params()


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_flops_per_token_is_what_a_training_step_runs(pos_emb):
    """flops_per_token against PyTorch's FLOP counter over one forward and backward (SDPA's math
    backend); nanoGPT's 6N also counts the parameters no matmul multiplies by (norms, delta):
    elementwise here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(11)
    model, (B, T) = tiny(pos_emb).train(), (3, 16)
    idx = torch.randint(0, 37, (B, T))
    with FlopCounterMode(display=False) as counter, sdpa_kernel([SDPBackend.MATH]):
        model(idx, idx)[1].backward()
    elementwise = sum(p.numel() for n, p in model.named_parameters()
                      if p.dim() == 1 or n.endswith("delta"))
    assert model.flops_per_token(T) == counter.get_total_flops() / (B * T) + 6 * elementwise


@pytest.mark.parametrize("key,value", [
    ("pos_emb", "alibi"),
    ("attn_impl", "cuda"),
    ("pope_delta_bound", "x"),
    ("n_embd", 100),
    ("rope_scaling", 0.5),
])
def test_bad_config_is_rejected_naming_the_key(key, value):
    with pytest.raises(ValueError) as e:
        GPTConfig(**{key: value, "n_head": 3 if key == "n_embd" else 12})
    assert key in str(e.value)


def test_which_attention_runs_on_the_cpu():
    """use_pope_kernel, the one rule: the PyTorch path for 'torch' and for 'auto' off CUDA, whatever
    the length or torch.compile; the log line (attention_path) and the cache follow it."""
    q = torch.zeros(1, 2, 4, 16)
    for impl in ("torch", "auto"):
        for compiled, T in ((False, 16), (True, 4096)):
            assert not use_pope_kernel(impl, q, q, q, q[0, :, 0], compiled=compiled)[0]
            path = tiny("pope", attn_impl=impl).attention_path(compiled=compiled, T=T)
            assert "PyTorch path" in path
    assert not KVCache(tiny("pope", attn_impl="auto"), 1, 8, torch.float32).kernel


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_kv_cache_nbytes_is_what_it_allocates(pos_emb):
    """sample.py's RAM check counts the cache with KVCache.nbytes: it must match the tensors."""
    model = tiny(pos_emb, n_layer=3)
    cache = KVCache(model, 2, 12, torch.bfloat16)
    allocated = sum(t.numel() * t.element_size() for t in [*cache.k, *cache.v])
    assert KVCache.nbytes(model.config, 2, 12, 2) == allocated


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
@pytest.mark.parametrize("size,n_layer,n_head,n_embd", [(124, 12, 12, 768), (253, 16, 16, 1024),
                                                       (774, 36, 20, 1280)])
def test_the_papers_openwebtext_sizes(size, n_layer, n_head, n_embd, pos_emb):
    with torch.device("meta"):
        m = GPT(GPTConfig(pos_emb=pos_emb, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
    assert abs(m.get_num_params() / 1e6 - size) / size < 0.005, m.get_num_params()


@pytest.mark.parametrize("s,L0,D,low,high", [(4.0, 512, 64, 3, 16), (8.0, 1024, 128, 11, 36),
                                             (4.0, 1024, 64, 5, 18)])
def test_yarn_is_the_published_form(s, L0, D, low, high):
    """YaRN as its reference code and Hugging Face compute it, the range by hand:
    d(b) = D ln(L0 / (2 pi b)) / (2 ln 10000), low = floor(d(32)), high = ceil(d(1)); pairs below
    low keep theta, from high on theta / s, a linear ramp between; logits scale by
    (0.1 ln s + 1)^2."""
    inv, mscale = yarn_inv_freq(D, 10000.0, s, L0)
    assert inv.shape == (D // 2,) and inv.dtype == torch.float32
    theta = torch.tensor([10000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    for i in range(D // 2):
        want = theta[i] * (1 - (ramp := min(max((i - low) / (high - low), 0.0), 1.0)) + ramp / s)
        assert abs(inv[i].item() - want.item()) <= 1e-6 * want.item(), (
            i, inv[i].item(), want.item())
    assert inv[low - 1].item() == pytest.approx(theta[low - 1].item(), rel=1e-6)
    assert inv[high].item() == pytest.approx(theta[high].item() / s, rel=1e-6)
    assert mscale == pytest.approx(1 + 0.1 * math.log(s))
    assert torch.equal(yarn_inv_freq(D, 10000.0, 1.0, L0)[0], theta.float())  # s = 1: plain RoPE
    if (s, L0, D) == (4.0, 1024, 64):  # by hand: theta_i * (1 - gamma_i * 3/4)
        hand = {0: 1.0, 5: 0.237137, 6: 0.167569, 10: 0.0400127, 17: 0.00230737, 18: 0.00140585,
                31: 3.33380e-5}
        assert all(math.isclose(inv[i].item(), v, rel_tol=2e-5) for i, v in hand.items()), inv
        assert math.isclose(mscale, 1.1386294, rel_tol=1e-7)
    # the layers hold it: from the config
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=2 * D, block_size=2 * L0, vocab_size=8,
                          pos_emb="rope", rope_scaling=s, rope_scaling_orig_len=L0))
    attn = model.transformer.h[0].attn
    assert torch.equal(attn.inv_freq, inv) and math.isclose(attn.scale, mscale ** 2 / math.sqrt(D))
    model.set_rope_scaling(1.0)
    assert torch.equal(attn.inv_freq, theta.float()) and attn.scale == 1 / math.sqrt(D)
    with pytest.raises(ValueError):  # PoPE has no YaRN
        GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                      pos_emb="pope")).set_rope_scaling(2.0)
