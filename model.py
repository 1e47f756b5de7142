"""
A GPT language model with a switch between PoPE, RoPE and no positional embedding (NoPE), in the style of
nanoGPT. PoPE's math is in this file, in plain PyTorch, top to bottom as the paper writes it (section "PoPE"
below); pope_kernel.py holds a fused Triton kernel that computes the same attention.

Usage (as a library; load_checkpoint below loads a train.py checkpoint):
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(pos_emb="pope"))
    logits, loss = model(idx, targets)
"""

import math
import pickle
import time
import warnings
import zipfile
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # the fused kernel needs Triton; without it the PyTorch path below runs everywhere
    import pope_kernel
    from pope_kernel import kernel_unsupported_reason  # (q, k, v, delta): None, or why the kernel cannot take them
except ImportError as e:
    pope_kernel, KERNEL_MISSING = None, f"Triton is not importable: {e}"
    kernel_unsupported_reason = lambda q, k, v, delta: KERNEL_MISSING  # noqa: E731 (pope_kernel's, which train.py asks too)

TWO_PI = 2.0 * math.pi


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False  # bias in Linears; False is a bit better and faster
    pos_emb: str = "pope"  # "pope" | "rope" | "none"
    pope_base: float = 10000.0
    rope_base: float = 10000.0
    pope_delta_init: str = "zero"  # "zero" (language) | "uniform": U(-2pi, 0)
    pope_delta_bound: str = "wrap"  # how delta is kept in [-2pi, 0]: "wrap" | "clamp" | "project" (see pope_delta)
    attn_impl: str = "auto"  # "auto" (kernels on CUDA) | "torch" (the code below) | "triton": PoPE's attention, cached steps
    rope_scaling: float = 1.0  # YaRN (arXiv 2309.00071), RoPE only: s > 1 stretches the context by s; 1.0 is plain RoPE
    rope_scaling_orig_len: int = 0  # the context that s stretches (0 means block_size)

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise ValueError(msg)
        need(self.pos_emb in ("pope", "rope", "none"), f"pos_emb must be 'pope', 'rope' or 'none', got {self.pos_emb!r}")
        need(self.attn_impl in ("auto", "torch", "triton"), f"attn_impl must be 'auto', 'torch' or 'triton', got {self.attn_impl!r}")
        need(self.pope_delta_init in ("zero", "uniform"), f"pope_delta_init must be 'zero' or 'uniform', got {self.pope_delta_init!r}")
        need(self.pope_delta_bound in ("wrap", "clamp", "project"),
             f"pope_delta_bound must be 'wrap', 'clamp' or 'project', got {self.pope_delta_bound!r}")
        need(self.n_head >= 1 and self.n_embd % self.n_head == 0, f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        need(self.pos_emb != "rope" or (self.n_embd // self.n_head) % 2 == 0, "RoPE needs an even head dim")
        need(self.rope_scaling >= 1.0, f"rope_scaling must be >= 1 (1 = off), got {self.rope_scaling}")
        need(self.rope_scaling == 1.0 or self.pos_emb == "rope",
             f"rope_scaling (YaRN) is for pos_emb='rope' only; this model has pos_emb={self.pos_emb!r}")


# -----------------------------------------------------------------------------
# PoPE (Gopalakrishnan et al., arXiv 2509.10534). Per head of dim D, on the raw q/k projections:
#     mu_q = softplus(q), mu_k = softplus(k)                     "what": content only
#     theta_c = base^(-c/D), c = 0..D-1                          D frequencies (RoPE: D/2)
#     phi_q(t) = t*theta_c,  phi_k(s) = s*theta_c + delta_c      "where": position only
#     a_ts = (1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s-t)*theta_c + delta_c)
# delta is a learned (H, D) phase bias per layer, kept in [-2pi, 0]. The score is the real dot product
# of the 2D-long vectors [mu cos(phi), mu sin(phi)], so the PyTorch path builds those (pope_cos_sin,
# then pope_cartesian) and calls SDPA. Values, softmax and the causal mask are unchanged.
#
# The kernels (pope_kernel.py: training, and decoding's _decode_turn) take theta from pope_frequencies and delta from
# pope_delta; their @triton.jit helpers _softplus, _cos_sin, _cartesian_tile and _cartesian_grad (the backward) are the
# copy of pope_magnitude, pope_cos_sin and pope_cartesian. To try a variant: edit this section, run --attn_impl=torch
# (the PyTorch path, any device), then port the change to those helpers; tests/test_kernel.py fails while they differ.

def pope_magnitude(x):
    """mu = softplus(x): every path's magnitudes (the kernel's copy: _softplus)."""
    return F.softplus(x)


def pope_frequencies(D, base=10000.0, device=None, dtype=torch.float32):
    """theta_c = base^(-c/D) for c = 0..D-1, rounded once from float64 (the kernel's too)."""
    return torch.logspace(0, -(D - 1) / D, D, base=base, device=device, dtype=torch.float64).to(dtype)


def pope_delta(delta, bound="wrap"):
    """The phase bias the attention uses, in [-2pi, 0] (one period of cos) as the paper asks. "wrap" (default) maps
    the parameter into (-2pi, 0] modulo 2pi: the score is smooth in it and its gradient never cut. "clamp" has zero
    gradient outside the range: from the zero init, AdamW's first steps push most entries above 0, where they stay,
    frozen. "project" clamps here and train.py clamps the parameter after every step (GPT.project_delta_): entries
    keep a gradient but sit pinned at the edge. RESULTS.md, section 7, compares the three."""
    if bound == "wrap":
        return delta - TWO_PI * torch.ceil(delta.detach() / TWO_PI)
    return torch.clamp(delta, -TWO_PI, 0.0)


def pope_cos_sin(positions, theta, delta=None):
    """cos(phi) and sin(phi) stacked, in theta's dtype: (T, 2, D) for queries, phi = t*theta; for keys,
    phi = s*theta + delta: (H, T, 2, D) for delta (H, D), (L, H, T, 2, D) for L layers' (KVCache)."""
    phase = positions.to(theta.dtype)[:, None] * theta  # (T, D)
    if delta is not None:
        phase = phase + delta.to(theta.dtype)[..., None, :]
    return torch.stack([torch.cos(phase), torch.sin(phase)], dim=-2)


def pope_cartesian(x, cos_sin):
    """[mu cos(phi), mu sin(phi)] of x (B, H, T, D), the raw projection: (B, H, T, 2D) in
    cos_sin's dtype (float32; float64 for float64 input). The model's PyTorch path, cached or not."""
    mu = pope_magnitude(x.to(cos_sin.dtype))
    return (mu.unsqueeze(-2) * cos_sin).flatten(-2)


def pope_attention_torch(q, k, v, delta, *, causal=True, base=10000.0, q_offset=0):
    """The model's PyTorch path (pope_cos_sin, pope_cartesian, then SDPA) with pope_kernel.pope_attention's
    contract at its default scale: tests and bench.py hold the kernel to it. q (B, H, Tq, D); k, v (B, H, Tk, D);
    delta (H, D), used as given (bound it with pope_delta first). Query row i sits at position q_offset + i, key
    row j at j (SDPA's is_causal aligns top-left: offsets get a mask); q and k go to v's dtype (SDPA's bf16 kernels)."""
    qpos = torch.arange(q_offset, q_offset + q.size(2), device=q.device)
    kpos = torch.arange(k.size(2), device=q.device)
    theta = pope_frequencies(q.size(-1), base, q.device, torch.promote_types(q.dtype, torch.float32))
    qc = pope_cartesian(q, pope_cos_sin(qpos, theta)).to(v.dtype)
    kc = pope_cartesian(k, pope_cos_sin(kpos, theta, delta)).to(v.dtype)
    mask = kpos[None, :] <= qpos[:, None] if causal and (q_offset or q.size(2) != k.size(2)) else None
    return F.scaled_dot_product_attention(qc, kc, v, attn_mask=mask, is_causal=causal and mask is None,
                                          scale=1.0 / math.sqrt(q.size(-1)))


# -----------------------------------------------------------------------------
# RoPE, with YaRN (Peng et al., arXiv 2309.00071) for longer contexts

def yarn_inv_freq(head_dim, base, scale, orig_len, beta_fast=32.0, beta_slow=1.0):
    """RoPE inverse frequencies under YaRN, and the logit factor mscale^2, in YaRN's published form (its reference
    code, Hugging Face's). Pair i, theta_i = base^(-2i/D), makes b rotations over the original context L0 at pair
    index d(b) = D ln(L0 / (2 pi b)) / (2 ln base). With low = max(floor(d(beta_fast)), 0),
    high = min(ceil(d(beta_slow)), D - 1) and the ramp g_i = clip((i - low) / (high - low), 0, 1):
    theta_i' = (1 - g_i) theta_i + g_i theta_i / s (fast pairs kept, slow ones interpolated);
    mscale = 0.1 ln(s) + 1 (YaRN's sqrt(1/t)). s = 1: plain RoPE."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scale <= 1.0:
        return theta.float(), 1.0
    pair_index = lambda b: head_dim * math.log(orig_len / (b * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731 d(b)
    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0.0, 1.0)
    theta = (1 - ramp) * theta + ramp * theta / scale
    return theta.float(), 0.1 * math.log(scale) + 1.0


def rope_cos_sin(inv_freq, positions):
    """apply_rope's cos and sin for the positions (T,): cos and [-sin, sin] of the angles, (T, D)
    each; or (L, T, D) for the inv_freq (L, D/2) of L layers at once (KVCache)."""
    ang = positions.float()[:, None] * inv_freq[..., None, :]  # (..., T, D/2)
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x, cos, sin):
    """Rotate (B, H, T, D) by rope_cos_sin's cos and sin: x[i] + 1j x[i + D/2] times e^(1j angle_i)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([x2, x1], dim=-1) * sin.to(x.dtype)


# -----------------------------------------------------------------------------
# the model

def use_pope_kernel(attn_impl, q, k, v, delta):
    """The one rule for which code runs PoPE's attention: (True, note) for the fused kernel, (False, why not) for the
    PyTorch path. "auto" takes the kernel for CUDA input it supports, "triton" always (pope_attention raises for
    input it does not take: the note says why)."""
    if attn_impl == "torch":
        return False, "attn_impl='torch'"
    if attn_impl == "auto" and not q.is_cuda:
        return False, f"attn_impl='auto' on {q.device.type}; the kernel runs on CUDA"
    reason = kernel_unsupported_reason(q, k, v, delta)
    if attn_impl == "auto":
        return reason is None, (f"attn_impl='auto'; the kernel does not take this model: {reason}" if reason else
                                "attn_impl='auto' on CUDA; --attn_impl=torch runs model.py's PyTorch path")
    if pope_kernel is None:
        raise RuntimeError(f"attn_impl='triton' needs the PoPE kernel, but {reason}")
    return True, "attn_impl='triton'" + (f"; it will refuse this input: {reason}" if reason else "")


class KVCache:
    """generate()'s static cache, `context` slots per layer. A forward of T tokens writes its keys and values at
    positions pos..pos+T-1 and attends over the slots up to each; pos, a tensor, advances in place, so a one-token step
    replays as a CUDA graph. Keys: RoPE's rotated; PoPE's magnitudes mu_k alone on the decoding kernel (which makes each
    slot's phase), else their Cartesian form, ready for a matmul."""

    def __init__(self, model, B, context, dtype):
        cfg, device, attns = model.config, model.lm_head.weight.device, [b.attn for b in model.transformer.h]
        H, D = cfg.n_head, cfg.n_embd // cfg.n_head
        self.v = [torch.zeros(B, H, context, D, device=device, dtype=dtype) for _ in attns]
        why = pope_kernel.decode_unsupported_reason(self.v[0], self.v[0]) if pope_kernel else KERNEL_MISSING
        self.kernel = why is None and (cfg.attn_impl == "triton" or cfg.attn_impl == "auto" and device.type == "cuda")
        self.mu = cfg.pos_emb == "pope" and self.kernel  # PoPE's keys: mu_k alone, else (2D wide) the Cartesian form
        self.k = [torch.zeros(B, H, context, D * (1 + (cfg.pos_emb == "pope" and not self.mu)), device=device, dtype=dtype)
                  for _ in attns]
        self.slots, self.pos = torch.arange(context, device=device), torch.zeros((), dtype=torch.long, device=device)
        launch = dict(pope_kernel.decode_launch(self.k[0]), counts=torch.zeros(B * H, dtype=torch.int32, device=device)) \
            if self.kernel else {}  # its splits and block_n, picked once; counts: its chunks' tally, for every layer
        self.pos_emb, self.dtype, self.turn = cfg.pos_emb, dtype, [launch] * cfg.n_layer  # turn: per layer
        if cfg.pos_emb == "pope":  # theta and the bounded deltas, read once, in the dtype pope_cartesian computes in
            self.theta = pope_frequencies(D, cfg.pope_base, device, torch.promote_types(dtype, torch.float32))
            self.delta = torch.stack([pope_delta(a.delta, a.delta_bound) for a in attns]).to(self.theta.dtype)
            self.turn = [dict(launch, theta=self.theta, delta=d) for d in self.delta]
        if cfg.pos_emb == "rope":
            self.inv_freq = torch.stack([a.inv_freq for a in attns])  # (L, D/2)
            self.turn = [dict(launch, inv_freq=f) for f in self.inv_freq]

    def start(self, T):  # GPT.forward's: the positions of its T tokens, the slots each sees, what turns q and k
        self.positions = self.pos.view(1) if T == 1 else self.pos + self.slots[:T]  # (pos advances after the layers)
        if T > 1 or not self.kernel:  # (T, context): the mask of every slot past each query; the kernel needs neither
            self.bias = torch.where(self.slots > self.positions[:, None], -math.inf, 0.0).to(self.dtype)
            if self.pos_emb == "pope" and not self.mu:  # per layer, q and k stacked: queries' (T, 2, D), keys' (H, T, 2, D)
                rk = pope_cos_sin(self.positions, self.theta, self.delta)  # (L, H, T, 2, D)
                self.rotation = torch.stack([pope_cos_sin(self.positions, self.theta).expand_as(rk), rk], 1)[:, :, None]
            if self.pos_emb == "rope":  # per layer: the layer's cos and sin, (T, D) each
                self.rotation = list(zip(*(r.to(self.dtype) for r in rope_cos_sin(self.inv_freq, self.positions))))

    def attend(self, layer, q, k, v, scale):  # turns raw q and k, writes k and v, attends over the slots up to each
        if q.size(2) == 1 and self.kernel:  # one token: 1-2 kernels, which turn q and k, write k and v, read slots 0..pos
            return pope_kernel.decode_attention(q, k, v, self.k[layer], self.v[layer], self.positions, scale, **self.turn[layer])
        if self.pos_emb != "none" and not self.mu:  # q and k stacked: one set of kernels turns both (pope_attention_torch's)
            rot, qk = self.rotation[layer], torch.stack([q, k])
            q, k = pope_cartesian(qk, rot).to(v.dtype) if self.pos_emb == "pope" else apply_rope(qk, *rot)
        k = self.k[layer].index_copy_(2, self.positions, pope_magnitude(k.to(self.theta.dtype)).to(self.dtype) if self.mu else k)
        if self.mu:  # a prefill over the magnitudes' cache (index_copy_ returns all of it): each slot's Cartesian key
            q = pope_cartesian(q, pope_cos_sin(self.positions, self.theta)).to(v.dtype)
            k = (k.unsqueeze(-2) * pope_cos_sin(self.slots, self.theta, self.delta[layer])).flatten(-2).to(v.dtype)
        v = self.v[layer].index_copy_(2, self.positions, v)
        if q.size(2) > 1:  # a prefill: SDPA picks a fused kernel that takes the mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias, scale=scale)
        # one token, the reference: 4 kernels (SDPA's math: ~10), bias + scale q k^T in one, softmax in the cache dtype
        att = torch.baddbmm(self.bias, q.flatten(0, 1), k.flatten(0, 1).mT, alpha=scale)
        return torch.bmm(att.softmax(-1, dtype=att.dtype), v.flatten(0, 1)).view(*q.shape[:3], -1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx, self.n_head, self.head_dim = layer_idx, config.n_head, config.n_embd // config.n_head
        self.pos_emb, self.attn_impl, self.pope_base = config.pos_emb, config.attn_impl, config.pope_base
        self.delta_bound = config.pope_delta_bound
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hook points (identities, no weights): each head's q and k as projected, before RoPE or a cache;
        # analysis scripts (eval_frequencies.py) read the attention's own q/k through forward hooks on these
        self.q_probe, self.k_probe = nn.Identity(), nn.Identity()
        self.scale = 1.0 / math.sqrt(self.head_dim)
        if self.pos_emb == "pope":  # delta: the keys' learned phase bias (initialised in GPT.__init__)
            self.delta = nn.Parameter(torch.zeros(config.n_head, self.head_dim))
            self.register_buffer("theta", pope_frequencies(self.head_dim, self.pope_base, self.c_attn.weight.device),
                                 persistent=False)  # the kernel's, made once; float32 (bf16 runs under autocast)
        if self.pos_emb == "rope":
            self.set_rope_scaling(config.rope_base, config.rope_scaling,
                                  config.rope_scaling_orig_len or config.block_size)

    def set_rope_scaling(self, base, scale, orig_len):
        inv_freq, mscale = yarn_inv_freq(self.head_dim, base, scale, orig_len)
        self.register_buffer("inv_freq", inv_freq.to(self.c_attn.weight.device), persistent=False)
        self.scale = mscale ** 2 / math.sqrt(self.head_dim)

    def forward(self, x, cache=None):
        B, T, C = x.size()  # q, k, v: (B, H, T, D) views of c_attn's output, made with 3 view ops (not 7)
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_probe(q), self.k_probe(k)
        if self.pos_emb == "pope" and cache is None:  # training, evaluation: the kernel on CUDA, else the PyTorch path
            delta = pope_delta(self.delta, self.delta_bound)
            kernel, why = use_pope_kernel(self.attn_impl, q, k, v, delta)
            if not kernel and q.is_cuda and self.attn_impl == "auto" and not torch.compiler.is_compiling():  # (once)
                warnings.warn(f"PoPE Triton kernel not used ({why}); running the PyTorch path of model.py")
            y = pope_kernel.pope_attention(q, k, v, delta, self.theta) if kernel else \
                pope_attention_torch(q, k, v, delta, base=self.pope_base)
        else:  # one attention call; with a cache, over the slots up to each query (KVCache.attend turns q and k)
            if cache is None and self.pos_emb == "rope":
                rot = rope_cos_sin(self.inv_freq, torch.arange(T, device=x.device))
                q, k = apply_rope(q, *rot), apply_rope(k, *rot)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale) if cache is None else \
                cache.attend(self.layer_idx, q, k, v, self.scale)
        y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return self.resid_dropout(y) if self.training else y  # (in eval an identity: its call, host time, skipped)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_proj(F.gelu(self.c_fc(x)))
        return self.dropout(x) if self.training else x


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = nn.RMSNorm(config.n_embd, eps=1e-6)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.RMSNorm(config.n_embd, eps=1e-6)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd, eps=1e-6),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            if pn.endswith("attn.delta") and config.pope_delta_init == "uniform":
                torch.nn.init.uniform_(p, -TWO_PI, 0.0)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    @torch.no_grad()
    def project_delta_(self):
        """pope_delta_bound="project": clamp each delta into [-2pi, 0]; train.py calls it after every step."""
        if self.config.pos_emb == "pope" and self.config.pope_delta_bound == "project":
            for block in self.transformer.h:
                block.attn.delta.clamp_(-TWO_PI, 0.0)

    def cast_weights_(self, dtype):
        """The matmuls', embedding's and norms' weights in dtype, for decoding without autocast (no casts at every step,
        the residual stream in dtype); PoPE's delta and the frequencies stay float32: a phase needs their bits."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.RMSNorm)):
                m.to(dtype)
        return self

    def get_num_params(self):
        """Parameter count (the tied embedding counted once; there is no position table)."""
        return sum(p.numel() for p in self.parameters())

    def attention_path(self, device=None):
        """One line for logs: the attention code on `device` (default: the weights'), and why (use_pope_kernel)."""
        cfg = self.config
        if cfg.pos_emb != "pope":
            return f"{cfg.pos_emb}: PyTorch SDPA (model.py)"
        probe = torch.zeros(1, cfg.n_head, 1, cfg.n_embd // cfg.n_head, device=device or self.lm_head.weight.device)
        kernel, why = use_pope_kernel(cfg.attn_impl, probe, probe, probe, probe[0, :, 0])
        return f"pope: the {'fused Triton kernel of pope_kernel.py' if kernel else 'PyTorch path of model.py'} ({why})"

    def forward(self, idx, targets=None, loss_mask=None, cache=None):
        """idx (B, T) token ids. With targets (B, T): all logits and the mean cross-entropy over the positions where
        loss_mask (B, T) is nonzero (all without a mask). Without: the last position's logits only (inference)."""
        x = self.transformer.drop(self.transformer.wte(idx))
        if cache is not None:
            cache.start(idx.size(1))
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None:  # after the layers: a one-token step's position is a view of pos
            cache.pos += idx.size(1)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # (a slice: no index tensor to copy in a CUDA graph)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none")
        if loss_mask is None:
            return logits, loss.mean()
        m = loss_mask.reshape(-1).to(loss.dtype)
        return logits, (loss * m).sum() / m.sum().clamp(min=1.0)

    def set_rope_scaling(self, scale, orig_len=None):
        """Switch YaRN on (scale > 1) or off (1.0) for every layer at eval time."""
        if self.config.pos_emb != "rope":
            raise ValueError("rope_scaling (YaRN) applies to pos_emb='rope' models only")
        if scale < 1.0:
            raise ValueError(f"rope_scaling must be >= 1, got {scale}")
        orig_len = orig_len or self.config.rope_scaling_orig_len or self.config.block_size
        self.config.rope_scaling, self.config.rope_scaling_orig_len = float(scale), int(orig_len)
        for block in self.transformer.h:
            block.attn.set_rope_scaling(self.config.rope_base, scale, orig_len)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with decay on 2-D weights (matmuls and the tied embedding, as in nanoGPT);
        norms, biases and PoPE's delta (2-D, but a phase, not a weight) are never decayed."""
        groups = [{"params": [], "weight_decay": weight_decay}, {"params": [], "weight_decay": 0.0}]
        for n, p in self.named_parameters():
            if p.requires_grad:
                groups[p.dim() < 2 or n.endswith("attn.delta")]["params"].append(p)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda" or None)

    def flops_per_token(self, T=None):
        """Training FLOPs per token (forward + backward = 3x forward), nanoGPT's count: 6N for the weights plus
        the attention matmuls. PoPE's QK^T runs over 2D-long vectors, so its attention costs (2D + D), not (D + D)."""
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, T or cfg.block_size
        return 6 * self.get_num_params() + 6 * L * H * ((2 if cfg.pos_emb == "pope" else 1) * Q + Q) * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=989e12):
        """FLOP/s achieved over peak_flops (H100/H200 dense bf16); fwdbwd_per_iter: sequences per step."""
        return self.flops_per_token() * self.config.block_size * fwdbwd_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_size=None, context=None,
                 mode="eager", times=None):
        """Sample max_new_tokens continuations of idx (B, T) on a KVCache of `context` positions (default
        block_size), then, once it is full, from the last `context` tokens at positions 0.. (a forward per token).
        Ids >= vocab_size are never drawn; temperature 0 or top_k=1 is greedy. mode "eager" runs the one-token
        step from Python, "graph" (CUDA) replays it as a CUDA graph, "compile" compiles it first (greedy tokens
        agree: bench.py check). times (a dict) gets the seconds of prefill, capture and decode."""
        device, N, (B, T0) = self.lm_head.weight.device, context or self.config.block_size, idx.shape
        if mode not in ("eager", "graph", "compile") or mode != "eager" and device.type != "cuda":
            raise ValueError(f"mode must be 'eager', or 'graph' or 'compile' on CUDA; got {mode!r} on {device}")
        if T0 > N:
            raise ValueError(f"the prompt has {T0} tokens, more than the context of {N}: crop it or raise the context")
        clock = lambda: (device.type == "cuda" and torch.cuda.synchronize(device), time.perf_counter())[1]  # noqa: E731
        t0, amp = clock(), torch.is_autocast_enabled(device.type)  # the cache holds what the attention computes in
        cache = KVCache(self, B, N, torch.get_autocast_dtype(device.type) if amp else self.lm_head.weight.dtype)
        out, tok = torch.cat([idx, idx.new_empty(B, max_new_tokens)], 1), idx.new_empty(B, 1)  # tok: the step's in/out

        def step(window=None):  # one token on the cache, or the forward over a window of tokens
            logits, _ = self(tok if window is None else window, cache=cache)
            tok.copy_(sample_next(logits[:, -1, :], temperature, top_k, vocab_size))

        step(idx)  # the prefill
        out[:, T0] = tok[:, 0]
        t1 = t2 = clock()
        run = step if mode == "eager" else None  # "graph", "compile": captured at the first step on the cache
        for t in range(T0 + 1, T0 + max_new_tokens):  # out[:, t - 1] goes in at position t - 1
            if t > N:  # the context is full
                cache.pos.zero_()
                step(out[:, t - N:t])
            else:
                if run is None:
                    run, t2 = cuda_graph(step, (cache.pos, tok), mode == "compile")[0], clock()
                run()
            out[:, t] = tok[:, 0]
        if times is not None:
            times.update(prefill=t1 - t0, capture=t2 - t1, decode=clock() - t2)
        return out

# -----------------------------------------------------------------------------
# checkpoints: the one reader (train.py's resume and fine-tune, sample.py, the eval scripts)

class CheckpointError(ValueError):
    """The file is not an intact train.py checkpoint; the message is one line, naming the file."""


def read_checkpoint(path, device="cpu"):
    """A train.py checkpoint's dict, read with weights_only=True (tensors and plain types, never code). Refused with
    CheckpointError: a missing or damaged file (each zip member's CRC is checked: torch.load does not), a file that
    would run code, anything but a train.py checkpoint, and non-finite weights (a diverged run)."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            raise CheckpointError(f"{path} is damaged: {bad} fails its CRC check; use an intact copy")
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(f"no checkpoint file {path}: train.py writes out_dir/ckpt.pt") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a checkpoint torch.save wrote, or it is cut short ({e})") from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} is refused: loading it would run code (train.py writes tensors and plain "
                              "types only)") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict) and isinstance(ckpt.get("model_args"), dict)):
        raise CheckpointError(f"{path} is not a train.py checkpoint (a dict with 'model' and 'model_args')")
    bad = [k for k, v in ckpt["model"].items() if not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{path} has NaN or inf weights ({bad[0]} and {len(bad) - 1} more): the run diverged")
    return ckpt


def load_checkpoint(path, device="cpu", **overrides):
    """(model in eval mode, checkpoint dict) from read_checkpoint; overrides replace GPTConfig fields."""
    ckpt = read_checkpoint(path, device)
    model = GPT(GPTConfig(**{**ckpt["model_args"], **overrides}))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    return model.to(device).eval(), ckpt


def cuda_graph(fn, state=(), compile=False, warmup=1):
    """fn() captured as one CUDA graph (compiled first with compile): (replay, what fn returned in the capture), the
    one capture helper of training and decoding. The warm-up calls run on a side stream (compilation, cuBLAS set-up,
    autocast's cache of cast weights); the tensors in state are put back as they were before them."""
    if compile:  # freezing folds the weights' casts once instead of running them at every step
        fn = torch.compile(fn, fullgraph=True, options={"freezing": True})
    saved = [t.detach().clone() for t in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for t, s in zip(state, saved):
            t.copy_(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def sample_next(logits, temperature=1.0, top_k=None, vocab_size=None):
    """One id per row of logits (B, V), never >= vocab_size; greedy at temperature 0 or top_k 1. Gumbel-max: argmax(logits
    / temperature - log E), E ~ Exp(1), draws from the softmax with no softmax and no host sync (a CUDA graph holds it)."""
    logits = logits[:, :vocab_size]  # a view: the ids past vocab_size (padding rows) are never drawn
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    ids = None
    if top_k is not None and top_k < logits.size(-1):
        logits, ids = torch.topk(logits, top_k)  # (B, k): the rest of the vocabulary is never looked at again
    log_e = torch.empty(logits.shape, device=logits.device).exponential_().clamp_(min=1e-30).log_()
    i = torch.add(logits, log_e, alpha=-temperature).argmax(dim=-1, keepdim=True)  # (T times the draw: same argmax)
    return i if ids is None else ids.gather(-1, i)


if __name__ == "__main__":  # (a module: run, it only says what it is)
    print(__doc__.strip() + "\n\n(model.py is a module: train.py, sample.py and the eval scripts import it)")
