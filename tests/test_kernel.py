"""The PoPE Triton kernels on the CPU, under Triton's interpreter, against float64 references
written here from the formula (not model.py's code, but its one definition of the magnitudes mu,
model.pope_magnitude: helpers.pope_magnitude_f64), on seeded inputs; every buffer the kernels fill
starts as NaN.

Triton reads TRITON_INTERPRET when it is first imported: unless the whole run has
TRITON_INTERPRET=1, test_interpreter_suite runs this file again in a fresh `python -m pytest` with
it set (started at collection: conftest.py), and the other tests here skip in the parent."""
import atexit
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from helpers import NAMES, large_weights_, pope_einsum_f64, pope_magnitude_f64, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
pytest.importorskip("triton")
import pope_kernel as pk  # noqa: E402
from model import (GPT, GPTConfig, KVCache, pope_attention_torch, pope_delta,  # noqa: E402
                   pope_frequencies)

interpreted = pytest.mark.skipif(
    not (INTERPRETED and pk._INTERPRET),
    reason="runs in the TRITON_INTERPRET=1 subprocess of test_interpreter_suite")
if INTERPRETED:  # every buffer the kernels must fill starts as NaN
    _real_empty = pk._empty
    pk._empty = lambda *a, **kw: _real_empty(*a, **kw).fill_(float("nan"))

# ||out - ref|| / ||ref|| bounds: (output, dq/dk/dv, ddelta). ddelta sums terms of both signs over
# batch and positions, so its error is the largest (bf16: up to ~1e-2, as PyTorch's own bf16 path).
# Where model.py's PyTorch path in the same dtype errs more (a variant with larger scores, e.g.
# softplus^2 magnitudes), twice its error is the bound: the kernel is held to that dtype's best.
BOUND = {torch.float32: (2e-5, 2e-5, 4e-5), torch.float16: (2e-3, 3e-3, 6e-3),
         torch.bfloat16: (1e-2, 1e-2, 2e-2)}
