"""PoPE/RoPE attention against float64 references written from the formulas,
relative-position invariance, causality, optimizer groups, the FLOP count
(decoding: test_decode.py). Every random input is seeded; failures name the seed."""
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err

from model import (GPT, GPTConfig, apply_rope, pope_attention_torch, pope_cartesian, pope_cos_sin, pope_delta,
                   pope_frequencies, rope_cos_sin, use_pope_kernel, yarn_inv_freq)


def pope_attention_reference(q, k, v, delta, bound="wrap", **kw):  # what the model runs: delta bounded first
    return pope_attention_torch(q, k, v, pope_delta(delta, bound), **kw)


def pope_loop_f64(q, k, v, delta, causal, q_offset, base=10000.0, bound="wrap"):
    """a_ts = (1/sqrt(D)) sum_c mu_q mu_k cos((s - t) theta_c + delta_c), one (t, s) at a time.
    bound="wrap" uses delta as it is (cos is 2pi-periodic: wrapping changes no score)."""
    q, k, v, delta = (x.double() for x in (q, k, v, delta))
    (B, H, Tq, D), Tk = q.shape, k.size(2)
    theta = torch.tensor([base ** (-c / D) for c in range(D)], dtype=torch.float64)
    d = delta if bound == "wrap" else delta.clamp(-2 * math.pi, 0.0)
    mq, mk = F.softplus(q), F.softplus(k)
    out = torch.zeros(B, H, Tq, D, dtype=torch.float64)
    for i in range(Tq):
        t = q_offset + i
        a = torch.full((B, H, Tk), -math.inf, dtype=torch.float64)
        for s in range(Tk if not causal else min(t + 1, Tk)):
            a[:, :, s] = (mq[:, :, i] * mk[:, :, s] * torch.cos((s - t) * theta + d)).sum(-1) / math.sqrt(D)
        out[:, :, i] = torch.einsum("bhs,bhsd->bhd", torch.softmax(a, -1), v)
    return out


@pytest.mark.parametrize("bound", ["wrap", "clamp"])
@pytest.mark.parametrize("Tq,Tk,q_offset,causal,seed", [(7, 7, 0, True, 1), (3, 9, 6, True, 2),
                                                        (1, 5, 4, True, 3),
                                                        (2, 6, 1, True, 4), (5, 8, 0, False, 5)])
def test_pope_reference_matches_loop(Tq, Tk, q_offset, causal, seed, bound):
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 2, 8
    q, k, v = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk))
    delta = torch.empty(H, D).uniform_(-8.0, 2.0, generator=g)  # partly outside [-2pi, 0]: wrapped or clamped
    ref = pope_loop_f64(q, k, v, delta, causal, q_offset, bound=bound)
    out64 = pope_attention_reference(q.double(), k.double(), v.double(), delta.double(), bound,
                                     causal=causal, q_offset=q_offset)
    assert rel_err(out64, ref) < 1e-12, f"seed {seed}"
    out32 = pope_attention_reference(q, k, v, delta, bound, causal=causal, q_offset=q_offset)
    assert out32.dtype == torch.float32 and rel_err(out32, ref) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("bound", ["wrap", "clamp", "project"])
def test_delta_from_zero_init_keeps_learning(bound):
    """20 AdamW steps of a tiny PoPE model from zero init: wrap (the default) and project keep a gradient on
    every entry of delta at every step; the clamp does not (AdamW's first steps push entries above 0, where
    its gradient is 0). The delta the attention uses stays in [-2pi, 0] for all three."""
    torch.manual_seed(seed := 0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=37, pos_emb="pope",
                          pope_delta_init="zero", pope_delta_bound=bound, attn_impl="torch"))
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
        model.project_delta_()  # what train.py does after each step (a no-op unless bound="project")
    used = pope_delta(delta.detach(), bound)
    assert used.min().item() >= -2 * math.pi and used.max().item() <= 0.0, f"seed {seed}"
    assert delta.detach().abs().max().item() > 1e-3, f"seed {seed}: delta never moved"
    if bound == "clamp":
        assert live[-1] < 0.5, f"seed {seed}: {live[-1]:.2f} of delta kept a gradient under the clamp"
    else:
        assert min(live) == 1.0, f"seed {seed}: a step left part of delta without a gradient: {live}"
    if bound == "wrap":  # the same phase as the raw parameter
        torch.testing.assert_close(torch.cos(used), torch.cos(delta.detach()), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.sin(used), torch.sin(delta.detach()), atol=1e-5, rtol=0)


