"""The PoPE Triton kernel on the CPU, under Triton's interpreter.

Forward and all four gradients (dq, dk, dv, ddelta) against a float64 reference
written here from the formula (an einsum of cos((s - t) theta_c + delta_c), not
model.py's code), on seeded inputs (every failure names the seed and shape):
decoding (Tq = 1, q_offset = Tk - 1), lengths that are no multiple of a block,
non-causal, D = 32 and 64. Every buffer the kernels must fill
starts as NaN, and a NaN fails the check. Two backward runs must agree bitwise.
The kernel takes model.py's frequencies, and the model trains a few steps with
attn_impl="triton" as it does with "torch". The decoding kernel (one query against
a static cache, split over the keys) against a float64 softmax-attention reference
at every chunk boundary; given raw q and k, its PoPE and RoPE turning against float64
formulas (up to position 8000) and the key it caches against model.py's; generate()
on it against the cache's PyTorch path, and what a cached step launches per layer.

Why a subprocess: Triton reads TRITON_INTERPRET when a kernel is *decorated*,
its own library kernels (tl.sum, tl.max, tl.sigmoid...) included, i.e. when
triton is first imported. Once another test module has imported triton (model.py
imports pope_kernel), setting the variable here is too late and the
interpreter fails. So unless the whole run has TRITON_INTERPRET=1 from the
start, test_interpreter_suite runs this file again in a fresh
`python -m pytest` with the variable set, and the other tests here are
skipped in the parent (about 50 s of one core). That process starts as soon as
the session's tests are collected, at the lowest CPU priority, and runs on the
core the other tests leave idle; test_interpreter_suite, the session's last
test, waits for it (conftest.py). Whether the kernels compile for an H200
(sm_90: shared memory, spills, wgmma), which the interpreter cannot tell,
`python bench.py aot` reports without a GPU.
"""
import atexit
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn.functional as F
from helpers import large_weights_, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
pytest.importorskip("triton")
import pope_kernel as pk  # noqa: E402

interpreted = pytest.mark.skipif(not (INTERPRETED and pk._INTERPRET),
                                 reason="runs in the TRITON_INTERPRET=1 subprocess of test_interpreter_suite")
parent_only = pytest.mark.skipif(INTERPRETED, reason="needs a process without TRITON_INTERPRET")
if INTERPRETED:  # every buffer the kernels must fill starts as NaN
    _real_empty = pk._empty
    pk._empty = lambda shape, like, dtype=None: _real_empty(shape, like, dtype).fill_(float("nan"))


# ||out - ref|| / ||ref|| bounds: (output, dq/dk/dv, ddelta). float32 dots run
# as float32 under the interpreter (and as IEEE float32 on the GPU: no tf32).
# ddelta sums terms of both signs over batch and positions, so its norm is small
# next to theirs and its relative error is the largest (bf16: up to ~1e-2 at
# these sizes, the same as PyTorch's own bf16 path; 40 random shapes: <= 9.3e-3).
BOUND = {torch.float32: (2e-5, 2e-5, 4e-5), torch.float16: (2e-3, 3e-3, 6e-3), torch.bfloat16: (1e-2, 1e-2, 2e-2)}


def pope_einsum_f64(q, k, v, delta, causal=True, q_offset=0, base=10000.0):
    """a_ts = (1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s - t) theta_c + delta_c), in float64
    (delta as given: bounding it is model.py's job)."""
    B, H, Tq, D = q.shape
    Tk = k.size(2)
    theta = base ** (-torch.arange(D, dtype=torch.float64) / D)
    d = delta
    mq = F.softplus(q)
    mk = F.softplus(k)
    t = (q_offset + torch.arange(Tq, dtype=torch.float64))[:, None, None]
    s = torch.arange(Tk, dtype=torch.float64)[None, :, None]
    ang = (s - t) * theta + d[:, None, None, :]  # (H, Tq, Tk, D)
    scores = torch.einsum("bhtc,bhsc,htsc->bhts", mq, mk, torch.cos(ang)) / math.sqrt(D)
    if causal:
        visible = s[..., 0] <= t[..., 0]
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def theta(D):
    from model import pope_frequencies  # the model's frequencies, as model.py hands them to the kernel
    return pope_frequencies(D)


def run_both(B, H, Tq, Tk, D, dtype, seed, causal=True, q_offset=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, T, D, generator=g) for T in (Tq, Tk, Tk, Tq))
    delta = torch.empty(H, D).uniform_(-8.0, 1.0, generator=g)  # any phase bias: the kernel takes it as given
    kw = dict(causal=causal, q_offset=q_offset)

    def grads(fn, dt, *extra):
        xs = [x.to(dt).requires_grad_(True) for x in (q, k, v)]
        xs.append(delta.to(torch.float64 if dt == torch.float64 else torch.float32).requires_grad_(True))
        out = fn(*xs, *extra, **kw)
        return [out] + list(torch.autograd.grad(out, xs, do.to(dt)))

    return grads(pk.pope_attention, dtype, theta(D)), grads(pope_einsum_f64, torch.float64)


def check(got, ref, dtype, what):
    """what names the case: its shape, dtype and seed."""
    names = ["out", "dq", "dk", "dv", "ddelta"]
    for name, a, b in zip(names, got, ref):
        assert a.shape == b.shape, f"{what}: {name} shape {tuple(a.shape)} != {tuple(b.shape)}"
        assert torch.isfinite(a).all(), f"{what}: {name} has NaN/inf (an element was never written?)"
        err = rel_err(a, b)
        bound = BOUND[dtype][0 if name == "out" else 2 if name == "ddelta" else 1]
        assert err < bound, f"{what}: {name} rel err {err:.2e} >= {bound:.0e}"


def check_case(B, H, Tq, Tk, D, dtype, seed, **kw):
    """The kernel against the float64 reference; lengths here are no multiple of
    16 (the interpreter's block), so every loop ends on a masked partial block."""
    got, ref = run_both(B, H, Tq, Tk, D, dtype, seed, **kw)
    check(got, ref, dtype, f"seed={seed} B={B} H={H} Tq={Tq} Tk={Tk} D={D} {dtype} {kw}")


@interpreted
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 1), (torch.bfloat16, 2), (torch.float16, 3)])
def test_causal_self_attention(dtype, seed):
    check_case(2, 2, 45, 45, 64, dtype, seed)


@interpreted
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 4), (torch.bfloat16, 5)])
def test_head_dim_32(dtype, seed):
    check_case(1, 2, 33, 33, 32, dtype, seed)


@interpreted
@pytest.mark.parametrize("D,seed", [(32, 6), (64, 7)])
def test_one_query_at_the_end(D, seed):
    """Tq = 1 at q_offset = Tk - 1 (the fixed config of short query chunks)."""
    check_case(2, 2, 1, 53, D, torch.float32, seed, q_offset=52)


@interpreted
def test_query_chunk_at_an_offset():
    """Tq < Tk, rows at q_offset.. (a prompt chunk after a cache), causal."""
    check_case(1, 2, 19, 41, 64, torch.float32, 8, q_offset=22)


@interpreted
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 9), (torch.bfloat16, 10)])
def test_non_causal(dtype, seed):
    check_case(1, 2, 23, 58, 64, dtype, seed, causal=False)