def run_both(B, H, Tq, Tk, D, dtype, seed, causal=True, q_offset=0):
    """[out, dq, dk, dv, ddelta] of the kernel in dtype, of the float64 reference and of model.py's
    PyTorch path in dtype, on the same inputs."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk, Tq))
    # any phase bias: the kernel takes it as given
    delta = torch.empty(H, D).uniform_(-8.0, 1.0, generator=g)

    def grads(fn, dt, *extra):
        xs = [x.to(dt).requires_grad_(True) for x in (q, k, v)]
        d = delta.to(torch.float64 if dt == torch.float64 else torch.float32)
        xs.append(d.requires_grad_(True))
        out = fn(*xs, *extra, causal=causal, q_offset=q_offset)
        return [out] + list(torch.autograd.grad(out, xs, do.to(dt)))

    return (grads(pk.pope_attention, dtype, pope_frequencies(D)),
            grads(pope_einsum_f64, torch.float64),
            grads(pope_attention_torch, dtype))


def check(got, ref, dtype, what, factor=1, peer=None):
    for i, (name, a, b) in enumerate(zip(NAMES, got, ref)):
        assert a.shape == b.shape, f"{what}: {name} shape {tuple(a.shape)} != {tuple(b.shape)}"
        bound = BOUND[dtype][0 if name == "out" else 2 if name == "ddelta" else 1] * factor
        if peer is not None:
            bound = max(bound, 2 * rel_err(peer[i], b))
        assert rel_err(a, b) < bound, (
            f"{what}: {name} rel err {rel_err(a, b):.2e} >= {bound:.0e} (or NaN)")


@interpreted
@pytest.mark.parametrize("B,H,Tq,Tk,D,dtype,seed,kw", [
    (2, 2, 45, 45, 64, torch.float32, 1, {}),
    (2, 2, 45, 45, 64, torch.bfloat16, 2, {}),
    (2, 2, 45, 45, 64, torch.float16, 3, {}),
    (1, 2, 33, 33, 32, torch.bfloat16, 5, {}),
    # one query at the end (the short-chunk config)
    (2, 2, 1, 53, 32, torch.float32, 6, dict(q_offset=52)),
    (1, 2, 19, 41, 64, torch.float32, 8, dict(q_offset=22)),  # a prompt chunk after a cache
    (1, 2, 23, 58, 64, torch.float32, 9, dict(causal=False)),
    (1, 2, 23, 58, 32, torch.bfloat16, 10, dict(causal=False)),
])
def test_kernel_against_float64(B, H, Tq, Tk, D, dtype, seed, kw):
    """Lengths no multiple of 16 (the interpreter's block): every loop ends on a masked partial
    block."""
    got, ref, peer = run_both(B, H, Tq, Tk, D, dtype, seed, **kw)
    check(got, ref, dtype, f"seed={seed} B={B} H={H} Tq={Tq} Tk={Tk} D={D} {dtype} {kw}", peer=peer)
    # the backward is bitwise deterministic (ddelta: summed per key block in a fixed order)
    if seed == 2:
        for name, x, y in zip(NAMES, got, run_both(B, H, Tq, Tk, D, dtype, seed, **kw)[0]):
            assert torch.equal(x, y), f"seed={seed}: {name} differs between two runs"


def test_unsupported_input_is_refused():
    """Head dim 48, float64, an empty input, caches the decoding kernel does not take; CPU tensors
    unless under the interpreter."""
    ok, delta = torch.randn(1, 2, 8, 64), torch.zeros(2, 64)
    assert (pk.kernel_unsupported_reason(ok, ok, ok, delta) is None) == pk._INTERPRET
    assert (pk.decode_unsupported_reason(ok, ok[..., :32]) is None) == pk._INTERPRET
    for q in ((torch.randn(1, 2, 8, 48), ok.double(), ok[:, :, :0])
              + (() if pk._INTERPRET else (ok,))):
        assert pk.kernel_unsupported_reason(q, q, q, delta[:, :q.size(-1)]) is not None, q.shape
        with pytest.raises(pk.PopeKernelUnsupported):
            pk.pope_attention(q, q, q, delta[:, :q.size(-1)], pope_frequencies(q.size(-1)))
    for k, v in ((torch.zeros(1, 2, 8, 96), torch.zeros(1, 2, 8, 48)), (ok.double(), ok.double())):
        assert pk.decode_unsupported_reason(k, v) is not None


_SUITE = {}  # the interpreter suite's process and the file that takes its output


def start_interpreter_suite():
    """Start this file's run under TRITON_INTERPRET=1 (once), without waiting for it."""
    if INTERPRETED or _SUITE:
        return
    # (a pipe nobody reads yet would fill and stall it)
    _SUITE["log"] = tempfile.TemporaryFile("w+")
    # (normal priority: at nice 19 a machine busy with other jobs starves it for minutes)
    _SUITE["proc"] = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__)],
        env=dict(os.environ, TRITON_INTERPRET="1"), cwd=ROOT, stdout=_SUITE["log"],
        stderr=subprocess.STDOUT, text=True)
    # a session that ends before waiting for it (a no-op once it ended)
    atexit.register(_SUITE["proc"].kill)


@pytest.mark.skipif(INTERPRETED, reason="needs a process without TRITON_INTERPRET")
def test_interpreter_suite():
    """This file again, in a process that has TRITON_INTERPRET=1 from the start."""
    start_interpreter_suite()  # (started already when the session collected this test)
    code = _SUITE["proc"].wait(timeout=900)
    _SUITE["log"].seek(0)
    out = _SUITE["log"].read()
    print(out)  # (shown by pytest on failure: every failing test's traceback)
    if code != 0:  # the failing tests by name, not one assertion cut short
        pytest.fail("under TRITON_INTERPRET=1: " + "; ".join(
            line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))),
            pytrace=False)


@interpreted
@pytest.mark.parametrize("dtype,Tq,off,D,seed", [(torch.float32, 27, 0, 64, 13),
                                                  (torch.bfloat16, 19, 13, 32, 14)])
