"""nanoGPT's GPT with PoPE, RoPE or no positional embedding (GPTConfig.pos_emb). PoPE: the
section "PoPE" below; pope_kernel.py computes it in Triton."""

import math
import pickle
import time
import zipfile
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # needs Triton; else the PyTorch path
    import pope_kernel
except ImportError as e:
    pope_kernel = None
    KERNEL_MISSING = f"Triton is not importable: {e}"

CONFIG_RANGES = {  # name: (rule, what it must be); NaN fails every rule
    **dict.fromkeys(("block_size", "vocab_size", "n_layer", "n_head", "n_embd"),
                    (lambda v: v >= 1, ">= 1")),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "pope_base": (lambda v: 1 < v < math.inf, "> 1 and finite"),  # base^(-c/D) falls with c
    "rope_base": (lambda v: 1 < v < math.inf, "> 1 and finite"),
    "rope_scaling": (lambda v: 1 <= v < math.inf, ">= 1 and finite (1: off)"),
    "rope_scaling_orig_len": (lambda v: v >= 0, ">= 0 (0: block_size)"),
}

@dataclass
class GPTConfig:
    """The model's settings; train.py's RULES check the rest."""
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
    pope_delta_bound: str = "wrap"  # delta kept in [-2pi, 0] by "wrap" | "clamp" | "project"
    attn_impl: str = "auto"  # "auto" | "torch" (PyTorch) | "triton" (kernels): use_pope_kernel
    rope_scaling: float = 1.0  # YaRN, RoPE only: s > 1 stretches the context
    rope_scaling_orig_len: int = 0  # the context that s stretches (0 means block_size)

    def __post_init__(self):
        choices = dict(
            pos_emb=("pope", "rope", "none"),
            attn_impl=("auto", "torch", "triton"),
            pope_delta_init=("zero", "uniform"),
            pope_delta_bound=("wrap", "clamp", "project"),
        )
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name, (ok, want) in CONFIG_RANGES.items():
            if not ok(getattr(self, name)):
                raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head or self.pos_emb == "rope" and self.n_embd // self.n_head % 2:
            raise ValueError(
                f"n_embd={self.n_embd} must split into n_head={self.n_head} (even for RoPE)")
        if self.attn_impl == "triton" and self.pos_emb == "pope" and pope_kernel:
            if self.n_embd // self.n_head not in pope_kernel.HEAD_DIMS:
                raise ValueError(
                    f"attn_impl='triton' takes n_embd / n_head in {pope_kernel.HEAD_DIMS}")
        if self.rope_scaling > 1.0 and self.pos_emb != "rope":
            raise ValueError(
                f"rope_scaling must be 1 unless pos_emb='rope', got {self.rope_scaling}")

# PoPE (Gopalakrishnan et al., arXiv 2509.10534). Per head of dim D, on the raw q/k projections:
#     mu_q = softplus(q), mu_k = softplus(k)                     "what": content only
#     theta_c = base^(-c/D), c = 0..D-1                          D frequencies (RoPE: D/2)
#     phi_q(t) = t*theta_c,  phi_k(s) = s*theta_c + delta_c      "where": position only
#     a_ts = (1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s-t)*theta_c + delta_c)
# delta: a learned (H, D) phase bias per layer, kept in [-2pi, 0]. The score is the dot product of
# the 2D-long [mu cos(phi), mu sin(phi)]: pope_turn builds them (pope_cos_sin, pope_cartesian) for
# SDPA, in the forward and on generate()'s cache alike.
# Porting: pope_kernel.py takes theta and delta from pope_frequencies and pope_delta; the rest is
# copied in its @triton.jit helpers: _softplus (pope_magnitude; called by _cartesian_tile,
# _cartesian_grad and _decode_turn), _cos_sin (pope_cos_sin), _cartesian_tile and _cartesian_grad
# (pope_cartesian and its backward, d mu/dx = sigmoid(x): phases t*theta for queries, s*theta +
# delta for keys) and _relative_key (the decoding kernel's phase (s - t)*theta + delta on a cache
# of magnitudes). A variant: edit here, train with --attn_impl=torch, port it there. The tests'
# float64 references take mu from pope_magnitude (tests/helpers.py), so till the port only
# tests/test_kernel.py (on a GPU also tests/test_gpu.py) fails; new phases or scores need new ones.