@interpreted
def test_backward_is_bitwise_deterministic():
    a, _ = run_both(2, 1, 41, 41, 64, torch.bfloat16, seed=12)
    b, _ = run_both(2, 1, 41, 41, 64, torch.bfloat16, seed=12)
    for name, x, y in zip(["out", "dq", "dk", "dv", "ddelta"], a, b):
        assert torch.equal(x, y), f"seed=12: {name} differs between two runs"


@interpreted
def test_unsupported_input_says_what_is_supported():
    q = torch.randn(1, 2, 8, 48)
    delta = torch.zeros(2, 48)
    reason = pk.kernel_unsupported_reason(q, q, q, delta)
    assert reason is not None and "head dim 48" in reason and "32, 64 or 128" in reason
    with pytest.raises(pk.PopeKernelUnsupported, match="32, 64 or 128"):
        pk.pope_attention(q, q, q, delta, theta(48))
    q = torch.randn(1, 2, 8, 64, dtype=torch.float64)
    assert "float64" in pk.kernel_unsupported_reason(q, q, q, torch.zeros(2, 64))
    q = torch.randn(1, 2, 8, 64)
    assert pk.kernel_unsupported_reason(q, q, q, torch.zeros(2, 64)) is None


@parent_only
def test_cpu_without_interpreter_is_unsupported():
    q = torch.randn(1, 2, 8, 64)
    reason = pk.kernel_unsupported_reason(q, q, q, torch.zeros(2, 64))
    assert reason is not None and "TRITON_INTERPRET=1" in reason
    with pytest.raises(pk.PopeKernelUnsupported, match="TRITON_INTERPRET=1"):
        pk.pope_attention(q, q, q, torch.zeros(2, 64), theta(64))


@parent_only
def test_tuning_configs_survive_the_disk_cache():
    """With cache_results, Triton writes each Config's __dict__ to disk and the next
    process rebuilds it with Config(**that): an attribute of our own on a Config
    broke every second process. And each head dim tunes over its own list."""
    import triton
    for tuned, kind in ((pk._pope_fwd_tuned, "fwd"), (pk._pope_bwd_dkdv_tuned, "dkdv"), (pk._pope_bwd_dq_tuned, "dq")):
        assert tuned.cache_results
        for c in tuned.configs:
            assert str(triton.Config(**c.__dict__)) == str(c)
        for D in (32, 64, 128):
            kept = tuned.early_config_prune(tuned.configs, {}, HEAD_DIM=D)
            got = sorted((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept)
            assert got == sorted(pk._BLOCKS[kind][max(D, 64)]), (kind, D)


_SUITE = {}  # the interpreter suite's process and the file that takes its output


def start_interpreter_suite():
    """Start this file's run under TRITON_INTERPRET=1 (once), without waiting for it."""
    if INTERPRETED or _SUITE:
        return
    _SUITE["log"] = tempfile.TemporaryFile("w+")  # (a pipe nobody reads yet would fill and stall it)
    _SUITE["proc"] = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.abspath(__file__)],
        env=dict(os.environ, TRITON_INTERPRET="1"), cwd=ROOT, stdout=_SUITE["log"], stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: os.nice(19))  # (only the CPU time the other tests leave idle)
    atexit.register(_SUITE["proc"].kill)  # a session that ends before waiting for it (a no-op once it ended)


@parent_only
def test_interpreter_suite():
    """This file again, in a process that has TRITON_INTERPRET=1 from the start."""
    start_interpreter_suite()  # (started already when the session collected this test)
    code = _SUITE["proc"].wait(timeout=900)
    _SUITE["log"].seek(0)
    out = _SUITE["log"].read()
    print(out[-3000:])
    assert code == 0, out[-10000:]


@interpreted
@pytest.mark.parametrize("dtype,Tq,off,D,seed", [(torch.float32, 27, 0, 64, 13), (torch.bfloat16, 19, 13, 32, 14)])
def test_kernel_equals_the_pytorch_path_of_model_py(dtype, Tq, off, D, seed):
    """The fused kernel and model.py's PoPE code agree on the same inputs, forward
    and gradients, with delta bounded as the model bounds it (a variant edited in
    one and not in the other fails here)."""
    from model import pope_attention_torch, pope_delta
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(2, 2, Tq, D, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(2, 2, Tq + off, D, generator=g).to(dtype) for _ in range(2))
    delta = torch.empty(2, D).uniform_(-8.0, 1.0, generator=g)

    def run(fn, *extra):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, delta)]
        out = fn(xs[0], xs[1], xs[2], pope_delta(xs[3]), *extra, q_offset=off)
        return [out] + list(torch.autograd.grad(out, xs, do))

    got, ref = run(pk.pope_attention, theta(D)), run(pope_attention_torch)
    for name, a, b in zip(["out", "dq", "dk", "dv", "ddelta"], got, ref):
        bound = BOUND[dtype][0 if name == "out" else 2 if name == "ddelta" else 1] * (1 if dtype == torch.float32 else 2)
        assert rel_err(a, b) < bound, f"seed={seed}: {name} differs, rel err {rel_err(a, b):.2e} (Tq={Tq} off={off} D={D})"


@interpreted
def test_the_kernel_takes_the_models_frequencies(monkeypatch):
    """theta has one definition, model.pope_frequencies: a forker who changes it
    (here to RoPE's spacing, base^(-2c/D)) changes the model's attention, and the
    kernel path (attn_impl="triton", with the theta its layer made when built)
    still equals the PyTorch path."""
    import model as model_lib
    x = torch.randn(2, 25, 64, generator=torch.Generator().manual_seed(15))

    def both():  # a layer built now, on both paths
        torch.manual_seed(15)
        attn = model_lib.GPT(model_lib.GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=32, vocab_size=16,
                                                 pope_delta_init="uniform", attn_impl="torch")).transformer.h[0].attn
        ref = attn(x)
        attn.attn_impl = "triton"
        return attn(x), ref

    with torch.no_grad():
        got, before = both()
        assert rel_err(got, before) < 1e-5, f"seed=15: {rel_err(got, before):.2e}"
        monkeypatch.setattr(model_lib, "pope_frequencies",
                            lambda D, base=10000.0, device=None, dtype=torch.float32:
                            torch.logspace(0, -2 * (D - 1) / D, D, base=base, device=device, dtype=dtype))
        got, ref = both()
    assert rel_err(ref, before) > 1e-2, "seed=15: the patch changed nothing"
    assert rel_err(got, ref) < 1e-5, f"seed=15: the kernel ignores model.pope_frequencies ({rel_err(got, ref):.2e})"


def test_each_pope_layer_holds_its_theta_outside_the_checkpoint():
    """The frequencies the kernel path hands pope_attention are made once per layer, by
    model.pope_frequencies at the config's base, in float32, as a buffer that moves with
    the model and is left out of state_dict (checkpoints keep their keys)."""
    import model as model_lib
    cfg = model_lib.GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=16, pope_base=500.0)
    gpt = model_lib.GPT(cfg)
    for block in gpt.transformer.h:
        assert block.attn.theta.dtype == torch.float32
        assert torch.equal(block.attn.theta, model_lib.pope_frequencies(32, 500.0))
    assert not any("theta" in name for name in gpt.state_dict())
    assert "transformer.h.1.attn.theta" in dict(gpt.named_buffers())