def test_kernel_equals_the_pytorch_path_of_model_py(dtype, Tq, off, D, seed):
    """The kernel and model.py's PoPE code agree, forward and gradients, with delta bounded as the
    model bounds it (a PoPE variant edited in one and not in the other fails here)."""
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(2, 2, Tq, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(2, 2, Tq + off, D, generator=g).to(dtype) for _ in range(2))
    delta = torch.empty(2, D).uniform_(-8.0, 1.0, generator=g)

    def run(fn, *extra):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, delta)]
        out = fn(xs[0], xs[1], xs[2], pope_delta(xs[3]), *extra, q_offset=off)
        return [out] + list(torch.autograd.grad(out, xs, do))

    check(run(pk.pope_attention, pope_frequencies(D)), run(pope_attention_torch), dtype,
          f"seed={seed} Tq={Tq} off={off}", 1 if dtype == torch.float32 else 2)


@interpreted
def test_the_kernel_takes_the_models_frequencies(monkeypatch):
    """A forker who changes model.pope_frequencies (here to RoPE's spacing, base^(-2c/D)) changes
    the model's attention, and the kernel path (on the layer's strided q, k, v views) still equals
    the PyTorch path."""
    import model as model_lib
    x = torch.randn(2, 25, 64, generator=torch.Generator().manual_seed(15))

    def both():  # a layer built now, on both paths
        torch.manual_seed(15)
        attn = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=32, vocab_size=16,
                             pope_delta_init="uniform", attn_impl="torch")).transformer.h[0].attn
        ref = attn(x)
        attn.attn_impl = "triton"
        return attn(x), ref

    with torch.no_grad():
        got, before = both()
        err = rel_err(got, before)
        assert err < 1e-5, f"seed=15: layer output, kernel vs PyTorch path: rel err {err:.2e}"
        monkeypatch.setattr(model_lib, "pope_frequencies",
                            lambda D, base=10000.0, device=None, dtype=torch.float32:
                            torch.logspace(0, -2 * (D - 1) / D, D, base=base, device=device,
                                           dtype=dtype))
        got, ref = both()
    assert rel_err(ref, before) > 1e-2, "seed=15: the patch changed nothing"
    err = rel_err(got, ref)
    assert err < 1e-5, f"seed=15: the kernel's layer output ignores pope_frequencies: {err:.2e}"


