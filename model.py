"""
A GPT language model with a switch between PoPE, RoPE and no positional
embedding (NoPE), in the style of nanoGPT. PoPE's math is in this file, in
plain PyTorch, top to bottom as the paper writes it (section "PoPE" below);
pope_kernel.py holds a fused Triton kernel that computes the same attention.

Usage (as a library):
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(pos_emb="pope"))
    logits, loss = model(idx, targets)
    model, ckpt = load_checkpoint("out/ckpt.pt", device="cuda")
"""

import inspect
import math
import os
import warnings
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # the fused kernel needs Triton; without it the PyTorch path below runs everywhere
    import pope_kernel
    KERNEL_IMPORT_ERROR = None
except ImportError as e:
    pope_kernel, KERNEL_IMPORT_ERROR = None, e

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
    attn_impl: str = "auto"  # PoPE only: "auto" (the kernel on CUDA) | "torch" (the code below) | "triton"
    # YaRN for RoPE (arXiv 2309.00071): scale s > 1 stretches the context by s
    # relative to rope_scaling_orig_len (0 means block_size). 1.0 is plain RoPE.
    rope_scaling: float = 1.0
    rope_scaling_orig_len: int = 0

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
# PoPE (Gopalakrishnan et al., arXiv 2509.10534). Per head of dim D, on the raw
# q/k projections:
#     mu_q = softplus(q), mu_k = softplus(k)                     "what": content only
#     theta_c = base^(-c/D), c = 0..D-1                          D frequencies (RoPE: D/2)
#     phi_q(t) = t*theta_c,  phi_k(s) = s*theta_c + delta_c      "where": position only
#     a_ts = (1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s-t)*theta_c + delta_c)
# delta is a learned (H, D) phase bias per layer, kept in [-2pi, 0]. The score
# is the real dot product of the 2D-long vectors [mu cos(phi), mu sin(phi)], so
# the PyTorch path builds those and calls SDPA. Values, softmax and the causal
# mask are unchanged.
#
# The fused kernel (pope_kernel.py) computes the same thing from the same
# inputs: its @triton.jit helpers _softplus (magnitudes), _cos_sin and
# _cartesian_tile (phases and the Cartesian vectors) and _cartesian_grad (their
# backward) are its copy of pope_frequencies/pope_cartesian below, and it takes
# delta already bounded by pope_delta. To try a variant: edit this section, run
# with --attn_impl=torch (the PyTorch path, on any device), and only then port
# the change to those helpers; tests/test_kernel.py fails while the two differ.

def pope_frequencies(D, base=10000.0, device=None, dtype=torch.float32):
    """theta_c = base^(-c/D) for c = 0..D-1, rounded once from float64."""
    return (base ** (-torch.arange(D, device=device, dtype=torch.float64) / D)).to(dtype)


def pope_delta(delta, bound="wrap"):
    """The phase bias the attention uses, in [-2pi, 0] as the paper asks.

    cos is 2pi-periodic and [-2pi, 0] is one period, so every phase has a value
    in the range. "wrap" (default) maps the parameter into (-2pi, 0] modulo 2pi:
    the score is a smooth function of the parameter, whose gradient is never cut.
    "clamp" (torch.clamp) has zero gradient outside the range; from the language
    models' zero init, AdamW's first steps push most entries above 0, where they
    stay, frozen at 0. "project" clamps here too, and train.py clamps the
    parameter back in place after every step (GPT.project_delta_), so entries
    keep a gradient but sit pinned at the edge. RESULTS.md, section 7, compares them."""
    if bound == "wrap":
        return delta - TWO_PI * torch.ceil(delta.detach() / TWO_PI)
    return torch.clamp(delta, -TWO_PI, 0.0)