def test_pope_reference_gradients():
    torch.manual_seed(6)
    B, H, T, D = 1, 2, 5, 4
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    delta = torch.empty(H, D, dtype=torch.float64).uniform_(-6.0, -0.3).requires_grad_()
    torch.autograd.gradcheck(lambda *a: pope_attention_reference(*a, q_offset=0), (q, k, v, delta))


def test_pope_frequencies_and_shapes():
    # D frequencies base^(-c/D), not RoPE's D/2: the phase of component c at position 1 is theta_c
    D = 6
    x = torch.zeros(1, 1, 2, D)  # softplus(0) = ln 2
    c = pope_cartesian(x, pope_cos_sin(torch.tensor([0, 1]), pope_frequencies(D)))
    assert c.shape == (1, 1, 2, 2 * D)
    theta = torch.tensor([10000.0 ** (-i / D) for i in range(D)])
    torch.testing.assert_close(c[0, 0, 1, :D], math.log(2) * torch.cos(theta))
    torch.testing.assert_close(c[0, 0, 1, D:], math.log(2) * torch.sin(theta))


def test_rope_matches_complex_rotation():
    torch.manual_seed(7)
    B, H, T, D = 2, 3, 6, 8
    x = torch.randn(B, H, T, D, dtype=torch.float64)
    inv_freq = torch.tensor([10000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    out = apply_rope(x, *rope_cos_sin(inv_freq.float(), torch.arange(3, 3 + T)))
    # textbook: pair (x_i, x_{i+D/2}) as a complex number, multiplied by e^{i t theta_i}
    z = torch.complex(x[..., : D // 2], x[..., D // 2:])
    t = torch.arange(3, 3 + T, dtype=torch.float64)
    z = z * torch.exp(1j * t[:, None] * inv_freq[None, :])
    ref = torch.cat([z.real, z.imag], -1)
    assert (out - ref).abs().max().item() < 1e-5, "seed 7"  # positions/angles in float32


def test_relative_position_only():
    """Shifting every position by the same constant leaves the attention unchanged."""
    torch.manual_seed(8)
    B, H, T, D = 1, 2, 6, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64) for _ in range(3))
    delta = torch.empty(H, D, dtype=torch.float64).uniform_(-2 * math.pi, 0)
    for shift in (5, 123):
        pos = torch.arange(T)
        theta = pope_frequencies(D, dtype=torch.float64)
        qc = pope_cartesian(q, pope_cos_sin(pos + shift, theta))
        kc = pope_cartesian(k, pope_cos_sin(pos + shift, theta, delta))
        shifted = F.scaled_dot_product_attention(qc, kc, v, is_causal=True, scale=1 / math.sqrt(D))
        assert rel_err(shifted, pope_attention_reference(q, k, v, delta)) < 1e-10, f"seed 8, shift {shift}"
        inv = yarn_inv_freq(D, 10000.0, 1.0, 1024)[0].double()
        r0, r1 = (F.scaled_dot_product_attention(apply_rope(q, *rot), apply_rope(k, *rot), v, is_causal=True)
                  for rot in (rope_cos_sin(inv, pos), rope_cos_sin(inv, pos + shift)))
        assert rel_err(r1, r0) < 1e-5, f"seed 8, shift {shift}"


def tiny(pos_emb, **kw):
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=37, pos_emb=pos_emb,
               pope_delta_init="uniform", attn_impl="torch")
    cfg.update(kw)
    return GPT(GPTConfig(**cfg)).double().eval()


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
    assert id(d) not in decayed
    assert id(m.transformer.h[0].attn.c_attn.weight) in decayed
    assert id(m.transformer.h[0].ln_1.weight) not in decayed
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == m.get_num_params()


@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_flops_per_token_is_what_a_training_step_runs(pos_emb):
    """flops_per_token against PyTorch's FLOP counter over one forward and backward (SDPA's math backend);
    nanoGPT's 6N also counts the parameters no matmul multiplies by (norms, delta): elementwise here."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(11)
    model, (B, T) = tiny(pos_emb).train(), (3, 16)
    idx = torch.randint(0, 37, (B, T))
    with FlopCounterMode(display=False) as counter, sdpa_kernel([SDPBackend.MATH]):
        model(idx, idx)[1].backward()
    elementwise = sum(p.numel() for n, p in model.named_parameters()
                      if p.dim() == 1 or n.endswith("attn.delta"))
    assert model.flops_per_token(T) == counter.get_total_flops() / (B * T) + 6 * elementwise


@pytest.mark.parametrize("key,value", [("pos_emb", "alibi"), ("attn_impl", "cuda"), ("pope_delta_bound", "x"),
                                       ("n_embd", 100), ("rope_scaling", 0.5)])
def test_bad_config_is_rejected_naming_the_key(key, value):
    with pytest.raises(ValueError) as e:
        GPTConfig(**{key: value, "n_head": 3 if key == "n_embd" else 12})
    assert key in str(e.value)


def test_which_attention_runs_on_the_cpu():
    """use_pope_kernel, the one rule: the PyTorch path for attn_impl='torch' and for 'auto' off CUDA, whatever
    the length or torch.compile; the log line (attention_path) and the cache follow it."""
    torch.manual_seed(0)
    q = torch.zeros(1, 2, 4, 16)
    for impl in ("torch", "auto"):
        for compiled, T in ((False, 16), (True, 4096)):
            assert not use_pope_kernel(impl, q, q, q, q[0, :, 0], compiled=compiled)[0]
            m = tiny("pope", attn_impl=impl)
            assert "PyTorch path" in m.attention_path(compiled=compiled, T=T)
    from model import KVCache
    assert not KVCache(tiny("pope", attn_impl="auto"), 1, 8, torch.float32).kernel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_under_torch_compile_takes_the_pytorch_path_past_1024_tokens():
    """Issue 44's rule: compiled, attn_impl='auto' runs the kernel up to 1024 tokens, the PyTorch path past
    them (it measured faster there); uncompiled, the kernel at every length; attention_path reports the
    same."""
    for T, compiled, want in ((1024, True, True), (1025, True, False), (4096, False, True)):
        q = torch.zeros(1, 12, T, 64, device="cuda", dtype=torch.bfloat16)
        kernel, _ = use_pope_kernel("auto", q, q, q, q[0, :, 0].float(), compiled=compiled)
        assert kernel == want, (T, compiled)
        m = GPT(GPTConfig(n_layer=1, n_head=12, n_embd=768, vocab_size=64, block_size=T)).cuda()
        assert ("kernel of pope_kernel.py" in m.attention_path(compiled=compiled)) == want, (T, compiled)


@pytest.mark.parametrize("size,n_layer,n_head,n_embd", [(124, 12, 12, 768), (253, 16, 16, 1024),
                                                       (774, 36, 20, 1280)])
def test_the_papers_openwebtext_sizes(size, n_layer, n_head, n_embd):
    """The paper's 124M, 253M and 774M models have those sizes here, PoPE and RoPE alike (meta device)."""
    for pos_emb in ("pope", "rope"):
        with torch.device("meta"):
            m = GPT(GPTConfig(pos_emb=pos_emb, n_layer=n_layer, n_head=n_head, n_embd=n_embd))
        assert abs(m.get_num_params() / 1e6 - size) / size < 0.005, (size, pos_emb, m.get_num_params())


@pytest.mark.parametrize("s,L0,D,low,high", [(4.0, 512, 64, 3, 16), (8.0, 1024, 128, 11, 36),
                                             (4.0, 1024, 64, 5, 18)])
def test_yarn_is_the_published_form(s, L0, D, low, high):
    """YaRN as its reference code and Hugging Face compute it, the correction range worked out by hand:
    d(b) = D ln(L0 / (2 pi b)) / (2 ln 10000), low = floor(d(32)), high = ceil(d(1)). Pairs below low keep
    theta, pairs from high on get theta / s, a linear ramp between; logits scale by (0.1 ln s + 1)^2."""
    inv, mscale = yarn_inv_freq(D, 10000.0, s, L0)
    assert inv.shape == (D // 2,) and inv.dtype == torch.float32
    theta = torch.tensor([10000.0 ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    for i in range(D // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        want = theta[i] * ((1 - ramp) + ramp / s)
        assert abs(inv[i].item() - want.item()) <= 1e-6 * want.item(), (i, inv[i].item(), want.item())
    assert inv[low - 1].item() == pytest.approx(theta[low - 1].item(), rel=1e-6)
    assert inv[high].item() == pytest.approx(theta[high].item() / s, rel=1e-6)
    assert mscale == pytest.approx(1 + 0.1 * math.log(s))
    assert torch.equal(yarn_inv_freq(D, 10000.0, 1.0, L0)[0], theta.float())  # s = 1: plain RoPE
    if (s, L0, D) == (4.0, 1024, 64):  # values computed by hand: theta_i * (1 - gamma_i * 3/4)
        hand = {0: 1.0, 5: 0.237137, 6: 0.167569, 10: 0.0400127, 17: 0.00230737, 18: 0.00140585,
                31: 3.33380e-5}
        assert all(math.isclose(inv[i].item(), v, rel_tol=2e-5) for i, v in hand.items()), inv
        assert math.isclose(mscale, 1.1386294, rel_tol=1e-7)
