"""On a CUDA GPU (skipped without one): the kernels against float64 references written from the
formula (mu by model.pope_magnitude, the one definition; training: output and four gradients, first
configs and autotuned, buffers starting as NaN, bitwise repeatable; decoding at context 8k),
torch.compile's path, CUDA graphs (decoding, train.py's step) equal to eager, the attention rule.
Every random draw seeded."""
import copy
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import NAMES, large_weights_, pope_einsum_f64, pope_magnitude_f64, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
pk = pytest.importorskip("pope_kernel")
# out, grads
BOUND = {torch.float32: (1e-5, 1e-5), torch.float16: (3e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)}


def grads(fn, xs, do, *args):
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    out = fn(*xs, *args)
    return [out.detach()] + list(torch.autograd.grad(out, xs, do.to(out.dtype)))


def inputs(B, H, Tq, Tk, D, dtype, seed):
    g = torch.Generator("cuda").manual_seed(seed)
    q, do = (torch.randn(B, H, Tq, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(B, H, Tk, D, device="cuda", generator=g).to(dtype) for _ in range(2))
    delta = torch.rand(H, D, device="cuda", generator=g) * -7.0 + 0.5  # any phase bias, as given
    return [q, k, v, delta], do


@pytest.mark.parametrize("B,H,Tq,Tk,D,dtype,causal,off,tuned", [
    (2, 3, 300, 300, 64, torch.bfloat16, True, 0, False),
    (2, 3, 300, 300, 64, torch.bfloat16, True, 0, True),
    (2, 3, 300, 300, 64, torch.float16, True, 0, False),
    (2, 3, 300, 300, 64, torch.float32, True, 0, False),
    (1, 2, 257, 257, 32, torch.bfloat16, True, 0, False),
    (1, 2, 257, 257, 128, torch.bfloat16, True, 0, True),
    (2, 2, 200, 333, 64, torch.bfloat16, False, 0, False),
    (2, 2, 100, 357, 64, torch.bfloat16, True, 257, False),
    (2, 2, 1, 1000, 64, torch.bfloat16, True, 999, False),
    (2, 2, 1, 1000, 128, torch.bfloat16, True, 999, False),
])
def test_kernel_against_float64_and_bitwise_deterministic(B, H, Tq, Tk, D, dtype, causal, off,
                                                           tuned, monkeypatch):
    """Output and gradients against float64 (first configs, or autotuned), outputs that start as
    NaN, and a second run bitwise equal to the first."""
    real_empty = pk._empty
    monkeypatch.setattr(pk, "_empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    monkeypatch.setattr(pk, "_AUTOTUNE", tuned)
    xs, do = inputs(B, H, Tq, Tk, D, dtype, seed=Tq * Tk + D)
    from model import pope_attention_torch, pope_frequencies
    theta = pope_frequencies(D, device="cuda")
    def kernel(q, k, v, d):
        return pk.pope_attention(q, k, v, d, theta, causal=causal, q_offset=off)
    def torch_path(q, k, v, d):
        return pope_attention_torch(q, k, v, d, causal=causal, q_offset=off)
    got, again = grads(kernel, xs, do), grads(kernel, xs, do)
    ref = grads(pope_einsum_f64, [x.double() for x in xs], do.double(), causal, off)
    peer = grads(torch_path, xs, do)
    what = f"B={B} H={H} Tq={Tq} Tk={Tk} D={D} {dtype} causal={causal} off={off} tuned={tuned}"
    for i, (name, a, b, c) in enumerate(zip(NAMES, got, ref, again)):
        # as in tests/test_kernel.py's check
        bound = max(BOUND[dtype][i > 0], 2 * rel_err(peer[i], b))
        assert rel_err(a, b) < bound, f"{what}: {name} rel err {rel_err(a, b):.1e} (or NaN)"
        assert torch.equal(a, c), f"{what}: {name} differs between two runs"


def test_compiled_equals_eager():
    """torch.compile (inductor, fullgraph) of a function that calls the kernel: one opaque op, the
    same numbers as eagerly, output and gradients."""
    from model import pope_frequencies
    xs, do = inputs(2, 4, 500, 500, 64, torch.bfloat16, seed=1)
    theta = pope_frequencies(64, device="cuda")
    f = lambda q, k, v, d: pk.pope_attention(q, k, v, d, theta)  # noqa: E731
    for name, a, b in zip(NAMES, grads(torch.compile(f, fullgraph=True), xs, do), grads(f, xs, do)):
        assert torch.equal(a, b), f"seed=1: {name} differs compiled, rel err {rel_err(a, b):.1e}"


@pytest.mark.parametrize("mode,B,Dk", [
    ("ready", 1, 128),
    ("ready", 8, 64),
    ("pope", 8, 64),
    ("rope", 1, 64),
])
def test_decoding_kernel_against_float64_at_8k(mode, B, Dk):
    """decode_attention at the 124M model's shapes (12 heads, D = 64), context 8192, bf16, at slot
    0, in a first chunk, in the middle and at the last slot: ready keys, PoPE over its magnitudes,
    RoPE turned in the kernel; slot pos then holds the new key. Then 1000 calls at the last slot
    give bitwise one output (the last chunk to finish merges the others: a race would show) and
    leave the chunks' count at zero."""
    from model import pope_frequencies
    H, N, D = 12, 8192, 64
    g = torch.Generator("cuda").manual_seed(Dk + B)
    th = pope_frequencies(D, device="cuda")
    delta = -2 * math.pi * torch.rand(H, D, device="cuda", generator=g)
    turn = dict(ready={}, pope=dict(theta=th, delta=delta),
                rope=dict(inv_freq=th[::2].contiguous()))[mode]
    kc = torch.randn(B, H, N, Dk, device="cuda", generator=g)
    kc = (pope_magnitude_f64(2 * kc) if mode == "pope" else kc).bfloat16()
    vc = torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16()
    counts = torch.zeros(B * H, dtype=torch.int32, device="cuda")
    for pos in (0, 100, 5000, 8191):
        q, k = (torch.randn(B, H, 1, Dk, device="cuda", generator=g).bfloat16() for _ in range(2))
        v = torch.randn(B, H, 1, D, device="cuda", generator=g).bfloat16()
        new_k, qt = k.double(), q.double()
        if mode == "rope":
            ang = (pos * turn["inv_freq"].double()).float().double().repeat(2)
            new_k, qt = (x * ang.cos()
                         + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * ang.sin()
                         for x in (new_k, qt))
        keys = torch.cat([kc[:, :, :pos].double(), new_k], 2)
        a = (keys @ qt.mT)[..., 0]
        if mode == "pope":
            keys = torch.cat([kc[:, :, :pos].double(), pope_magnitude_f64(k)], 2)
            phase = (torch.arange(-pos, 1, device="cuda").double()[:, None] * th.double()
                     + delta[:, None])
            a = (pope_magnitude_f64(q) * keys * torch.cos(phase)).sum(-1)
        ref = torch.softmax(0.125 * a, -1)[:, :, None] @ torch.cat([vc[:, :, :pos], v], 2).double()
        at = torch.tensor([pos], device="cuda")
        out = pk.decode_attention(q, k, v, kc, vc, at, 0.125, counts=counts, **turn)
        err = rel_err(out, ref)
        assert err < 1e-2, f"{mode} B={B} Dk={Dk} pos={pos}: out rel err {err:.1e}"
        assert rel_err(kc[:, :, pos:pos + 1], keys[:, :, -1:]) < 1e-2, (
            f"{mode} pos={pos}: slot pos's key")
        assert torch.equal(vc[:, :, pos], v[:, :, 0]), f"{mode} pos={pos}: slot pos's value"
    outs = [pk.decode_attention(q, k, v, kc, vc, at, 0.125, counts=counts, **turn)
            for _ in range(1000)]
    assert sum(not torch.equal(o, outs[0]) for o in outs) == 0 and not counts.any()


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_graphed_decoding_equals_eager(pos_emb):
    """Greedy decoding replayed as a CUDA graph gives eager decoding's tokens, under bf16 autocast,
    past block_size and past the context (each token from the last `context` tokens)."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(pos_emb=pos_emb, block_size=128, n_layer=4, n_head=4, n_embd=256,
                          vocab_size=512, pope_delta_init="uniform")).cuda().eval()
    large_weights_(model)
    prompt = torch.randint(0, 500, (4, 100), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(0))
    with torch.autocast("cuda", torch.bfloat16):
        runs = [model.generate(prompt, 220, temperature=0.0, vocab_size=500, context=256, mode=mode)
                for mode in ("eager", "graph")]
    assert torch.equal(runs[0], runs[1]) and runs[0][:, 100:].unique().numel() >= 5, runs


def test_auto_takes_the_pytorch_path_past_1024_tokens_compiled():
    """use_pope_kernel's rule (issue 44): compiled, 'auto' runs the kernel up to 1024 tokens, the
    PyTorch path past them unless deterministic algorithms are on; uncompiled, the kernel at every
    length; attention_path reports the same."""
    from model import GPT, GPTConfig, use_pope_kernel
    for T, compiled, det, want in ((1024, True, False, True), (1025, True, False, False),
                                   (4096, False, False, True), (4096, True, True, True)):
        q = torch.zeros(1, 12, T, 64, device="cuda", dtype=torch.bfloat16)
        m = GPT(GPTConfig(n_layer=1, n_head=12, n_embd=768, vocab_size=64, block_size=T)).cuda()
        torch.use_deterministic_algorithms(det)
        try:
            assert use_pope_kernel("auto", q, q, q, q[0, :, 0].float(),
                                   compiled=compiled)[0] == want, T
            assert ("kernel of pope_kernel.py"
                    in m.attention_path(compiled=compiled)) == want, (T, compiled)
        finally:
            torch.use_deterministic_algorithms(False)


def test_auto_asks_the_kernels_support_check_once_a_layer(monkeypatch):
    """One forward of two layers: 'auto' asks kernel_unsupported_reason once a layer
    (use_pope_kernel; pope_attention trusts it), 'triton' twice (the kernel checks again, to
    refuse); the same logits."""
    from model import GPT, GPTConfig
    calls, real = [], pk.kernel_unsupported_reason

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(pk, "kernel_unsupported_reason", counted)
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=128, vocab_size=64, block_size=64)).cuda().eval()
    x = torch.randint(0, 64, (2, 64), device="cuda")
    out = {}
    for impl in ("auto", "triton"):
        m.config.attn_impl = impl
        for block in m.transformer.h:
            block.attn.attn_impl = impl
        calls.clear()
        with torch.no_grad():
            out[impl] = m(x)[0]
        assert len(calls) == {"auto": 2, "triton": 4}[impl], (impl, len(calls))
    assert torch.equal(out["auto"], out["triton"])


def test_compiled_bf16_gradients_equal_eager():
    """JSB's shape (T = 2047), bf16, evaluated first as train.py does: every parameter's gradient
    under torch.compile within 5% (norm-wise) of eager's. With q, k, v made by a
    view-permute-unbind, layer 0's had relative errors of 1 to 7,550 or NaN in every run
    (results/tasks/jsb-compile-nan/gradcmp)."""
    from model import GPT, GPTConfig
    for pos_emb in ("pope", "rope"):
        torch.manual_seed(1340)
        eager = GPT(GPTConfig(n_layer=6, n_head=8, n_embd=256, vocab_size=96, block_size=2047,
                              pos_emb=pos_emb, attn_impl="torch")).cuda()
        comp = copy.deepcopy(eager)
        fwd, x = torch.compile(comp), torch.randint(96, (16, 2048), device="cuda")
        with torch.autocast("cuda", torch.bfloat16):
            with torch.no_grad():
                fwd.eval()(x[:, :-1], x[:, 1:], (x[:, 1:] > 3).float())
            fwd.train()
            for f in (eager, fwd):
                f(x[:, :-1], x[:, 1:], (x[:, 1:] > 3).float())[1].backward()
        err = {n: rel_err(a.grad, b.grad)
               for (n, a), b in zip(comp.named_parameters(), eager.parameters())}
        assert not {n: e for n, e in err.items() if not e < 0.05}, (pos_emb, err)


def test_graphed_training_step_equals_the_eager_step(data_root, tmp_path):
    """train.py --cuda_graph=True (the optimizer step as one CUDA graph through model.cuda_graph,
    capturable AdamW, the batches gathered on the GPU) logs the eager run's losses: float32, 6 steps
    of a tiny PoPE."""
    train = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train.py")
    losses = []
    for graph in (False, True):
        args = [f"--data_dir={data_root}",
                *(f"--dataset=toy --out_dir=g{graph} --n_layer=2 --n_head=2 --n_embd=64 "
                  "--block_size=64 --batch_size=4 --gradient_accumulation_steps=2 --max_iters=6 "
                  "--eval_iters=1 --eval_interval=100 --log_interval=1 --warmup_iters=2 "
                  "--learning_rate=3e-3 --device=cuda --dtype=float32 "
                  f"--cuda_graph={graph}").split()]
        p = subprocess.run([sys.executable, train, *args], cwd=tmp_path, capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr[-3000:]
        records = [json.loads(line) for line in open(tmp_path / f"g{graph}" / "metrics.jsonl")]
        losses.append([r["loss"] for r in records if "loss" in r])
    # (AdamW: fused eagerly, foreach and capturable in the graph: not bitwise)
    eager, graphed = losses
    assert len(eager) == 6 and eager[-1] < eager[0], eager
    assert (all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(graphed, eager))
            and len(graphed) == 6), losses