def pope_cartesian(x, positions, delta=None, base=10000.0, is_mu=False):
    """[mu cos(phi), mu sin(phi)], shape (B, H, T, 2D), computed in float32 (float64
    for float64 input). x: (B, H, T, D) raw projection, or mu itself with is_mu;
    positions: (T,); delta: (H, D) for keys, None for queries."""
    D = x.size(-1)
    cdtype = torch.promote_types(x.dtype, torch.float32)
    theta = pope_frequencies(D, base, x.device, cdtype)
    phase = positions.to(cdtype)[:, None] * theta[None, :]  # (T, D)
    if delta is not None:
        phase = phase + delta.to(cdtype)[:, None, :]  # (H, T, D)
    mu = x.to(cdtype) if is_mu else F.softplus(x.to(cdtype))
    return torch.cat([mu * torch.cos(phase), mu * torch.sin(phase)], dim=-1)


def pope_attention_torch(q, k, v, delta, *, causal=True, sm_scale=None, base=10000.0, q_offset=0, k_is_mu=False):
    """PoPE attention in plain PyTorch: Cartesian 2D-long q and k, then SDPA.

    q: (B, H, Tq, D); k, v: (B, H, Tk, D); delta: (H, D), used as given (bound it
    with pope_delta first). Query row i sits at position q_offset + i, key row j
    at j. k_is_mu says k already holds mu_k (the KV cache stores it). Never builds
    a (Tq, Tk, D) tensor; the 2D vectors are cast to v's dtype so that SDPA runs
    its fused kernels under bf16."""
    D = q.size(-1)
    qpos = torch.arange(q_offset, q_offset + q.size(2), device=q.device)
    kpos = torch.arange(k.size(2), device=q.device)
    qc = pope_cartesian(q, qpos, None, base).to(v.dtype)
    kc = pope_cartesian(k, kpos, delta, base, is_mu=k_is_mu).to(v.dtype)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    return sdpa_with_offset(qc, kc, v, causal=causal, scale=scale, q_offset=q_offset)


def sdpa_with_offset(q, k, v, *, causal=True, scale=None, q_offset=0):
    """scaled_dot_product_attention where query row i sits at position q_offset+i.

    SDPA's own is_causal aligns the mask top-left, which is wrong once Tq != Tk,
    so any offset case gets an explicit boolean mask."""
    Tq, Tk = q.size(-2), k.size(-2)
    if not causal or q_offset >= Tk - 1 and Tq == 1:  # decoding sees every key
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if q_offset == 0 and Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    mask = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(Tq, device=q.device)[:, None] + q_offset
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# -----------------------------------------------------------------------------
# RoPE, with YaRN (Peng et al., arXiv 2309.00071) for longer contexts