# mu = softplus(x): a global, so a variant (or a test) can replace it
pope_magnitude = F.softplus

def pope_frequencies(D, base=10000.0, device=None, dtype=torch.float32):
    """theta_c = base^(-c/D), c = 0..D-1, rounded once from float64."""
    return torch.logspace(0, -(D - 1) / D, D, base=base, device=device,
                          dtype=torch.float64).to(dtype)

def pope_delta(delta, bound="wrap"):
    """delta as used, in [-2pi, 0]."""
    if bound == "wrap":
        return delta - math.tau * torch.ceil(delta.detach() / math.tau)
    return torch.clamp(delta, -math.tau, 0.0)

def pope_cos_sin(positions, theta, delta=None):
    """cos, sin of phi = positions * theta: (T, 2, D); with delta (keys): (H, T, 2, D)."""
    phase = positions.to(theta.dtype)[:, None] * theta
    if delta is not None:
        phase = phase + delta.to(theta.dtype)[..., None, :]
    return torch.stack([torch.cos(phase), torch.sin(phase)], dim=-2)

def pope_cartesian(x, cos_sin, raw=True):
    """[mu cos(phi), mu sin(phi)] (B, H, T, 2D); mu = pope_magnitude(x), or x if not raw."""
    mu = pope_magnitude(x.to(cos_sin.dtype)) if raw else x
    return (mu.unsqueeze(-2) * cos_sin).flatten(-2)

def pope_turn(q, k, q_pos, k_pos, theta, delta, dtype, raw_k=True):
    """PoPE's transform, its one home: q, k (raw_k=False: magnitudes) in Cartesian form at q_pos,
    k_pos."""
    q = pope_cartesian(q, pope_cos_sin(q_pos, theta)).to(dtype)
    k = pope_cartesian(k, pope_cos_sin(k_pos, theta, delta), raw_k).to(dtype)
    return q, k

def pope_attention_torch(q, k, v, delta, *, causal=True, base=10000.0, q_offset=0):
    """SDPA on pope_turn's q, k: pope_kernel.pope_attention's contract, and its reference."""
    D = q.size(-1)
    qpos = torch.arange(q_offset, q_offset + q.size(2), device=q.device)
    kpos = torch.arange(k.size(2), device=q.device)
    theta = pope_frequencies(D, base, q.device, torch.promote_types(q.dtype, torch.float32))
    mask = None
    if causal and (q_offset or q.size(2) != k.size(2)):
        mask = kpos[None, :] <= qpos[:, None]
    q, k = pope_turn(q, k, qpos, kpos, theta, delta, v.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=1.0 / math.sqrt(D))

# RoPE, with YaRN (arXiv 2309.00071) for longer contexts
def yarn_inv_freq(head_dim, base, scale, orig_len, beta_fast=32.0, beta_slow=1.0):
    """RoPE's frequencies, at scale > 1 YaRN's (its reference code), and the attention factor."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scale <= 1.0:
        return theta.float(), 1.0

    def pair_index(b):
        return head_dim * math.log(orig_len / (b * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim - 1)
    pairs = torch.arange(head_dim // 2, dtype=torch.float64)
    ramp = ((pairs - low) / max(high - low, 1e-3)).clamp(0.0, 1.0)
    theta = (1 - ramp) * theta + ramp * theta / scale
    return theta.float(), 0.1 * math.log(scale) + 1.0

def rope_cos_sin(inv_freq, positions):
    """apply_rope's cos and [-sin, sin] at positions: (T, D) each."""
    ang = positions.float()[:, None] * inv_freq
    cos = ang.cos()
    sin = ang.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