@interpreted
def test_strided_inputs_from_a_fused_projection():
    """q, k, v as model.py makes them: views of one (B, T, 3C) tensor, transposed."""
    torch.manual_seed(16)
    B, T, H, D = 2, 29, 2, 32
    qkv = torch.randn(B, T, 3 * H * D)
    q, k, v = (x.view(B, T, H, D).transpose(1, 2) for x in qkv.split(H * D, dim=2))
    delta = torch.empty(H, D).uniform_(-6.0, 0.0)
    out = pk.pope_attention(q, k, v, delta, theta(D))
    ref = pope_einsum_f64(q.double(), k.double(), v.double(), delta.double())
    assert rel_err(out, ref) < BOUND[torch.float32][0], f"seed=16 T={T}: {rel_err(out, ref):.2e}"


@interpreted
def test_compiles_without_graph_break():
    """Under torch.compile the kernel is one opaque custom op (fullgraph=True
    raises on a graph break; the graph Dynamo hands the backend holds the op);
    aot_eager traces forward and backward through its fake and autograd formula.
    Same numbers as the eager autograd.Function."""
    from torch._dynamo.backends.registry import lookup_backend
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 2, 20, 32, generator=g) for _ in range(3)] + [torch.rand(2, 32, generator=g) * -7]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return lookup_backend("aot_eager")(gm, example_inputs)

    def run(fn):
        xs = [x.clone().requires_grad_(True) for x in inputs]
        out = fn(*xs)
        out.backward(torch.ones_like(out))
        return [out.detach()] + [x.grad for x in xs]

    def f(q, k, v, d):
        return pk.pope_attention(q, k, v, d, theta(32)) * 2.0

    eager = run(f)
    compiled = run(torch.compile(f, fullgraph=True, backend=backend))
    assert len(graphs) == 1 and f"{pk._NS}.fwd" in graphs[0], graphs
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


@interpreted
@pytest.mark.parametrize("dtype,causal,off,seed", [(torch.bfloat16, True, 0, 18), (torch.float32, False, 0, 19),
                                                   (torch.float16, True, 9, 20)])
def test_eager_function_equals_the_custom_op(dtype, causal, off, seed, monkeypatch):
    """Eagerly pope_attention runs a plain autograd.Function, never the custom op
    (patched here to fail): its output and four gradients are bitwise those of the
    custom op and its registered autograd formula, what a compiled graph runs."""
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(2, 3, 21, 32, generator=g).to(dtype) for _ in range(2))
    k, v = (torch.randn(2, 3, 21 + off, 32, generator=g).to(dtype) for _ in range(2))
    delta = torch.empty(3, 32).uniform_(-8.0, 1.0, generator=g)

    def run(fn):
        xs = [x.clone().requires_grad_(True) for x in (q, k, v, delta)]
        out = fn(*xs)
        return [out] + list(torch.autograd.grad(out, xs, do))

    op = run(lambda q, k, v, d: pk._fwd_op(q, k, v, d, theta(32), causal, 32 ** -0.5, off, True)[0])

    def refuse(*args):
        raise AssertionError("the eager path called the custom op")
    monkeypatch.setattr(pk, "_fwd_op", refuse)
    monkeypatch.setattr(pk, "_bwd_op", refuse)
    eager = run(lambda q, k, v, d: pk.pope_attention(q, k, v, d, theta(32), causal=causal, q_offset=off))
    for name, a, b in zip(["out", "dq", "dk", "dv", "ddelta"], eager, op):
        assert torch.isfinite(a).all() and torch.equal(a, b), f"seed={seed} {dtype}: {name} differs"