@interpreted
def test_compiles_into_one_graph_with_the_eager_numbers():
    """Under torch.compile (fullgraph=True raises on a graph break) the kernel is one custom op;
    aot_eager traces forward and backward through its fake and autograd formula: bitwise the eager
    numbers. The fakes give the kernels' strides (Inductor would read the outputs with a fake's)."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 2, 20, 32, generator=g) for _ in range(3)]
    inputs.append(-7 * torch.rand(2, 32, generator=g))

    def run(fn):
        xs = [x.clone().requires_grad_(True) for x in inputs]
        out = fn(*xs)
        out.backward(torch.ones_like(out))
        return [out.detach()] + [x.grad for x in xs]

    def f(q, k, v, d):
        return pk.pope_attention(q, k, v, d, pope_frequencies(32)) * 2.0

    for name, a, b in zip(NAMES, run(torch.compile(f, fullgraph=True, backend="aot_eager")),
                          run(f)):
        assert torch.equal(a, b), f"seed=0: {name} differs compiled"
    # torch.library.opcheck: schema, autograd, the fakes' shapes and strides against the kernels'
    theta, (q, k, v, d), do = pope_frequencies(32), inputs, torch.randn(1, 2, 20, 32, generator=g)
    torch.library.opcheck(pk._fwd_op, (q.requires_grad_(), k, v, d, theta, True, 0.17, 0, False))
    out, lse = pk._fwd_op(q.detach(), k, v, d, theta, True, 0.17, 0, False)
    # laid out (B, T, H, D): the model's transpose copies nothing
    assert out.transpose(1, 2).is_contiguous()
    torch.library.opcheck(pk._bwd_op, (do, q.detach(), k, v, d, theta, out, lse, True, 0.17, 0))


def gpu_host_path(monkeypatch, autotune):
    """The GPU's launch path (its configs; the autotuner where autotune), the kernels still
    interpreted."""
    monkeypatch.setattr(pk, "_INTERPRET", False)  # (host side only)
    monkeypatch.setattr(pk, "_AUTOTUNE", autotune)
    # (it refuses the CPU now)
    monkeypatch.setattr(pk, "kernel_unsupported_reason", lambda *a: None)


@interpreted
@pytest.mark.parametrize("i", range(6))
def test_each_gpu_config_at_a_partial_tile(monkeypatch, i):
    """The i-th GPU config of each kernel's list at D=64 (the interpreter runs the GPU's tiles) at
    T=49, the shift-as-one-token rows of indirect indexing: one partial tile of 32 to 128 rows,
    against float64."""
    gpu_host_path(monkeypatch, autotune=False)
    for configs in pk._BLOCKS.values():
        monkeypatch.setitem(configs, 64, [configs[64][i % len(configs[64])]])
    got, ref, peer = run_both(1, 2, 49, 49, 64, torch.bfloat16, 30 + i)
    check(got, ref, torch.bfloat16,
          f"seed={30 + i}: GPU configs {[c[64] for c in pk._BLOCKS.values()]}", peer=peer)


@interpreted
def test_the_autotuners_pick_runs(monkeypatch):
    """The GPU's host path, on the interpreter: autotuning on, timings faked so that each autotuner
    picks its last config (of its sorted list, 64- or 128-key blocks for dk/dv: the ddelta reduction
    must sum the rows that config wrote, the others stay NaN). The configs that ran are the picks
    (dq: its one config), the numbers near float64, and the second call at the same shape is not
    tuned again."""
    from triton.runtime.interpreter import InterpretedFunction
    tuned = (pk._pope_fwd_tuned, pk._pope_bwd_dkdv_tuned)
    gpu_host_path(monkeypatch, autotune=True)
    tunings, ran = [], []
    for t in tuned:
        monkeypatch.setattr(t, "cache", {})
        monkeypatch.setattr(t, "cache_results", False)
        monkeypatch.setattr(t, "_bench", lambda *a, t=t, config, **kw:
                            tunings.append(t) or -t.configs.index(config))
    real_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        if self.fn.__name__ != "_cartesian_kernel":
            ran.append((self.fn.__name__, kwargs["BLOCK_M"], kwargs["BLOCK_N"],
                        kwargs["num_warps"]))
        return real_run(self, *args, **kwargs)
    monkeypatch.setattr(InterpretedFunction, "run", run)
    for call in range(2):
        tunings.clear()
        ran.clear()
        got, ref, _ = run_both(1, 2, 40, 40, 32, torch.float32, 21)
        check(got, ref, torch.float32, f"seed=21 call {call}, autotuned")
        picked = [(t.fn.fn.__name__,
                   *(t.best_config.all_kwargs()[n] for n in ("BLOCK_M", "BLOCK_N", "num_warps")))
                  for t in tuned]
        assert (ran == picked + [("_pope_bwd_dq", *pk._BLOCKS["dq"][64][0][:3])]
                and picked[1][2] > 16), ran
        assert (len(set(tunings)) == 2) == (call == 0), (
            f"call {call}: tuned {len(set(tunings))} kernels")


# -----------------------------------------------------------------------------
# the decoding kernel (pope_kernel.decode_attention: KVCache's one-token step)

def check_decode(mode, D, dtype, seed, N, positions, B=2, H=2, **kw):
    """decode_attention at each pos against softmax_s(scale a_s) v_s in float64 over slots 0..pos-1
    and the new k, v at pos. "ready": a_s = q . k_s; "rope": q, k rotated by pos * inv_freq first;
    "pope": a_s = sum_c mu_q,c mu_k,sc cos((s - pos) theta_c + delta_c) over a cache of magnitudes
    mu (phases rounded to float32 as the kernel's). Slots >= pos start as NaN; then slot pos holds
    the (turned) k, the others are as they were, and the chunks' tally is zero."""
    g = torch.Generator().manual_seed(seed)
    scale = (0.5 + torch.rand(1, generator=g).item()) / math.sqrt(D)
    # (RoPE's: every second one)
    th = (10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)).float()
    turn = {"ready": {}, "pope": dict(theta=th, delta=-2 * math.pi * torch.rand(H, D, generator=g)),
            "rope": dict(inv_freq=th[::2].contiguous())}[mode]
    Dk = 2 * D if mode == "ready" else D
    counts = torch.zeros(B * H, dtype=torch.int32)
    for pos in positions:
        what = f"seed={seed} {mode} D={D} {dtype} N={N} pos={pos} {kw}"
        q, k = ((2 * torch.randn(B, H, 1, Dk, generator=g)).to(dtype) for _ in range(2))
        v = torch.randn(B, H, 1, D, generator=g).to(dtype)
        kc = torch.randn(B, H, N, Dk, generator=g)
        kc = (pope_magnitude_f64(2 * kc) if mode == "pope" else kc).to(dtype)
        vc = torch.randn(B, H, N, D, generator=g).to(dtype)
        kc[:, :, pos:], vc[:, :, pos:] = float("nan"), float("nan")
        was = kc.clone(), vc.clone()
        new_k, qt = k.double(), q.double()
        if mode == "rope":  # (x_i + 1j x_{i+D/2}) e^(1j pos inv_freq_i)
            ang = (pos * turn["inv_freq"].double()).float().double().repeat(2)
            new_k, qt = (x * ang.cos()
                         + torch.cat([-x[..., D // 2:], x[..., :D // 2]], -1) * ang.sin()
                         for x in (new_k, qt))
        a = (torch.cat([kc[:, :, :pos].double(), new_k], 2) @ qt.mT)[..., 0]
        if mode == "pope":
            new_k = pope_magnitude_f64(k)
            # s - pos; the phase as float32 makes it
            rel = torch.arange(-pos, 1, dtype=torch.float32)
            phase = ((rel[:, None] * th).double()
                     + turn["delta"].double()[:, None, :]).float().double()
            keys = torch.cat([kc[:, :, :pos].double(), new_k], 2)
            a = (pope_magnitude_f64(q) * keys * torch.cos(phase)).sum(-1)
        ref = torch.softmax(scale * a, -1)[:, :, None] @ torch.cat([vc[:, :, :pos], v], 2).double()
        out = pk.decode_attention(q, k, v, kc, vc, torch.tensor([pos]), scale, counts=counts,
                                  **turn, **kw)
        assert out.shape == (B, H, 1, D) and out.dtype == dtype, (
            f"{what}: {tuple(out.shape)} {out.dtype}")
        err = rel_err(out, ref)
        assert err < BOUND[dtype][0], f"{what}: out rel err {err:.2e} (NaN: >pos)"
        assert rel_err(kc[:, :, pos:pos + 1], new_k) < BOUND[dtype][0], (
            f"{what}: slot pos holds a wrong key")
        was[0][:, :, pos], was[1][:, :, pos] = kc[:, :, pos], v[:, :, 0]
        for got, want in zip((kc, vc), was):
            assert torch.equal(got.nan_to_num(1e4), want.nan_to_num(1e4)), (
                f"{what}: another slot changed")
        assert not counts.any(), (
            f"{what}: the chunks left their tally at {counts.tolist()}, not zero")


@interpreted
@pytest.mark.parametrize("mode", ["ready", "pope", "rope"])
@pytest.mark.parametrize("D,dtype,seed", [(32, torch.float32, 30), (64, torch.bfloat16, 31),
                                          (128, torch.float16, 32)])
def test_decoding_kernel_against_float64(mode, D, dtype, seed):
    """Positions 0, 40, 82 of N = 83 in 3 chunks of 16-key blocks (first, middle and last chunk),
    then 8000 and 8008 of a long cache in 4 chunks of 512 keys (phases of 8000 rad, where careless
    reductions fail); with decode_launch's own pick (here 128-key blocks, 3 chunks at N = 300)."""
    check_decode(mode, D, dtype, seed, 83, [0, 40, 82], splits=3, block_n=16)
    if mode != "ready":
        check_decode(mode, D, dtype, seed + 1, 8009, [8000, 8008], B=1, splits=4, block_n=512)
    if (mode, D) == ("rope", 64):
        check_decode("rope", 64, torch.bfloat16, 40, 300, [0, 127, 128, 200, 255, 256, 299])


@interpreted
@pytest.mark.parametrize("splits", [1, 3, 5])
def test_decoding_kernel_at_chunk_boundaries(splits, monkeypatch):
    """Every position where a block or a chunk starts or ends; whatever the chunks, a call is one
    launch."""
    launches, real = [], pk._decode_split_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]
    monkeypatch.setattr(pk, "_decode_split_kernel", Counted())
    positions = [1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 79, 80, 95, 96, 99]
    check_decode("ready", 32, torch.float32, 33 + splits, 100, positions, H=1, splits=splits,
                 block_n=16)
    assert launches == [(splits, 2)] * len(positions), launches


@interpreted
@pytest.mark.parametrize("pos_emb,D", [("pope", 32), ("pope", 64), ("rope", 32), ("none", 32)])
def test_generate_on_the_decoding_kernel_equals_the_pytorch_path(pos_emb, D, monkeypatch):
    """attn_impl="triton" runs generate()'s one-token steps on the decoding kernel (counted),
    "torch" on the cache's PyTorch path (= recomputation: test_decode.py): the same greedy tokens,
    past the context."""
    calls, real = [], pk.decode_attention
    monkeypatch.setattr(pk, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    models = {impl: tiny_float(pos_emb, impl, D) for impl in ("triton", "torch")}
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(43))
    out = {impl: m.generate(idx, 30, temperature=0.0, context=24) for impl, m in models.items()}
    assert len(calls) == 2 * (24 - 5), len(calls)  # 2 layers, the steps until the context is full
    assert torch.equal(out["triton"], out["torch"]), (
        f"seed=42/43 {pos_emb} D={D}: greedy tokens {out}")


@pytest.mark.skipif(INTERPRETED, reason="runs its own TRITON_INTERPRET=1 process")
def test_eager_decoding_on_the_kernel_does_not_import_dynamo():
    """generate()'s one-token steps on the decoding kernel, in a fresh process: torch._dynamo
    (seconds to import; a custom op's first call imports it) is not loaded by eager decoding
    (sample.py)."""
    code = ("import sys, torch\n"
            "from model import GPT, GPTConfig\n"
            "cfg = GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=16, vocab_size=50, "
            "attn_impl='triton')\n"
            "out = GPT(cfg).eval().generate(torch.zeros(1, 3, dtype=torch.long), 4)\n"
            "print(out.shape[1], 'torch._dynamo' in sys.modules)\n")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["7", "False"], run.stdout


# float32, weights large enough that greedy tokens need the context
def tiny_float(pos_emb, attn_impl, D=32):
    torch.manual_seed(42)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=2 * D, block_size=24, vocab_size=50,
                    pos_emb=pos_emb, pope_delta_init="uniform", attn_impl=attn_impl)
    return large_weights_(GPT(cfg))


@interpreted
def test_a_compiled_step_runs_the_decoding_kernel_as_one_op():
    """A one-token step compiled with fullgraph=True (a graph break raises; traced, the kernel is
    one custom op that writes the caches): aot_eager's steps give the eager steps' tokens."""
    model, runs = tiny_float("pope", "triton"), []
    for compiled in (False, True):
        cache, tok = KVCache(model, 2, 16, torch.float32), torch.zeros(2, 1, dtype=torch.long)

        def step():
            tok.copy_(model(tok, cache=cache)[0][:, -1].argmax(-1, keepdim=True))
        with torch.no_grad():
            model(torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(45)),
                  cache=cache)
            run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
            # (each on the steps before)
            runs.append(torch.cat([run() or tok.clone() for _ in range(5)], 1))
    assert torch.equal(runs[0], runs[1]), f"seed=42/45: {runs[0].tolist()} != {runs[1].tolist()}"