def yarn_inv_freq(head_dim, base, scale, orig_len, beta_fast=32.0, beta_slow=1.0):
    """RoPE inverse frequencies under YaRN, and the logit factor mscale^2.

    Pair i has theta_i = base^(-2i/D). YaRN's published form (its reference code and
    Hugging Face transformers'): the pair index where theta_i makes b rotations
    over the original context is d(b) = D ln(L0 / (2 pi b)) / (2 ln base); with
    low = max(floor(d(beta_fast)), 0) and high = min(ceil(d(beta_slow)), D - 1),
    the ramp gamma_i = clip((i - low) / (high - low), 0, 1) over the pair index
    gives theta_i' = (1 - gamma_i) theta_i + gamma_i theta_i / s: fast pairs are
    kept, slow ones interpolated. Logits are multiplied by mscale^2 with mscale =
    0.1 ln(s) + 1 (YaRN's sqrt(1/t)). At s = 1 this is plain RoPE."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scale <= 1.0:
        return theta.float(), 1.0

    def pair_index(rotations):
        return head_dim * math.log(orig_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0.0, 1.0)
    theta = (1 - ramp) * theta + ramp * theta / scale
    return theta.float(), 0.1 * math.log(scale) + 1.0


def apply_rope(x, inv_freq, pos0=0):
    """Rotate (B, H, T, D) by positions pos0..pos0+T-1 (pos0 an int or a 0-dim
    tensor); pairs are (x[:D/2], x[D/2:])."""
    pos = torch.arange(x.size(-2), device=x.device, dtype=torch.float32) + pos0
    ang = pos[:, None] * inv_freq.to(x.device)[None, :]  # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# -----------------------------------------------------------------------------
# the model

class KVCache:
    """Per-layer key/value cache for generate(), in the dtype the attention
    computes in. For PoPE the keys are stored as magnitudes mu_k = softplus(k):
    D numbers per position, as many bytes as a RoPE cache; their phases follow
    from the absolute positions. For RoPE the keys are stored rotated.

    pos counts the positions filled. With static=True, one-token steps instead
    write at the position held by the 0-dim tensor pos_t and attend over the
    whole cache with a mask: every step has the same shapes and addresses, so a
    step can be compiled and replayed as a CUDA graph."""

    def __init__(self, n_layer, B, H, T_max, D, device, dtype, static=False):
        self.k = [torch.zeros(B, H, T_max, D, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(B, H, T_max, D, device=device, dtype=dtype) for _ in range(n_layer)]
        self.pos = 0
        self.static = static
        self.pos_t = torch.zeros((), dtype=torch.long, device=device)
        for t in self.k + self.v + [self.pos_t]:
            torch._dynamo.mark_static_address(t)  # CUDA graphs may update them in place

    def update_static(self, layer, k, v):
        """Write one position at pos_t; return the whole cache."""
        self.k[layer].index_copy_(2, self.pos_t.view(1), k)
        self.v[layer].index_copy_(2, self.pos_t.view(1), v)
        return self.k[layer], self.v[layer]

    def update(self, layer, k, v):
        T = k.size(2)
        self.k[layer][:, :, self.pos:self.pos + T] = k
        self.v[layer][:, :, self.pos:self.pos + T] = v
        return self.k[layer][:, :, :self.pos + T], self.v[layer][:, :, :self.pos + T]


def kernel_unsupported_reason(q, k, v, delta):
    if pope_kernel is None:
        return f"Triton is not importable: {KERNEL_IMPORT_ERROR}"
    return pope_kernel.kernel_unsupported_reason(q, k, v, delta)


def use_pope_kernel(attn_impl, q, k, v, delta):
    """(True, None) to run the fused kernel, or (False, why not)."""
    if attn_impl == "torch":
        return False, "attn_impl='torch'"
    reason = kernel_unsupported_reason(q, k, v, delta)
    if attn_impl == "triton" and pope_kernel is None:
        raise RuntimeError(f"attn_impl='triton' needs the PoPE kernel, but {reason}")
    if attn_impl == "triton" or (reason is None and q.is_cuda):
        return True, None  # attn_impl='triton' with unsupported input: pope_attention raises why
    return False, reason or "not a CUDA tensor"


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.pos_emb = config.pos_emb
        self.attn_impl = config.attn_impl
        self.pope_base = config.pope_base
        self.delta_bound = config.pope_delta_bound
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hook points (identities, no weights): each head's q and k as projected, before RoPE or a cache;
        # analysis scripts (eval_frequencies.py) read the attention's own q/k through forward hooks on these
        self.q_probe, self.k_probe = nn.Identity(), nn.Identity()
        self.scale = 1.0 / math.sqrt(self.head_dim)
        if self.pos_emb == "pope":  # the keys' learned phase bias (initialised in GPT.__init__)
            self.delta = nn.Parameter(torch.zeros(config.n_head, self.head_dim))
        if self.pos_emb == "rope":
            self.set_rope_scaling(config.rope_base, config.rope_scaling,
                                  config.rope_scaling_orig_len or config.block_size)
        self._warned = False

    def set_rope_scaling(self, base, scale, orig_len):
        inv_freq, mscale = yarn_inv_freq(self.head_dim, base, scale, orig_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scale = mscale ** 2 / math.sqrt(self.head_dim)

    def pope(self, q, k, v, q_offset, k_is_mu):
        delta = pope_delta(self.delta, self.delta_bound)
        kernel, why = use_pope_kernel(self.attn_impl, q, k, v, delta)
        if not kernel and q.is_cuda and self.attn_impl == "auto" and not self._warned:
            warnings.warn(f"PoPE Triton kernel not used ({why}); running the PyTorch path of model.py")
            self._warned = True
        fn = pope_kernel.pope_attention if kernel else pope_attention_torch
        return fn(q, k, v, delta, causal=True, base=self.pope_base, q_offset=q_offset, k_is_mu=k_is_mu)

    def forward(self, x, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.q_probe(q), self.k_probe(k)
        static = cache is not None and cache.static
        pos0 = 0 if cache is None else cache.pos_t if static else cache.pos
        if self.pos_emb == "rope":
            q, k = apply_rope(q, self.inv_freq, pos0), apply_rope(k, self.inv_freq, pos0)
        k_is_mu = False
        if cache is not None:
            if self.pos_emb == "pope":
                k, k_is_mu = F.softplus(k.float()).to(k.dtype), True
            k, v = cache.update_static(self.layer_idx, k, v) if static else cache.update(self.layer_idx, k, v)
        if static:  # one query at pos_t against the whole cache: keys past it masked out
            visible = (torch.arange(k.size(2), device=k.device) <= pos0)[None, :]
            if self.pos_emb == "pope":  # the Cartesian 2D-long q and k, as pope_attention_torch builds them
                kpos = torch.arange(k.size(2), device=k.device)
                delta = pope_delta(self.delta, self.delta_bound)
                q = pope_cartesian(q, pos0.view(1), None, self.pope_base).to(v.dtype)
                k = pope_cartesian(k, kpos, delta, self.pope_base, is_mu=True).to(v.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=self.scale)
        elif self.pos_emb == "pope":
            y = self.pope(q, k, v, pos0, k_is_mu)
        else:
            y = sdpa_with_offset(q, k, v, causal=True, scale=self.scale, q_offset=pos0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


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
        """pope_delta_bound="project": clamp every delta parameter into [-2pi, 0] in
        place; train.py calls this after each optimizer step. A no-op otherwise."""
        if self.config.pos_emb == "pope" and self.config.pope_delta_bound == "project":
            for block in self.transformer.h:
                block.attn.delta.clamp_(-TWO_PI, 0.0)

    def get_num_params(self):
        """Parameter count (the tied embedding counted once; there is no position table)."""
        return sum(p.numel() for p in self.parameters())

    def attention_path(self, device=None):
        """One line for logs: which attention code runs on `device` (default: where
        the weights are), and why."""
        cfg = self.config
        device = torch.device(device or self.lm_head.weight.device)
        if cfg.pos_emb != "pope":
            return f"{cfg.pos_emb}: PyTorch SDPA (model.py)"
        if cfg.attn_impl == "torch":
            return "pope: the PyTorch path of model.py (attn_impl='torch')"
        D = cfg.n_embd // cfg.n_head
        probe = torch.zeros(1, cfg.n_head, 1, D, device=device)
        why = kernel_unsupported_reason(probe, probe, probe, probe[0, :, 0])
        if cfg.attn_impl == "triton":
            return "pope: the fused Triton kernel of pope_kernel.py (attn_impl='triton')" + (
                f"; it will refuse this input: {why}" if why else "")
        if device.type != "cuda":
            return f"pope: the PyTorch path of model.py (attn_impl='auto' on {device.type}; the kernel runs on CUDA)"
        if why is None:
            return ("pope: the fused Triton kernel of pope_kernel.py (attn_impl='auto' on CUDA; "
                    "--attn_impl=torch runs model.py's PyTorch path)")
        return f"pope: the PyTorch path of model.py (attn_impl='auto'; the kernel does not take this model: {why})"

    def forward(self, idx, targets=None, loss_mask=None, cache=None):
        """idx (B, T) token ids. With targets (B, T) returns all logits and the mean
        cross-entropy over the positions where loss_mask (B, T) is nonzero (all
        positions without a mask). Without targets, returns the last position's
        logits only (inference)."""
        x = self.transformer.drop(self.transformer.wte(idx))
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None and not cache.static:  # (a static step's position is advanced by its caller)
            cache.pos += idx.size(1)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none")
        if loss_mask is None:
            loss = loss.mean()
        else:
            m = loss_mask.reshape(-1).to(loss.dtype)
            loss = (loss * m).sum() / m.sum().clamp(min=1.0)
        return logits, loss

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
            block.attn.inv_freq = block.attn.inv_freq.to(self.lm_head.weight.device)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with decay on 2-D weights (matmuls and the tied embedding, as in
        nanoGPT); norms, biases and PoPE's delta (2-D, but a phase, not a weight)
        are never decayed."""
        params = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in params.items() if p.dim() >= 2 and not n.endswith("attn.delta")]
        no_decay = [p for n, p in params.items() if p.dim() < 2 or n.endswith("attn.delta")]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        use_fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))

    def flops_per_token(self, T=None):
        """Training FLOPs per token (forward + backward = 3x forward), nanoGPT's
        count: 6N for the weights plus the attention matmuls. PoPE's QK^T runs
        over 2D-long vectors, so its attention costs (2D + D) instead of (D + D)."""
        cfg = self.config
        N = self.get_num_params()
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, T or cfg.block_size
        qk = 2 * Q if cfg.pos_emb == "pope" else Q
        return 6 * N + 6 * L * H * (qk + Q) * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=989e12):
        """Model FLOPs utilisation: achieved FLOP/s over peak_flops (default: the
        H100/H200 dense bf16 datasheet number). fwdbwd_per_iter = sequences per step."""
        T = self.config.block_size
        return self.flops_per_token(T) * T * fwdbwd_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_size=None, compile=False):
        """Sample max_new_tokens continuations of idx (B, T) with a KV cache.

        Only ids below vocab_size (the dataset's, default the model's) are ever
        drawn: the padding rows of a padded vocabulary are never sampled.
        temperature 0 or top_k=1 is greedy. Past block_size the context is
        cropped to the last block_size tokens, exactly as recomputing from
        scratch would see it: positions restart at 0, so the cache is rebuilt
        from the cropped context at every such step (slower, but identical to
        the uncached model). The cache holds the dtype the attention computes
        in (bf16 under bf16 autocast). compile=True (CUDA) runs each one-token
        step on a static cache, compiled and replayed as a CUDA graph (the
        gpt-fast recipe); the prompt is still processed eagerly."""
        cfg = self.config
        B, D = idx.size(0), cfg.n_embd // cfg.n_head
        device = self.lm_head.weight.device
        if compile and device.type != "cuda":
            raise ValueError("generate(compile=True) replays CUDA graphs and needs the model on a CUDA device")
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) \
            else self.lm_head.weight.dtype
        step = self._compiled_step() if compile else self
        cache = None
        with decode_sdpa_backends(device):
            for _ in range(max_new_tokens):
                if cache is None or cache.pos + 1 > cfg.block_size:
                    cache = KVCache(cfg.n_layer, B, cfg.n_head, cfg.block_size, D, device, dtype)
                    logits, _ = self(idx[:, -cfg.block_size:], cache=cache)
                elif compile:
                    cache.static = True
                    cache.pos_t.fill_(cache.pos)
                    # a fresh (B, 1) tensor: a view of idx would change its strides (and recompile) every step
                    logits, _ = step(idx[:, -1:].clone(memory_format=torch.contiguous_format), cache=cache)
                    cache.static, cache.pos = False, cache.pos + 1
                else:
                    logits, _ = self(idx[:, -1:], cache=cache)
                idx = torch.cat((idx, sample_next(logits[:, -1, :], temperature, top_k, vocab_size)), dim=1)
        return idx

    def _compiled_step(self):
        if getattr(self, "_step", None) is None:
            self._step = torch.compile(self, mode="reduce-overhead", fullgraph=True, dynamic=False)
        return self._step