@parent_only
def test_the_direct_launch_key_refines_tritons_specialisation():
    """pope_kernel's direct launches reuse a compiled kernel for every launch with its _launch_key, so equal keys must
    mean equal specialisations in Triton's own binder (native_specialize_impl, run here on the CPU for an H200's
    backend), for every pair of arguments: tensors of five dtypes at each of 16 element offsets (addresses that are
    and are not multiples of 16 bytes), ints around Triton's thresholds (1, multiples of 16, the int32 and int64
    ranges), bools and floats."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.nvidia.compiler import CUDABackend
    bufs = [torch.zeros(64, dtype=dt) for dt in (torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64)]
    args = [b[o:] for b in bufs for o in range(16)] + [0, 1, 2, 15, 16, 17, 32, -1, -16, 2**31 - 16, 2**31 - 1, 2**31,
                                                      -2**31, -2**31 - 16, 2**63 - 16, 2**63, True, False, 0.0, 1.0,
                                                      0.125, 1.4426950408889634]
    specs = [native_specialize_impl(CUDABackend, a, False, True, True) for a in args]
    keys = [pk._launch_key(0, None, [a], {}) for a in args]
    aligned = sum(k[-1][1] for k in keys[:80])
    assert aligned == 2 + 2 + 4 + 4 + 8, aligned  # offsets 0 and 8 of 2-byte elements, 0, 4, 8, 12 of 4-byte ones...
    for i, (ka, sa) in enumerate(zip(keys, specs)):
        for kb, sb, b in zip(keys, specs, args):
            assert ka != kb or sa == sb, (args[i] if not isinstance(args[i], torch.Tensor) else args[i].data_ptr() % 16,
                                          b if not isinstance(b, torch.Tensor) else b.data_ptr() % 16, sa, sb)
    assert len({s for s in specs[:80]}) > 5  # (Triton does tell these apart: the check above compares something)


@parent_only
def test_bench_ab_refuses_bad_arguments():
    """bench.py ab: without --variant, or with a --parts it does not know, a one-line usage error that names the
    option (before any GPU is asked for)."""
    for args, says in ((["ab"], "--variant"), (["ab", "--variant", "x.py", "--parts", "fwd,graf"], "--parts")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "bench.py"), *args], capture_output=True, text=True)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and says in last and last.startswith("bench.py: error:"), (args, r.stderr)


@parent_only
def test_direct_launches_reuse_what_the_jit_compiled(monkeypatch):
    """pope_kernel._run: the first launch of a specialisation goes through Triton's JIT (kernel[grid](...)), which
    compiles the kernel and returns it; a later launch with the same key calls that kernel's launcher with what the
    JIT would pass it: the grid in 3-d, the current stream, every argument and then the constexprs in parameter
    order. Another dtype, alignment, int or device, or a Triton launch hook, goes through the JIT."""
    from triton import knobs

    class Compiled:
        function, packed_metadata = "function", "metadata"

        def __init__(self):
            self.launches = []

        def run(self, *a):
            self.launches.append(a)

    class Kernel:  # a JITFunction's interface as _run uses it
        arg_names = ["X", "n", "scale", "A", "B"]
        jit = []

        def __getitem__(self, grid):
            def launch(*args, **options):
                self.jit.append((grid, args, options))
                return Compiled()
            return launch

    device = [0]

    class Driver:
        get_current_device = staticmethod(lambda: device[0])
        get_current_stream = staticmethod(lambda d: f"stream of {d}")

    monkeypatch.setattr(pk, "_DIRECT", True)
    monkeypatch.setattr(pk, "_COMPILED", {})
    monkeypatch.setattr(pk, "driver", type("D", (), {"active": Driver}))
    kernel, x = Kernel(), torch.zeros(64)
    options = dict(A=3, B="tf32", num_warps=4)

    def launch(*args, grid=(2, 5), opts=options):  # -> "jit", or the direct launch's arguments
        n = len(kernel.jit)
        pk._run(kernel, grid, args, opts)
        if len(kernel.jit) > n:
            assert kernel.jit[-1] == (grid, args, opts)
            return "jit"
        return [c for c, _ in pk._COMPILED.values() if c.launches][-1].launches.pop()

    assert launch(x, 32, 0.5) == "jit"
    assert launch(x, 32, 0.5) == (2, 5, 1, "stream of 0", "function", "metadata", None, None, None, x, 32, 0.5, 3, "tf32")
    y = torch.zeros(64)  # another tensor, aligned as x: the same kernel
    assert launch(y, 32, 0.5, grid=(7,))[:4] + launch(y, 32, 0.5)[9:12] == (7, 1, 1, "stream of 0", y, 32, 0.5)
    for new in ((x[1:], 32, 0.5), (x.double(), 32, 0.5), (x, 33, 0.5), (x, 32, 0.25), (x, 32.0, 0.5)):
        assert launch(*new) == "jit" and launch(*new) != "jit", new
    assert launch(x, 32, 0.5, opts=dict(options, num_warps=8)) == "jit"
    device[0] = 1
    assert launch(x, 32, 0.5) == "jit" and launch(x, 32, 0.5)[3] == "stream of 1"
    hook = lambda *a: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launch(x, 32, 0.5) == "jit"
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert launch(x, 32, 0.5) != "jit"


@interpreted
def test_the_gpu_launch_path_keeps_the_autotuners_choice(monkeypatch):
    """The GPU's host path, run here on the interpreter: autotuning on, each autotuner's
    timings faked so that it picks its last config for float32 inputs and its first for
    bfloat16 (in its sorted list: neither is the untuned first; dk/dv's key blocks of 64
    or 128 then write 1 of the 3 ddelta partial rows at Tk = 40, the others stay NaN).
    The first call per shape and dtype goes through the autotuner, later ones launch its
    choice directly (not through Triton's Autotuner.run again): the same configs,
    bitwise the same numbers, near the float64 reference."""
    from triton.runtime.interpreter import InterpretedFunction
    tuned = (pk._pope_fwd_tuned, pk._pope_bwd_dkdv_tuned, pk._pope_bwd_dq_tuned)
    monkeypatch.setattr(pk, "_INTERPRET", False)  # (host side only: the kernels stay interpreted)
    monkeypatch.setattr(pk, "_AUTOTUNE", True)
    monkeypatch.setattr(pk, "_CHOSEN", {})
    monkeypatch.setattr(pk, "_unsupported", lambda *a: None)  # (it refuses the CPU without the interpreter)
    for kind in ("fwd", "dkdv", "dq"):  # (a kernel with one D=64 config is not tuned: it borrows D=128's here)
        if len(pk._BLOCKS[kind][64]) < 2:
            monkeypatch.setitem(pk._BLOCKS[kind], 64, pk._BLOCKS[kind][64] + pk._BLOCKS[kind][128])
    tunings, ran, autotuner_runs = [], [], []

    def fake_bench(*args, config, t, **kwargs):
        tunings.append(t)
        return t.configs.index(config) * (-1 if args[0].dtype == torch.float32 else 1)
    for t in tuned:
        monkeypatch.setattr(t, "cache", {})
        monkeypatch.setattr(t, "cache_results", False)
        monkeypatch.setattr(t, "_bench", lambda *a, t=t, **kw: fake_bench(*a, t=t, **kw))
        monkeypatch.setattr(t, "run", lambda *a, t=t, real=t.run, **kw: autotuner_runs.append(t) or real(*a, **kw))
    real_run = InterpretedFunction.run

    def run(self, *args, **kwargs):
        if self.fn.__name__ != "_cartesian_kernel":
            ran.append((self.fn.__name__, kwargs["BLOCK_M"], kwargs["BLOCK_N"], kwargs["num_warps"]))
        return real_run(self, *args, **kwargs)
    monkeypatch.setattr(InterpretedFunction, "run", run)

    first = {}  # dtype: (the configs its first call ran, its results)
    for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):
        tunings.clear()
        ran.clear()
        autotuner_runs.clear()
        got, ref = run_both(1, 2, 40, 40, 32, dtype, 21)
        check(got, ref, dtype, f"seed=21 B=1 H=2 T=40 D=32 {dtype}, autotuned path")
        if dtype not in first:
            assert len(set(tunings)) == 3, f"{dtype}: not every kernel was tuned"
            picked = [(t.fn.fn.__name__, *(t.best_config.all_kwargs()[n] for n in ("BLOCK_M", "BLOCK_N", "num_warps")))
                      for t in tuned]
            untuned = [(p[0], *pk._blocks(kind, 32)[0][:3]) for p, kind in zip(picked, ("fwd", "dkdv", "dq"))]
            assert ran == picked and all(p != u for p, u in zip(picked, untuned)) and picked[1][2] > 16, (ran, picked)
            first[dtype] = ran[:], got
        else:
            assert not tunings, f"{dtype}: tuned again at a shape and dtype it has tuned"
            assert not autotuner_runs, f"{dtype}: the launches still went through Triton's Autotuner.run"
            assert ran == first[dtype][0], (dtype, ran, first[dtype][0])
            for name, a, b in zip(["out", "dq", "dk", "dv", "ddelta"], got, first[dtype][1]):
                assert torch.equal(a, b), f"{dtype}: {name} differs between the tuned and the direct launch"
    assert first[torch.float32][0] != first[torch.bfloat16][0]
    assert len(pk._CHOSEN) == 6


@interpreted
def test_the_dkdv_kernel_writes_the_keys_the_dq_kernel_reads(monkeypatch):
    """The backward runs one Cartesian pre-pass, of the queries (with rowsum(dO*O)); the dk/dv kernel writes the
    Cartesian keys that the dq kernel reads, bitwise what the key pre-pass makes (with delta, every row of a
    length that is no multiple of a key block: the buffer starts as NaN), and the queries' copy is freed before
    the dq kernel runs."""
    import weakref
    seed = 29
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 37, 32, generator=g, requires_grad=True) for _ in range(3))
    delta = torch.rand(2, 32, generator=g) * -2 * math.pi
    prepasses, dq_keys = [], []
    real_cartesian, real_run = pk._cartesian, pk._run

    def cartesian(x, *args, **kw):
        res = real_cartesian(x, *args, **kw)
        prepasses.append(weakref.ref(res[0] if isinstance(res, tuple) else res))
        return res

    def run(kernel, grid, args, options):
        if kernel is pk._pope_bwd_dq:
            assert all(r() is None for r in prepasses), f"seed={seed}: the Cartesian queries are alive during dq"
            dq_keys.append(args[1].clone())
        return real_run(kernel, grid, args, options)
    monkeypatch.setattr(pk, "_cartesian", cartesian)
    monkeypatch.setattr(pk, "_run", run)
    out = pk.pope_attention(q, k, v, delta, theta(32))
    prepasses.clear()
    out.sum().backward()
    assert len(prepasses) == 1 and len(dq_keys) == 1, (len(prepasses), len(dq_keys))
    want = real_cartesian(k.detach(), theta(32), delta, 0)
    assert torch.equal(dq_keys[0], want), f"seed={seed}: the dk/dv kernel's keys differ from the pre-pass's " \
        f"(max |diff| {(dq_keys[0] - want).abs().nan_to_num(float('inf')).max():.2e})"


@interpreted
def test_cached_decoding_equals_recompute_on_the_kernel():
    """generate() with attn_impl='triton': the prompt and the one-token steps run on
    the static cache (magnitudes alone; SDPA for the prompt, the decoding kernel for the
    steps, never pope_attention) and give the greedy tokens of recomputing from scratch
    on the kernel."""
    from model import GPT, GPTConfig
    torch.manual_seed(17)
    cfg = dict(n_layer=2, n_head=2, n_embd=64, block_size=24, vocab_size=50, pope_delta_init="uniform")
    kern = GPT(GPTConfig(attn_impl="triton", **cfg)).eval()
    calls = []
    real = pk._fwd
    pk._fwd = lambda *a, **kw: calls.append(a[0].size(2)) or real(*a, **kw)
    try:
        idx = torch.randint(0, 50, (2, 5))
        out = kern.generate(idx, 10, temperature=0.0)
        assert calls == []
        want = idx
        with torch.no_grad():
            for _ in range(10):
                logits, _ = kern(want)
                want = torch.cat([want, logits[:, -1].argmax(-1, keepdim=True)], 1)
    finally:
        pk._fwd = real
    assert calls == [T for T in range(5, 15) for _ in range(2)]  # the reference ran on the kernel
    assert torch.equal(out, want), f"seed=17: {out.tolist()} != {want.tolist()}"


@interpreted
def test_model_trains_with_triton_attention_like_torch():
    from model import GPT, GPTConfig
    idx = torch.randint(0, 64, (2, 26), generator=torch.Generator().manual_seed(0))
    losses = {}
    for impl in ("triton", "torch"):
        torch.manual_seed(1)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=64, dropout=0.0,
                              pos_emb="pope", pope_delta_init="uniform", attn_impl=impl))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[impl] = []
        for _ in range(4):
            _, loss = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())  # T = 25: no block multiple
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[impl].append(loss.item())
    tri, ref = losses["triton"], losses["torch"]
    assert tri[-1] < tri[0], tri  # it trains
    for a, b in zip(tri, ref):
        assert abs(a - b) < 1e-4 * abs(b), (tri, ref)


# -----------------------------------------------------------------------------
# the decoding kernel (pope_kernel.decode_attention: KVCache's one-token step)

def decode_f64(q, k, v, k_cache, v_cache, pos, scale):
    """softmax_j(scale q . key_j) over j = 0..pos, times value_j, in float64, one (batch, head) at a time:
    keys and values are the cache's slots 0..pos-1 and the new k, v at slot pos."""
    B, H = q.shape[:2]
    out = torch.empty(B, H, 1, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            keys = torch.cat([k_cache[b, h, :pos], k[b, h]]).double()  # (pos + 1, Dk)
            vals = torch.cat([v_cache[b, h, :pos], v[b, h]]).double()
            a = scale * (keys @ q[b, h, 0].double())
            w = torch.exp(a - a.max())
            out[b, h, 0] = (w / w.sum()) @ vals
    return out


def check_decode(B, H, N, D, Dk, dtype, seed, positions, **kw):
    """At each position: the output against decode_f64, the cache's slot pos set to k and v and
    every other slot untouched. Slot pos and all past it start as NaN: the kernel must not read them.
    One tally of chunks (counts) serves every call, as KVCache's serves its layers: each call leaves it at zero."""
    g = torch.Generator().manual_seed(seed)
    kw = {"counts": torch.zeros(B * H, dtype=torch.int32), **kw}
    scale = (0.5 + torch.rand(1, generator=g).item()) / math.sqrt(D)
    for pos in positions:
        what = f"seed={seed} B={B} H={H} N={N} D={D} Dk={Dk} {dtype} pos={pos} {kw}"
        q, k = (torch.randn(B, H, 1, Dk, generator=g).to(dtype) for _ in range(2))
        v = torch.randn(B, H, 1, D, generator=g).to(dtype)
        kc, vc = torch.randn(B, H, N, Dk, generator=g).to(dtype), torch.randn(B, H, N, D, generator=g).to(dtype)
        kc[:, :, pos:], vc[:, :, pos:] = float("nan"), float("nan")
        want_k, want_v = kc.clone(), vc.clone()
        want_k[:, :, pos], want_v[:, :, pos] = k[:, :, 0], v[:, :, 0]
        ref = decode_f64(q, k, v, kc, vc, pos, scale)
        out = pk.decode_attention(q, k, v, kc, vc, torch.tensor([pos]), scale, **kw)
        assert out.shape == (B, H, 1, D) and out.dtype == dtype, f"{what}: {tuple(out.shape)} {out.dtype}"
        assert torch.isfinite(out).all(), f"{what}: NaN/inf in the output (a slot >= pos read, or one not written)"
        assert rel_err(out, ref) < BOUND[dtype][0], f"{what}: rel err {rel_err(out, ref):.2e}"
        for name, got, want in (("k", kc, want_k), ("v", vc, want_v)):
            assert torch.equal(got.nan_to_num(1e4), want.nan_to_num(1e4)), f"{what}: the {name} cache is wrong"
        assert not kw["counts"].any(), f"{what}: the chunks left their tally at {kw['counts'].tolist()}, not zero"


@interpreted
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("wide", [True, False], ids=["Dk=2D", "Dk=D"])
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 30), (torch.bfloat16, 31), (torch.float16, 32)])
def test_decoding_kernel_against_float64(D, wide, dtype, seed):
    """PoPE's 2D-wide Cartesian keys and RoPE's D-wide ones; 16-key blocks in 3 chunks, so that
    positions 0, 40 and 82 (N = 83) end in the first, a middle and the last chunk."""
    check_decode(2, 2, 83, D, 2 * D if wide else D, dtype, seed + D, [0, 40, 82], splits=3, block_n=16)


