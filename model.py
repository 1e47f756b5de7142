"""
A GPT language model with a switch between PoPE, RoPE and no positional
embedding (NoPE), in the style of nanoGPT.

PoPE (Gopalakrishnan et al., arXiv 2509.10534) decouples "what" and "where":
per head of dim D, the magnitude of each of the D components is softplus of the
content projection, and the phase depends only on position (t*theta_c for the
query at t, s*theta_c + delta_c for the key at s, theta_c = base^(-c/D)). The
score is sum_c mu_q mu_k cos((s-t)*theta_c + delta_c) / sqrt(D). The attention
itself lives in pope_kernel.py.

Usage (as a library):
    from model import GPT, GPTConfig
    model = GPT(GPTConfig(pos_emb="pope"))
    logits, loss = model(idx, targets)
    model, ckpt = load_checkpoint("out/ckpt.pt", device="cuda")
"""

import inspect
import math
import warnings
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F

import pope_kernel
from pope_kernel import pope_attention, pope_attention_reference, sdpa_with_offset


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
    attn_impl: str = "auto"  # "auto" | "torch" | "triton" (PoPE only)
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
        need(self.n_embd % self.n_head == 0, f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        need(self.pos_emb != "rope" or (self.n_embd // self.n_head) % 2 == 0, "RoPE needs an even head dim")
        need(self.rope_scaling >= 1.0, f"rope_scaling must be >= 1 (1 = off), got {self.rope_scaling}")
        need(self.rope_scaling == 1.0 or self.pos_emb == "rope",
             f"rope_scaling (YaRN) is for pos_emb='rope' only; this model has pos_emb={self.pos_emb!r}")


# -----------------------------------------------------------------------------
# RoPE (with optional YaRN)

def yarn_inv_freq(head_dim, base, scale, orig_len, alpha=1.0, beta=32.0):
    """RoPE inverse frequencies under YaRN, and the attention temperature factor.

    Dimension pair i has theta_i = base^(-2i/D) and r_i = orig_len * theta_i / 2pi
    rotations over the original context. The ramp gamma(r) = clip((r - alpha) /
    (beta - alpha), 0, 1) keeps high frequencies (gamma = 1) and interpolates low
    ones (gamma = 0: theta/s). Logits are multiplied by mscale^2 where
    mscale = sqrt(1/t) = 0.1 ln(s) + 1. At s = 1 this is plain RoPE."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scale <= 1.0:
        return theta.float(), 1.0
    r = orig_len * theta / (2 * math.pi)
    gamma = ((r - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    theta = (1 - gamma) * theta / scale + gamma * theta
    return theta.float(), 0.1 * math.log(scale) + 1.0


def apply_rope(x, inv_freq, pos0=0):
    """Rotate (B, H, T, D) by positions pos0..pos0+T-1; pairs are (x[:D/2], x[D/2:])."""
    T = x.size(-2)
    pos = torch.arange(pos0, pos0 + T, device=x.device, dtype=torch.float32)
    ang = pos[:, None] * inv_freq.to(x.device)[None, :]  # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


# -----------------------------------------------------------------------------
# the model

class KVCache:
    """Per-layer key/value cache for generate(). For PoPE the keys are stored as
    magnitudes mu_k = softplus(k): D numbers per position, as many bytes as a
    RoPE cache; phases are recomputed from absolute positions. For RoPE the
    keys are stored rotated."""

    def __init__(self, n_layer, B, H, T_max, D, device, dtype):
        self.k = [torch.empty(B, H, T_max, D, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.empty(B, H, T_max, D, device=device, dtype=dtype) for _ in range(n_layer)]
        self.pos = 0  # number of positions filled (all layers)

    def update(self, layer, k, v):
        T = k.size(2)
        self.k[layer][:, :, self.pos:self.pos + T] = k
        self.v[layer][:, :, self.pos:self.pos + T] = v
        return self.k[layer][:, :, :self.pos + T], self.v[layer][:, :, :self.pos + T]


class CausalSelfAttention(nn.Module):

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.pos_emb = config.pos_emb
        self.attn_impl = config.attn_impl
        self.pope_base = config.pope_base
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        if self.pos_emb == "pope":
            # the learnable phase bias delta of the keys; clamped in pope_attention
            self.delta = nn.Parameter(torch.zeros(config.n_head, self.head_dim))
        if self.pos_emb == "rope":
            self.set_rope_scaling(config.rope_base, config.rope_scaling,
                                  config.rope_scaling_orig_len or config.block_size)
        self._warned = False

    def set_rope_scaling(self, base, scale, orig_len):
        inv_freq, mscale = yarn_inv_freq(self.head_dim, base, scale, orig_len)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.scale = mscale ** 2 / math.sqrt(self.head_dim)

    def _pope(self, q, k, v, q_offset, k_is_mu):
        impl = self.attn_impl
        if impl == "auto":
            use_kernel = q.is_cuda
            if use_kernel:
                reason = pope_kernel.kernel_unsupported_reason(q, k, v, self.delta)
                if reason is not None:
                    use_kernel = False
                    if not self._warned:
                        warnings.warn(f"PoPE Triton kernel not used ({reason}); falling back to the PyTorch reference")
                        self._warned = True
            impl = "triton" if use_kernel else "torch"
        fn = pope_attention if impl == "triton" else pope_attention_reference
        return fn(q, k, v, self.delta, causal=True, base=self.pope_base, q_offset=q_offset, k_is_mu=k_is_mu)

    def forward(self, x, cache=None):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        pos0 = 0 if cache is None else cache.pos
        if self.pos_emb == "rope":
            q, k = apply_rope(q, self.inv_freq, pos0), apply_rope(k, self.inv_freq, pos0)
        k_is_mu = False
        if cache is not None:
            if self.pos_emb == "pope":
                k, k_is_mu = F.softplus(k.float()).to(k.dtype), True
            k, v = cache.update(self.layer_idx, k, v)
        if self.pos_emb == "pope":
            y = self._pope(q, k, v, pos0, k_is_mu)
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
                torch.nn.init.uniform_(p, -2 * math.pi, 0.0)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                torch.nn.init.zeros_(module.bias)

    def get_num_params(self):
        """Parameter count (the tied embedding counted once; there is no position table)."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, loss_mask=None, cache=None):
        """idx (B, T) token ids. With targets (B, T) returns all logits and the mean
        cross-entropy over the positions where loss_mask (B, T) is nonzero (all
        positions without a mask). Without targets, returns the last position's
        logits only (inference)."""
        B, T = idx.size()
        x = self.transformer.drop(self.transformer.wte(idx))
        for block in self.transformer.h:
            x = block(x, cache)
        if cache is not None:
            cache.pos += T
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
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens continuations of idx (B, T) with a KV cache.

        Past block_size the context is cropped to the last block_size tokens,
        exactly as recomputing from scratch would see it: positions restart at 0,
        so the cache is rebuilt from the cropped context at every such step
        (slower, but identical to the uncached model). top_k=1 is greedy."""
        cfg = self.config
        B = idx.size(0)
        D = cfg.n_embd // cfg.n_head
        p = self.lm_head.weight
        cache = None
        for _ in range(max_new_tokens):
            if cache is None or cache.pos + 1 > cfg.block_size:
                ctx = idx[:, -cfg.block_size:]
                cache = KVCache(cfg.n_layer, B, cfg.n_head, cfg.block_size, D, p.device, p.dtype)
                logits, _ = self(ctx, cache=cache)
            else:
                logits, _ = self(idx[:, -1:], cache=cache)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            if top_k == 1 or temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def load_checkpoint(path, device="cpu", **overrides):
    """Load a train.py checkpoint: returns (model in eval mode, checkpoint dict).
    overrides replace GPTConfig fields (e.g. attn_impl="torch")."""
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"checkpoint {path} not found; train one with train.py (it writes out_dir/ckpt.pt)") from None
    model_args = dict(ckpt["model_args"])
    valid = {f.name for f in fields(GPTConfig)}
    unknown = set(overrides) - valid
    if unknown:
        raise ValueError(f"unknown GPTConfig fields {sorted(unknown)}; valid: {sorted(valid)}")
    model_args.update(overrides)
    model = GPT(GPTConfig(**model_args))
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    return model.to(device).eval(), ckpt