def decode_sdpa_backends(device):
    """SDPA without its cuDNN backend while decoding on CUDA: cuDNN builds a plan
    for every new key length, which made each decoding step a new shape costing
    tens of ms (about 20 instead of 110+ tokens/s, 124M on an H200)."""
    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def sample_next(logits, temperature=1.0, top_k=None, vocab_size=None):
    """One token id per row of logits (B, V): ids >= vocab_size never; greedy
    when temperature is 0 or top_k is 1."""
    logits = logits.float()
    if vocab_size is not None and vocab_size < logits.size(-1):
        logits[:, vocab_size:] = -float("inf")
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float("inf")
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


class CheckpointError(ValueError):
    """A file that is not an intact train.py checkpoint; the message is one line."""


def check_checkpoint_file(path):
    """Refuse (CheckpointError) a checkpoint file that is empty, not a zip archive
    (the format torch.save writes) or damaged: every member's CRC-32 is checked, so
    a flipped byte in the tensor data is caught before anything loads it (testzip
    reads the file once: about a second for a 124M checkpoint with its optimizer).
    FileNotFoundError when there is no such file. train.py, load_checkpoint and so
    every script that reads a checkpoint call it before torch.load."""
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file (train.py writes out_dir/ckpt.pt)")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): a copy or save that did not finish; use an intact copy")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path} is not a checkpoint torch.save wrote, or it is cut short ({e})") from None
    if bad is not None:
        raise CheckpointError(f"{path} is corrupt: {bad} fails its CRC-32 check (a damaged disk or copy); "
                              "use an intact copy")