@interpreted
@pytest.mark.parametrize("splits", [1, 3, 5])
def test_decoding_kernel_at_chunk_boundaries(splits, monkeypatch):
    """Every position where a block or a chunk starts or ends: pos a multiple of the chunk length
    (the last chunk holds the new key alone), pos + 1 one, 1 block per chunk, then 2, then 3. Whatever
    the chunks, a call is one launch: the last chunk to finish merges them."""
    launches, real = [], pk._decode_split_kernel

    class Counted:
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]
    monkeypatch.setattr(pk, "_decode_split_kernel", Counted())
    positions = [1, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 79, 80, 95, 96, 99]
    check_decode(2, 1, 100, 32, 64, torch.float32, 33 + splits, positions, splits=splits, block_n=16)
    assert launches == [(splits, 2)] * len(positions), launches


@interpreted
def test_decoding_kernel_launch_config():
    """The launch's own blocks and chunk count, as the model runs it: 128-key blocks of D-wide keys
    (RoPE, D = 64), 3 chunks at N = 300, and B*H = 36: 15 chunks of 16-key blocks at N = 240."""
    check_decode(2, 2, 300, 64, 64, torch.bfloat16, 40, [0, 127, 128, 200, 255, 256, 299])
    check_decode(3, 12, 240, 16, 32, torch.float32, 41, [5, 239])