def apply_rope(x, cos, sin):
    """RoPE's rotation: x[i] + 1j x[i + D/2] times e^(1j angle_i)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([x2, x1], dim=-1) * sin.to(x.dtype)

# the model
def use_pope_kernel(attn_impl, q, k, v, delta, *, compiled=None, decoding=False):
    """The one rule, asked once a call (decoding: k, v are a KVCache's): (True, why) for
    pope_kernel.py, else (False, why). True with 'auto': the kernel takes it (pope_attention need
    not check again); with 'triton' the kernel checks and refuses."""
    if attn_impl == "torch":
        return False, "attn_impl='torch'"
    if pope_kernel is None and attn_impl == "triton":
        raise RuntimeError(f"attn_impl='triton' needs pope_kernel.py, but {KERNEL_MISSING}")
    if attn_impl == "auto" and not q.is_cuda:
        return False, f"attn_impl='auto' on {q.device.type}; the kernels run on CUDA"
    if compiled is None:
        compiled = torch.compiler.is_compiling()
    # compiled, past 1024 tokens the kernel does not win (RESULTS.md §5) unless deterministic
    # (results/kernel/determinism.json)
    if attn_impl == "auto" and compiled and not decoding and q.size(2) > 1024:
        if not torch.are_deterministic_algorithms_enabled():
            return False, ("attn_impl='auto', torch.compile, over 1024 tokens: the PyTorch path, "
                           "as fast or faster")
    if pope_kernel is None:
        why = KERNEL_MISSING
    elif decoding:
        why = pope_kernel.decode_unsupported_reason(k, v)
    else:
        why = pope_kernel.kernel_unsupported_reason(q, k, v, delta)
    if why is None:
        return True, f"attn_impl={attn_impl!r}"
    if attn_impl == "triton" and not decoding:
        return True, f"attn_impl={attn_impl!r}; it will refuse this input: {why}"
    return False, f"attn_impl={attn_impl!r}; the kernel does not take this input: {why}"

class KVCache:
    """generate()'s static cache, `context` slots a layer: it stores k, v and masks. pos advances in
    place (a CUDA graph replays)."""

    def __init__(self, model, B, context, dtype):
        cfg = model.config
        device = model.lm_head.weight.device
        attns = [b.attn for b in model.transformer.h]
        H = cfg.n_head
        D = cfg.n_embd // cfg.n_head
        self.k = [torch.zeros(B, H, context, D, device=device, dtype=dtype) for _ in attns]
        self.v = [torch.zeros_like(k) for k in self.k]
        k = self.k[0]
        self.kernel = use_pope_kernel(cfg.attn_impl, k, k, self.v[0], None, decoding=True)[0]
        self.slots = torch.arange(context, device=device)
        self.pos = torch.tensor(0, device=device)
        self.pos_emb = cfg.pos_emb
        self.dtype = dtype
        turn = {}  # the decoding kernel's arguments
        if self.kernel:  # launch picked once; counts: chunk tally
            turn = pope_kernel.decode_launch(k)
            turn["counts"] = torch.zeros(B * H, dtype=torch.int32, device=device)
        if cfg.pos_emb == "rope":
            self.inv_freq = attns[0].inv_freq
            turn["inv_freq"] = self.inv_freq
        self.turn = [turn] * cfg.n_layer
        if cfg.pos_emb == "pope":  # read once, in the phases' dtype
            phases = torch.promote_types(dtype, torch.float32)
            self.theta = pope_frequencies(D, cfg.pope_base, device, phases)
            self.delta = torch.stack([pope_delta(a.delta, a.delta_bound) for a in attns]).to(phases)
            self.turn = [dict(turn, theta=self.theta, delta=d) for d in self.delta]

    @staticmethod
    def nbytes(cfg, B, context, itemsize):
        """The bytes of __init__'s k and v."""
        return 2 * cfg.n_layer * B * context * cfg.n_embd * itemsize

    def start(self, T):
        """Before the layers: positions, mask, RoPE's rotation."""
        if T == 1:
            self.positions = self.pos.view(1)  # (pos advances after the layers)
        else:
            self.positions = self.pos + self.slots[:T]
        if T > 1 or not self.kernel:  # (T, context): the slots past each query masked
            mask = torch.where(self.slots > self.positions[:, None], -math.inf, 0.0)
            self.bias = mask.to(self.dtype)
            if self.pos_emb == "rope":
                rotation = rope_cos_sin(self.inv_freq, self.positions)
                self.rotation = [r.to(self.dtype) for r in rotation]

    def write(self, layer, k, v):
        """k, v into the layer's slots; the whole caches back."""
        k = self.k[layer].index_copy_(2, self.positions, k.to(self.dtype))
        v = self.v[layer].index_copy_(2, self.positions, v)
        return k, v

class CausalSelfAttention(nn.Module):
    """Causal self-attention with config.pos_emb."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.pos_emb = config.pos_emb
        self.attn_impl = config.attn_impl
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hooks: q and k as projected (eval_frequencies.py)
        self.q_probe = nn.Identity()
        self.k_probe = nn.Identity()
        self.scale = 1.0 / math.sqrt(self.head_dim)  # RoPE's: set_rope_scaling
        if self.pos_emb == "pope":  # the keys' phase bias (init: GPT)
            self.delta = nn.Parameter(torch.zeros(config.n_head, self.head_dim))
            self.delta_bound = config.pope_delta_bound
            self.pope_base = config.pope_base
            theta = pope_frequencies(self.head_dim, config.pope_base)
            self.register_buffer("theta", theta, persistent=False)

    def forward(self, x, cache=None):
        """Causal attention over x (B, T, C), or on a KVCache."""
        B, T, C = x.size()
        # as 3H heads: the form compiled right and fast (results/kernel/qkv-forms)
        qkv = self.c_attn(x).view(B, T, 3 * self.n_head, -1).transpose(1, 2)
        q, k, v = qkv.split(self.n_head, 1)
        q = self.q_probe(q)  # (B, H, T, D)
        k = self.k_probe(k)
        if cache is not None:
            y = self.attend_cached(q, k, v, cache)
        elif self.pos_emb == "pope":
            delta = pope_delta(self.delta, self.delta_bound)
            if use_pope_kernel(self.attn_impl, q, k, v, delta)[0]:
                # 'auto' asked the kernel's check already; 'triton' lets the kernel refuse
                checked = self.attn_impl == "auto"
                y = pope_kernel.pope_attention(q, k, v, delta, self.theta, checked=checked)
            else:
                y = pope_attention_torch(q, k, v, delta, base=self.pope_base)
        else:
            if self.pos_emb == "rope":
                cos, sin = rope_cos_sin(self.inv_freq, torch.arange(T, device=x.device))
                q = apply_rope(q, cos, sin)
                k = apply_rope(k, cos, sin)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

    def attend_cached(self, q, k, v, cache):
        """q, k turned, k, v written, the slots up to each query read (one token: by the kernel)."""
        i = self.layer_idx
        if q.size(2) == 1 and cache.kernel:
            return pope_kernel.decode_attention(
                q, k, v, cache.k[i], cache.v[i], cache.positions, self.scale, **cache.turn[i])
        if self.pos_emb == "rope":
            q = apply_rope(q, *cache.rotation)
            k = apply_rope(k, *cache.rotation)
        if self.pos_emb == "pope":
            k = pope_magnitude(k.to(cache.theta.dtype))
        k, v = cache.write(i, k, v)
        if self.pos_emb == "pope":
            q, k = pope_turn(q, k, cache.positions, cache.slots, cache.theta, cache.delta[i],
                             v.dtype, raw_k=False)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=cache.bias, scale=self.scale)

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
    """nanoGPT's GPT-2 with RMSNorm and config.pos_emb."""

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
        for m in self.modules():  # GPT-2's init
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):  # GPT-2's scaled init of residual projections
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            if pn.endswith("attn.delta") and config.pope_delta_init == "uniform":
                torch.nn.init.uniform_(p, -math.tau, 0.0)
        if config.pos_emb == "rope":
            self.set_rope_scaling(config.rope_scaling)

    @torch.no_grad()
    def project_delta_(self):
        """pope_delta_bound="project": train.py clamps delta after every step."""
        if self.config.pos_emb == "pope" and self.config.pope_delta_bound == "project":
            for block in self.transformer.h:
                block.attn.delta.clamp_(-math.tau, 0.0)

    def cast_weights_(self, dtype):
        """Weights in dtype for decoding without autocast; delta stays float32."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.RMSNorm)):
                m.to(dtype)
        return self

    def get_num_params(self):
        """The parameter count (the tied embedding once)."""
        return sum(p.numel() for p in self.parameters())

    def attention_path(self, device=None, compiled=False, T=None, decoding=False):
        """For logs: use_pope_kernel's choice and why."""
        cfg = self.config
        if cfg.pos_emb != "pope":
            return f"{cfg.pos_emb}: PyTorch SDPA (model.py)"
        shape = (1, cfg.n_head, T or cfg.block_size, cfg.n_embd // cfg.n_head)
        dtype = self.cache_dtype() if decoding else None
        q = torch.zeros((), device=device or self.lm_head.weight.device, dtype=dtype).expand(shape)
        kernel, why = use_pope_kernel(
            cfg.attn_impl, q, q, q, q[0, :, 0], compiled=compiled, decoding=decoding)
        path = "the PyTorch path of model.py"
        if kernel:
            path = "the kernel of pope_kernel.py"
        return f"pope: {path} ({why})"

    def cache_dtype(self):
        """generate()'s cache dtype: the attention's."""
        dev = self.lm_head.weight.device.type
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
        return self.lm_head.weight.dtype

    def forward(self, idx, targets=None, loss_mask=None, cache=None):
        """Logits and the loss, its mean where loss_mask != 0."""
        x = self.transformer.drop(self.transformer.wte(idx))
        if cache is not None:
            cache.start(idx.size(1))
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None:
            cache.pos += idx.size(1)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # a slice: no index tensor to copy in a graph
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), reduction="none")
        if loss_mask is None:
            return logits, loss.mean()
        m = loss_mask.reshape(-1).to(loss.dtype)
        return logits, (loss * m).sum() / m.sum().clamp(min=1.0)

    def set_rope_scaling(self, scale, orig_len=None):
        """YaRN on (scale > 1) or off (1.0), also at eval time."""
        cfg = self.config
        D = cfg.n_embd // cfg.n_head
        if cfg.pos_emb != "rope" or scale < 1.0:
            raise ValueError(
                f"rope_scaling (YaRN) must be >= 1 and is for pos_emb='rope' only; got {scale}")
        cfg.rope_scaling = float(scale)
        cfg.rope_scaling_orig_len = int(orig_len or cfg.rope_scaling_orig_len)
        orig_len = cfg.rope_scaling_orig_len or cfg.block_size
        inv_freq, mscale = yarn_inv_freq(D, cfg.rope_base, scale, orig_len)
        for block in self.transformer.h:
            inv = inv_freq.to(self.lm_head.weight.device)
            block.attn.register_buffer("inv_freq", inv, persistent=False)
            block.attn.scale = mscale ** 2 / math.sqrt(D)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW, decaying the matrices only (not delta)."""
        decay = []
        no_decay = []
        for n, p in self.named_parameters():
            if not p.requires_grad:
                continue
            if p.dim() < 2 or n.endswith("attn.delta"):
                no_decay.append(p)
            else:
                decay.append(p)
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        fused = True if device_type == "cuda" else None
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    def flops_per_token(self, T=None):
        """nanoGPT's 6N + attention; PoPE's QK^T is over 2D."""
        cfg = self.config
        L = cfg.n_layer
        H = cfg.n_head
        Q = cfg.n_embd // cfg.n_head
        T = T or cfg.block_size
        qk = 2 * Q if cfg.pos_emb == "pope" else Q
        return 6 * self.get_num_params() + 6 * L * H * (qk + Q) * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=989e12):
        """MFU; peak_flops: H100/H200 dense bf16."""
        return self.flops_per_token() * self.config.block_size * fwdbwd_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(
        self,
        idx,
        max_new_tokens,
        temperature=1.0,
        top_k=None,
        vocab_size=None,
        context=None,
        mode="eager",
        times=None,
    ):
        """max_new_tokens after idx, on a KVCache of `context` slots; mode "eager", or on CUDA
        "graph" ("compile": compiled first)."""
        device = self.lm_head.weight.device
        N = context or self.config.block_size
        B, T0 = idx.shape
        if mode not in ("eager", "graph", "compile") or mode != "eager" and device.type != "cuda":
            raise ValueError(
                f"mode must be 'eager', or on CUDA 'graph' or 'compile'; got {mode!r}, {device}")
        if T0 > N:
            raise ValueError(
                f"the prompt has {T0} tokens, more than the context of {N}: crop it or raise it")

        def clock():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return time.perf_counter()

        cache = KVCache(self, B, N, self.cache_dtype())
        t0 = clock()
        out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], 1)
        tok = idx.new_empty(B, 1)  # each step's in and out

        def step(window=None):
            logits, _ = self(tok if window is None else window, cache=cache)
            tok.copy_(sample_next(logits[:, -1, :], temperature, top_k, vocab_size))

        step(idx)  # the prefill
        out[:, T0] = tok[:, 0]
        t1 = t2 = clock()
        run = step if mode == "eager" else None  # else captured at the first step
        for t in range(T0 + 1, T0 + max_new_tokens):  # out[:, t - 1] goes in at position t - 1
            if t > N:  # the context is full
                cache.pos.zero_()
                step(out[:, t - N:t])
            else:
                if run is None:
                    run = cuda_graph(step, (cache.pos, tok), mode == "compile")[0]
                    t2 = clock()
                run()
            out[:, t] = tok[:, 0]
        if times is not None:
            times.update(prefill=t1 - t0, capture=t2 - t1, decode=clock() - t2)
        return out

def sample_next(logits, temperature=1.0, top_k=None, vocab_size=None):
    """The next ids (B, 1) by Gumbel-max: no host sync (CUDA-graph safe)."""
    logits = logits[:, :vocab_size]  # a view: padding ids never drawn
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    ids = None
    if top_k is not None and top_k < logits.size(-1):
        logits, ids = torch.topk(logits, top_k)
    log_e = torch.empty(logits.shape, device=logits.device).exponential_().clamp_(min=1e-30).log_()
    i = torch.add(logits, log_e, alpha=-temperature).argmax(dim=-1, keepdim=True)
    return i if ids is None else ids.gather(-1, i)

def cuda_graph(fn, state=(), compile=False, warmup=1):
    """(replay, output): fn warmed on a side stream, state restored, captured."""
    if compile:  # freezing folds the weights' casts once
        fn = torch.compile(fn, fullgraph=True, options={"freezing": True})
    saved = [t.detach().clone() for t in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    for t, s in zip(state, saved):
        t.detach().copy_(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out

# checkpoints: the one reader
class CheckpointError(ValueError):
    """Not an intact train.py checkpoint."""

def all_finite(t):
    """No NaN or inf in t, from its min and max: one pass, no copy."""
    return t.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())

def read_checkpoint(path):
    """A train.py checkpoint on the CPU (weights_only), its CRCs checked first."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise CheckpointError(
                    f"{path} is damaged: {bad} fails its CRC check; use an intact copy")
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # read as used
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(
            f"no checkpoint file {path}: train.py writes out_dir/ckpt.pt") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError) as e:
        raise CheckpointError(
            f"{path} is not a checkpoint torch.save wrote, or is cut short ({e})") from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} is refused: loading it would run code") from None
    if not isinstance(ckpt, dict) or not all(isinstance(ckpt.get(k), dict)
                                             for k in ("model", "model_args")):
        raise CheckpointError(
            f"{path} is not a train.py checkpoint (a dict with 'model' and 'model_args')")
    bad = [k for k, v in ckpt["model"].items() if not all_finite(v)]
    if bad:
        raise CheckpointError(
            f"{path} has NaN or inf weights ({bad[0]}, {len(bad) - 1} more): it diverged")
    return ckpt

def load_checkpoint(path, device="cpu", **overrides):
    """(model in eval mode, checkpoint); overrides: GPTConfig's."""
    ckpt = read_checkpoint(path)
    try:
        config = GPTConfig(**{**ckpt["model_args"], **overrides})
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    with torch.device(device):  # the random init runs there: on a GPU, fast
        model = GPT(config)
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    return model.to(device).eval(), ckpt