def _describe(obj):
    if isinstance(obj, torch.Tensor):
        return f"a bare tensor of shape {tuple(obj.shape)}"
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return f"a bare state_dict ({len(obj)} tensors such as {next(iter(obj))!r})"
    if isinstance(obj, dict):
        return f"a dict with the keys {sorted(map(str, obj))[:8]}"
    return f"a {type(obj).__name__}"


def checkpoint_model_args(ckpt, path="the file"):
    """A train.py checkpoint's model_args (CheckpointError, naming what path holds,
    for anything else). Checkpoints written before pope_delta_bound existed were
    trained with the clamp, so they get it: their delta reads as trained."""
    if not (isinstance(ckpt, dict) and all(isinstance(ckpt.get(k), dict) for k in ("model", "model_args"))):
        raise CheckpointError(f"{path} holds {_describe(ckpt)}, not a train.py checkpoint (a dict with the weights "
                              "under 'model' and the model's settings under 'model_args')")
    return {"pope_delta_bound": "clamp", **ckpt["model_args"]}


def load_checkpoint(path, device="cpu", **overrides):
    """Load a train.py checkpoint: returns (model in eval mode, checkpoint dict).
    overrides replace GPTConfig fields (e.g. attn_impl="torch"). The file is read
    with weights_only=True: tensors and plain types, never code; a damaged file is
    refused first (check_checkpoint_file)."""
    try:
        check_checkpoint_file(path)
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {path} not found; train one with train.py (it writes out_dir/ckpt.pt)") from None
    model_args = checkpoint_model_args(ckpt, path)
    valid = {f.name for f in fields(GPTConfig)}
    unknown = set(overrides) - valid
    if unknown:
        raise ValueError(f"unknown GPTConfig fields {sorted(unknown)}; valid: {sorted(valid)}")
    model_args.update(overrides)
    model = GPT(GPTConfig(**model_args))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    return model.to(device).eval(), ckpt