@interpreted
@pytest.mark.filterwarnings("ignore:All-NaN slice")  # (the interpreter's max over the NaN output)
def test_decoding_kernel_past_the_cache_writes_nothing(monkeypatch):
    """pos >= N (a caller's bug): NaN out, the caches untouched. Caches it does not take, and
    GPUs older than Ampere, are refused with a reason."""
    kc, vc = torch.randn(1, 2, 20, 64), torch.randn(1, 2, 20, 32)
    before = kc.clone(), vc.clone()
    q = torch.randn(1, 2, 1, 64)
    for launch in ({}, dict(splits=2, block_n=16)):  # one chunk, and two whose partials would be merged
        counts = torch.zeros(2, dtype=torch.int32)
        out = pk.decode_attention(q, q, torch.randn(1, 2, 1, 32), kc, vc, torch.tensor([20]), 0.2, counts=counts,
                                  **launch)
        assert out.isnan().all() and torch.equal(kc, before[0]) and torch.equal(vc, before[1]), launch
        assert not counts.any(), (launch, counts)
    assert "D=48" in pk.decode_unsupported_reason(torch.zeros(1, 2, 8, 96), torch.zeros(1, 2, 8, 48))
    assert "float64" in pk.decode_unsupported_reason(torch.zeros(1, 2, 8, 64, dtype=torch.float64),
                                                     torch.zeros(1, 2, 8, 32, dtype=torch.float64))
    assert pk.decode_unsupported_reason(kc, vc) is None
    monkeypatch.setattr(pk, "_capability", lambda dev: (7, 5))
    assert "capability (7, 5)" in pk.decode_unsupported_reason(kc, vc)


def turn_f64(x, pos, theta=None, delta=None, inv_freq=None):
    """Raw x (B, H, 1, D) turned at position pos in float64, from the formulas (not model.py's code): PoPE (theta),
    [mu cos(phi), mu sin(phi)] with mu = softplus(x) and phi_c = pos theta_c (+ delta[h, c]: a key); RoPE (inv_freq),
    (x_i + 1j x_{i+D/2}) e^(1j pos inv_freq_i) as [real parts, imaginary parts]. The phases are rounded to float32
    where model.py (and the kernel) make them in float32: pos * theta, then + delta; every other step is float64."""
    x = x.double()
    if theta is not None:
        phase = (pos * theta.double()).float()  # (pos < 2^24 times a float32: exact in float64, then one rounding)
        if delta is not None:
            phase = (phase.double() + delta.double()[:, None, :]).float()  # (H, 1, D)
        mu = torch.logaddexp(x, torch.zeros((), dtype=torch.float64))  # softplus
        return torch.cat([mu * torch.cos(phase.double()), mu * torch.sin(phase.double())], -1)
    ang = (pos * inv_freq.double()).float().double()
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang), x1 * torch.sin(ang) + x2 * torch.cos(ang)], -1)


_NMANT = {torch.float32: 23, torch.bfloat16: 7}


def ulp_of(x, dtype):
    """One unit in the last place of `dtype` at |x| (normal numbers), float64."""
    return torch.exp2(torch.floor(torch.log2(x.double().abs().clamp(min=torch.finfo(dtype).tiny))) - _NMANT[dtype])


def check_turned_decode(mode, D, dtype, seed, N, positions, **kw):
    """decode_attention on raw q and k (mode "pope": theta and delta; "rope": inv_freq) at each position: the output
    against decode_f64 over the float64 turned query and key (turn_f64), the cache's slot pos holding the key the
    PyTorch path writes (model.pope_cartesian / model.apply_rope in float32, then rounded to the cache dtype), and
    every other slot untouched. Slot pos and all past it start as NaN. Raw inputs of scale 2: softplus far from linear."""
    from model import apply_rope, pope_cartesian, pope_cos_sin, rope_cos_sin
    B, H = 2, 2
    g = torch.Generator().manual_seed(seed)
    scale = (0.5 + torch.rand(1, generator=g).item()) / math.sqrt(D)
    if mode == "pope":  # theta_c = base^(-c/D) rounded to float32 as the model keeps it; delta in [-2pi, 0]
        turn = dict(theta=(10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)).float(),
                    delta=-2 * math.pi * torch.rand(H, D, generator=g))
    else:  # base^(-2i/D), i < D/2
        turn = dict(inv_freq=(10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)).float())
    Dk = 2 * D if mode == "pope" else D
    for pos in positions:
        what = f"seed={seed} {mode} D={D} {dtype} N={N} pos={pos} {kw}"
        q, k = ((2 * torch.randn(B, H, 1, D, generator=g)).to(dtype) for _ in range(2))
        v = torch.randn(B, H, 1, D, generator=g).to(dtype)
        kc, vc = torch.randn(B, H, N, Dk, generator=g).to(dtype), torch.randn(B, H, N, D, generator=g).to(dtype)
        kc[:, :, pos:], vc[:, :, pos:] = float("nan"), float("nan")
        before_k, before_v = kc.clone(), vc.clone()
        qt = turn_f64(q, pos, turn.get("theta"), None, turn.get("inv_freq"))
        kt = turn_f64(k, pos, **turn)
        ref = decode_f64(qt, kt, v, kc, vc, pos, scale)
        out = pk.decode_attention(q, k, v, kc, vc, torch.tensor([pos]), scale, **turn, **kw)
        assert out.shape == (B, H, 1, D) and out.dtype == dtype, f"{what}: {tuple(out.shape)} {out.dtype}"
        assert torch.isfinite(out).all(), f"{what}: NaN/inf in the output (a slot >= pos read, or one not written)"
        assert rel_err(out, ref) < BOUND[dtype][0], f"{what}: rel err {rel_err(out, ref):.2e}"
        got = kc[:, :, pos:pos + 1]
        posv = torch.tensor([pos])
        if mode == "pope":
            want = pope_cartesian(k, pope_cos_sin(posv, turn["theta"], turn["delta"])).to(dtype)
            at = F.softplus(k.float()).repeat(1, 1, 1, 2)  # the error sits in mu or in the phase: units of mu
        else:
            want = apply_rope(k.float(), *rope_cos_sin(turn["inv_freq"], posv)).to(dtype)
            at = k.float().abs().amax(-1, keepdim=True)  # x cos - y sin cancels: units of the inputs' scale
        # One ulp of the cache dtype at the value, after what the two float32 computations may disagree by: RoPE 4
        # float32 ulps of the scale (each path rounds x cos, y sin and their sum, and its cos and sin differ in the
        # last place); PoPE 128 of mu, as _softplus's log(1 + e), e = exp(-|x|) >= 0.01, shared with the training
        # kernel, is off F.softplus by up to 65 ulps (x ~ -4.3); the range reductions differ by an ulp of the
        # reduced phase (~1e-7 rad), more than a bfloat16 ulp of mu cos(phi) where cos(phi) ~ 0
        tol = ulp_of(want, dtype) + ulp_of(at, torch.float32) * (128 if mode == "pope" else 4)
        err = (got.double() - want.double()).abs()
        assert (err <= tol).all(), f"{what}: slot pos off the PyTorch path's key by {(err / tol).max():.2f} tolerances"
        assert rel_err(got, kt) < BOUND[dtype][0], f"{what}: slot pos rel err {rel_err(got, kt):.2e} against float64"
        before_k[:, :, pos], before_v[:, :, pos] = got[:, :, 0], v[:, :, 0]
        for name, a, b in (("k", kc, before_k), ("v", vc, before_v)):
            assert torch.equal(a.nan_to_num(1e4), b.nan_to_num(1e4)), f"{what}: the {name} cache is wrong"


