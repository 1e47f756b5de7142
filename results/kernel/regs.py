"""Registers and spilled bytes (STACK) per thread, shared memory per program, of the training kernels compiled
for sm_90 on the CPU (no GPU needed), and how many of their wgmma take the A operand from registers (the rest:
shared memory): forward, dk/dv and dq in every autotuned config at D=64 and D=128, for pope_kernel.py and each
copy given (a .diff of results/kernel/ applied, its custom ops renamed as ab_variant.py needs). The launch's
exact signature (types, 16-byte alignment, constexprs) comes from Triton 3.6's own JIT binder: a results tool,
not library code.
    python results/kernel/regs.py [COPY.py ...]"""
import datetime
import importlib.util
import os
import subprocess
import sys
import tempfile

os.environ["POPE_AUTOTUNE"] = "0"  # _BLOCKS' first config: the one this script sets
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import model  # noqa: E402

TARGET = triton.backends.compiler.GPUTarget("cuda", 90, 32)


def compile_sm90(fn, args, kwargs):
    backend = make_backend(TARGET)
    kwargs = dict(kwargs, debug=False)
    bound, spec, opts = create_function_from_signature(fn.signature, fn.params, backend)(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)


def resources(compiled):  # REG and STACK of the cubin, as cuobjdump reports them
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    return dict(w.split(":", 1) for w in out.split() if w.split(":", 1)[0] in ("REG", "STACK"))


def launches(pk, D):  # [(kernel, args, kwargs)] of one forward and backward on CPU tensors, nothing run
    calls = []
    pk._launch = lambda kernel, tuned, blocks, grid, args, kwargs: calls.append((kernel, args, dict(
        kwargs, BLOCK_M=blocks[0], BLOCK_N=blocks[1], num_warps=blocks[2], num_stages=blocks[3]))) or blocks[1]
    pk._cartesian = lambda x, theta, delta, pos0, o=None, do=None: (
        pk._empty((*x.shape[:3], 2 * D), x) if o is None else
        (pk._empty((*x.shape[:3], 2 * D), x), pk._empty(x.shape[:3], x, torch.float32)))
    q, k, v, do = (torch.randn(1, 256, 2, D, dtype=torch.bfloat16).transpose(1, 2) for _ in range(4))
    args = torch.zeros(2, D), model.pope_frequencies(D), True, D ** -0.5, 0
    pk._fwd(q, k, v, *args, False)
    pk._bwd(do, q, k, v, *args[:2], pk._bthd(q), torch.empty(1, 2, 256), *args[2:])
    return calls


if __name__ == "__main__":
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# commit: {git('rev-parse', 'HEAD')}\n# dirty: {bool(git('status', '--porcelain', '-uno'))}\n"
          f"# triton: {triton.__version__}\n# target: sm_90, compiled on the CPU\n# date: "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}\n# command: python "
          + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]), flush=True)
    for path in [os.path.join(ROOT, "pope_kernel.py")] + sys.argv[1:]:
        spec = importlib.util.spec_from_file_location(f"copy{abs(hash(path))}", path)
        pk = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(pk)
        for D in (64, 128):
            for kind, name in (("fwd", "_pope_fwd"), ("dkdv", "_pope_bwd_dkdv"), ("dq", "_pope_bwd_dq")):
                for cfg in list(pk._BLOCKS[kind][D]):
                    saved, pk._BLOCKS[kind][D] = pk._BLOCKS[kind][D], [cfg]
                    fn, args, kw = next(c for c in launches(pk, D) if c[0].fn.__name__ == name)
                    pk._BLOCKS[kind][D] = saved
                    c = compile_sm90(fn, args, kw)
                    r = resources(c)
                    # wgmma with the A operand in registers ({...} before the B descriptor) or shared memory
                    mma = [x for x in c.asm["ptx"].splitlines() if "wgmma.mma_async" in x]
                    print(f"{os.path.basename(path):16s} D={D:<3d} {kind:5s} {str(cfg):18s} "
                          f"registers {r['REG']:>3s}  stack {r['STACK']:>5s} B  shared {c.metadata.shared:>6d} B  "
                          f"wgmma {len(mma)}, A from registers "
                          f"{sum(x.count('{') >= 2 for x in mma)}", flush=True)