@interpreted
@pytest.mark.parametrize("mode", ["pope", "rope"])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 60), (torch.bfloat16, 61)])
def test_decoding_kernel_turns_raw_q_and_k(mode, D, dtype, seed):
    """Raw q and k turned in the kernel: positions 0, a middle one and the last of 83 slots in 3 chunks of
    16-key blocks, then far past any block_size (8000, 8008: phases of 8000 rad, where float32 keeps ~1e-4
    rad and a careless range reduction loses more) on a long cache, in 4 chunks of 512-key blocks."""
    check_turned_decode(mode, D, dtype, seed + D, 83, [0, 40, 82], splits=3, block_n=16)
    check_turned_decode(mode, D, dtype, seed + D + 1, 8009, [8000, 8008], splits=4, block_n=512)


def check_mu_decode(D, dtype, seed, N, positions, **kw):
    """decode_attention on raw q and k over a cache of PoPE magnitudes alone (D-wide keys with theta and delta):
    the output against the formula in float64, softmax_s(scale sum_c mu_q,c mu_k,sc cos((s - pos) theta_c +
    delta_c)) v_s, with mu = softplus and the phase rounded to float32 where the kernel makes it in float32
    ((s - pos) theta, then + delta); slot pos then holds softplus(k) in the cache dtype, every other slot as it was.
    Slot pos and all past it start as NaN; the cached magnitudes are positive, as softplus makes them."""
    B, H = 2, 2
    g = torch.Generator().manual_seed(seed)
    scale = (0.5 + torch.rand(1, generator=g).item()) / math.sqrt(D)
    theta = (10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)).float()
    delta = -2 * math.pi * torch.rand(H, D, generator=g)
    softplus = lambda x: torch.logaddexp(x.double(), torch.zeros((), dtype=torch.float64))  # noqa: E731
    for pos in positions:
        what = f"seed={seed} mu-keys D={D} {dtype} N={N} pos={pos} {kw}"
        q, k = ((2 * torch.randn(B, H, 1, D, generator=g)).to(dtype) for _ in range(2))
        v = torch.randn(B, H, 1, D, generator=g).to(dtype)
        kc = softplus(2 * torch.randn(B, H, N, D, generator=g)).to(dtype)
        vc = torch.randn(B, H, N, D, generator=g).to(dtype)
        kc[:, :, pos:], vc[:, :, pos:] = float("nan"), float("nan")
        before_k, before_v = kc.clone(), vc.clone()
        mu_k = torch.cat([kc[:, :, :pos].double(), softplus(k)], 2)  # (B, H, pos + 1, D)
        vals = torch.cat([vc[:, :, :pos], v], 2).double()
        rel = torch.arange(-pos, 1, dtype=torch.float32)  # s - pos
        phase = ((rel[:, None] * theta).double() + delta.double()[:, None, :]).float().double()  # (H, pos + 1, D)
        a = scale * (softplus(q) * mu_k * torch.cos(phase)).sum(-1)  # (B, H, pos + 1)
        ref = torch.softmax(a, -1)[:, :, None] @ vals
        out = pk.decode_attention(q, k, v, kc, vc, torch.tensor([pos]), scale, theta=theta, delta=delta, **kw)
        assert out.shape == (B, H, 1, D) and out.dtype == dtype, f"{what}: {tuple(out.shape)} {out.dtype}"
        assert torch.isfinite(out).all(), f"{what}: NaN/inf in the output (a slot >= pos read, or one not written)"
        assert rel_err(out, ref) < BOUND[dtype][0], f"{what}: rel err {rel_err(out, ref):.2e}"
        got, want = kc[:, :, pos:pos + 1].double(), softplus(k).to(dtype).double()
        tol = ulp_of(want, dtype) + ulp_of(want, torch.float32) * 4  # (the kernel's softplus: within 2.5 float32 ulps)
        assert ((got - want).abs() <= tol).all(), f"{what}: slot pos is not softplus(k)"
        before_k[:, :, pos], before_v[:, :, pos] = kc[:, :, pos], v[:, :, 0]
        for name, x, y in (("k", kc, before_k), ("v", vc, before_v)):
            assert torch.equal(x.nan_to_num(1e4), y.nan_to_num(1e4)), f"{what}: the {name} cache is wrong"


@interpreted
@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("dtype,seed", [(torch.float32, 70), (torch.bfloat16, 71)])
def test_decoding_kernel_over_pope_magnitudes(D, dtype, seed):
    """The cache of magnitudes alone: positions in the first, a middle and the last of 3 chunks of 16-key blocks,
    then 8000 and 8008 on a long cache (relative phases of up to 8000 rad), 4 chunks of 512-key blocks."""
    check_mu_decode(D, dtype, seed + D, 83, [0, 40, 82], splits=3, block_n=16)
    check_mu_decode(D, dtype, seed + D + 1, 8009, [8000, 8008], splits=4, block_n=512)


@interpreted
def test_decoding_kernel_refuses_what_cannot_turn():
    """Turning input whose widths do not fit the caches: a one-line error naming the shapes."""
    kc, vc = torch.zeros(1, 2, 8, 64), torch.zeros(1, 2, 8, 32)
    q = torch.zeros(1, 2, 1, 32)
    th, de = torch.ones(32), torch.zeros(2, 32)
    with pytest.raises(ValueError, match=r"delta \(2, 32\).*delta None"):
        pk.decode_attention(q, q, q, kc, vc, torch.tensor([0]), 1.0, theta=th)
    with pytest.raises(ValueError, match="key width 64"):  # RoPE keys are D-wide
        pk.decode_attention(q, q, q, kc, vc, torch.tensor([0]), 1.0, inv_freq=torch.ones(16))
    with pytest.raises(ValueError, match=r"need q, k \(B=1, H=2, 1, 32\)"):  # raw q is D-wide
        pk.decode_attention(torch.zeros(1, 2, 1, 64), q, q, kc, vc, torch.tensor([0]), 1.0, theta=th, delta=de)


def tiny_float(pos_emb, attn_impl, D=32):
    """A small float32 model (head dim D) with weights large enough that greedy tokens depend on the context."""
    from model import GPT, GPTConfig
    torch.manual_seed(42)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=2 * D, block_size=24, vocab_size=50, pos_emb=pos_emb,
                          pope_delta_init="uniform", attn_impl=attn_impl)).eval()
    return large_weights_(model)


@interpreted
@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_generate_on_the_decoding_kernel_equals_the_pytorch_path(pos_emb, D, monkeypatch):
    """attn_impl="triton" runs generate()'s one-token steps on the decoding kernel (counted, given raw
    q and k to turn), "torch" on the cache's PyTorch path: the same greedy tokens, prompt + 30 > context
    24 (so the window moves too), and the same logits at every step of a cache fed random tokens."""
    from model import KVCache
    calls = []
    real = pk.decode_attention
    monkeypatch.setattr(pk, "decode_attention", lambda *a, **kw: calls.append(sorted(kw)) or real(*a, **kw))
    models = {impl: tiny_float(pos_emb, impl, D) for impl in ("triton", "torch")}
    idx = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(43))
    out = {impl: m.generate(idx, 30, temperature=0.0, context=24) for impl, m in models.items()}
    assert len(calls) == 2 * (24 - 5), len(calls)  # 2 layers, the steps until the context is full
    turn = ["delta", "theta"] if pos_emb == "pope" else ["inv_freq"]
    assert all(kw == sorted(turn + ["block_n", "counts", "splits"]) for kw in calls), calls[0]
    assert torch.equal(out["triton"], out["torch"]), f"seed=42/43 {pos_emb} D={D}: {out}"
    caches = {impl: KVCache(m, 2, 24, torch.float32) for impl, m in models.items()}
    assert caches["triton"].kernel and not caches["torch"].kernel
    if pos_emb == "pope":  # the kernel's cache keeps the magnitudes alone, the PyTorch path's the Cartesian form
        assert caches["triton"].k[0].size(-1) == D and caches["torch"].k[0].size(-1) == 2 * D
    g = torch.Generator().manual_seed(44)
    with torch.no_grad():
        tok = idx
        for step in range(8):
            logits = {impl: m(tok, cache=caches[impl])[0] for impl, m in models.items()}
            err = rel_err(logits["triton"], logits["torch"])
            assert err < 1e-5, f"seed=42/44 {pos_emb} D={D} step {step}: rel err {err:.2e}"
            tok = torch.randint(0, 50, (2, 1), generator=g)


@interpreted
@pytest.mark.parametrize("pos_emb", ["pope", "rope", "none"])
def test_the_cache_launches_the_decoding_kernel_as_decode_attention_would(pos_emb, monkeypatch):
    """KVCache picks the kernel's splits and block_n once (pope_kernel.decode_launch) and passes them in: a model
    step launches what decode_attention picks on its own for those caches, where the cache length cuts the splits
    (N 1000: 4 blocks of 256 keys, 32 wide: PoPE's magnitudes, RoPE's or NoPE's keys) and where the budget of 512
    programs does (32 (batch, head) pairs: 16 splits)."""
    from model import KVCache
    launched = []
    monkeypatch.setattr(pk, "_decode", lambda *a: launched.append(a[-3:-1]) or a[4][:, :, :1].clone())
    model = tiny_float(pos_emb, "triton")
    block_n = 256  # 8192 / key width (32: D, PoPE's magnitudes alone as RoPE's keys)
    assert KVCache(model, 1, 8, torch.float32).k[0].size(-1) == 32
    for B, N, want in ((2, 1000, (1000 // block_n + 1, block_n)), (16, 8000, (16, block_n))):
        cache = KVCache(model, B, N, torch.float32)
        with torch.no_grad():
            model(torch.zeros(B, 1, dtype=torch.long), cache=cache)
        by_model = launched[-1]
        turn = {k: v for k, v in cache.turn[0].items() if k not in ("splits", "block_n", "counts")}
        q = torch.zeros(B, 2, 1, 32)
        pk.decode_attention(q, q, q, cache.k[0], cache.v[0], cache.pos, 0.1, **turn)
        assert by_model == launched[-1] == want, (pos_emb, B, N, by_model, launched[-1], want)


def step_launches(pos_emb, attn_impl, n_layer):
    """What one cached one-token step launches: {name: count} of the aten ops that are no views or
    allocations (TorchDispatchMode; each a kernel on a GPU) and of the Triton kernels (the interpreter's
    own torch calls inside a launch not counted)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from triton.runtime.interpreter import InterpretedFunction

    from model import GPT, GPTConfig, KVCache
    seen, inside = {}, []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not (inside or func.is_view or name.startswith(("empty", "new_empty"))):
                seen[name] = seen.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    real = InterpretedFunction.run

    def run(self, *args, **kwargs):
        seen["triton." + self.fn.__name__] = seen.get("triton." + self.fn.__name__, 0) + 1
        inside.append(1)
        try:
            return real(self, *args, **kwargs)
        finally:
            inside.pop()
    torch.manual_seed(46)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=64, block_size=16, vocab_size=50, pos_emb=pos_emb,
                          attn_impl=attn_impl)).eval()
    cache = KVCache(model, 1, 600, torch.float32)  # 600 slots: 3 chunks of the kernel's 256 keys
    assert cache.turn[0].get("splits", 3) == 3, cache.turn[0]
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)  # the prefill
        InterpretedFunction.run = run
        try:
            with Record():
                model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
        finally:
            InterpretedFunction.run = real
    return seen


@interpreted
def test_a_cached_step_on_the_kernel_launches_what_a_nope_step_does():
    """On the decoding kernel, a PoPE or RoPE one-token step launches per layer exactly what a NoPE step
    does (the kernel turns q and k: no stack, softplus, cat, cos or sin, per layer or per step): one
    Triton kernel a layer, whatever its chunks. On the PyTorch path those ops are
    there (the counter sees them)."""
    def per_layer(pos_emb, impl):
        one, three = step_launches(pos_emb, impl, 1), step_launches(pos_emb, impl, 3)
        return {op: (three.get(op, 0) - one.get(op, 0)) / 2 for op in set(one) | set(three)}, three
    nope, _ = per_layer("none", "triton")
    assert nope["triton._decode_split_kernel"] == 1, nope
    turning = ("stack", "softplus", "cat", "cos", "sin", "neg", "_to_copy")
    for pos_emb in ("pope", "rope"):
        layer, step = per_layer(pos_emb, "triton")
        assert layer == nope, (pos_emb, sorted(layer.items()), sorted(nope.items()))
        assert not [op for op in turning if op in step], (pos_emb, sorted(step.items()))
        _, torch_step = per_layer(pos_emb, "torch")
        assert "stack" in torch_step and ("softplus" if pos_emb == "pope" else "cat") in torch_step, torch_step


@interpreted
def test_the_cache_takes_the_decoding_kernel_where_it_runs():
    """On the CPU (here under the interpreter) only with attn_impl="triton", and only for caches it takes."""
    from model import KVCache
    for impl, dtype, want in (("auto", torch.float32, False), ("torch", torch.float32, False),
                              ("triton", torch.float32, True), ("triton", torch.bfloat16, True),
                              ("triton", torch.float64, False)):
        assert KVCache(tiny_float("pope", impl), 1, 8, dtype).kernel == want, (impl, dtype)


@parent_only
def test_the_cache_takes_no_kernel_on_the_cpu():
    from model import KVCache
    assert not KVCache(tiny_float("rope", "triton"), 1, 8, torch.float32).kernel


@interpreted
def test_a_compiled_step_runs_the_decoding_kernel_as_one_op():
    """generate(mode="compile") compiles the one-token step with fullgraph=True (a graph break
    raises): traced, the kernel is one custom op that writes the caches. aot_eager's steps give
    the eager steps' tokens and caches."""
    from model import KVCache
    model = tiny_float("pope", "triton")
    runs = []
    for compiled in (False, True):
        cache, tok = KVCache(model, 2, 16, torch.float32), torch.zeros(2, 1, dtype=torch.long)

        def step():
            tok.copy_(model(tok, cache=cache)[0][:, -1].argmax(-1, keepdim=True))
        with torch.no_grad():
            model(torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(45)), cache=cache)
            run = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
            toks = [run() or tok.clone() for _ in range(5)]
        runs.append((torch.cat(toks, 1), cache.k + cache.v))
    assert torch.equal(runs[0][0], runs[1][0]), f"seed=42/45: {runs[0][0].tolist()} != {runs[1][0].tolist()}"
    assert all(rel_err(a, b) < 1e-6 for a, b in zip(runs[0][1], runs[1][1]))
