"""nanoGPT's GPT with a switch between PoPE, RoPE and no positional embedding: GPT(GPTConfig(pos_emb="pope")).
PoPE's math is in plain PyTorch below (section "PoPE"); pope_kernel.py holds Triton kernels computing it."""

import math
import pickle
import time
import zipfile
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

try:  # the kernels need Triton; without it the PyTorch path below runs everywhere
    import pope_kernel
except ImportError as e:
    pope_kernel, KERNEL_MISSING = None, f"Triton is not importable: {e}"

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
    pope_delta_bound: str = "wrap"  # how delta stays in [-2pi, 0]: "wrap" | "clamp" | "project" (pope_delta)
    attn_impl: str = "auto"  # "auto" | "torch" (the code below) | "triton" (the kernels): use_pope_kernel
    rope_scaling: float = 1.0  # YaRN (arXiv 2309.00071), RoPE only: s > 1 stretches the context by s
    rope_scaling_orig_len: int = 0  # the context that s stretches (0 means block_size)

    def __post_init__(self):
        for name, allowed in dict(pos_emb=("pope", "rope", "none"), attn_impl=("auto", "torch", "triton"),
                                  pope_delta_init=("zero", "uniform"),
                                  pope_delta_bound=("wrap", "clamp", "project")).items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head or self.pos_emb == "rope" and self.n_embd // self.n_head % 2:
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} (even for RoPE)")
        if self.rope_scaling < 1.0 or self.rope_scaling > 1.0 and self.pos_emb != "rope":
            raise ValueError(f"rope_scaling must be >= 1, 1 unless pos_emb='rope'; got {self.rope_scaling}")

# PoPE (Gopalakrishnan et al., arXiv 2509.10534). Per head of dim D, on the raw q/k projections:
#     mu_q = softplus(q), mu_k = softplus(k)                     "what": content only
#     theta_c = base^(-c/D), c = 0..D-1                          D frequencies (RoPE: D/2)
#     phi_q(t) = t*theta_c,  phi_k(s) = s*theta_c + delta_c      "where": position only
#     a_ts = (1/sqrt(D)) sum_c mu_q[t,c] mu_k[s,c] cos((s-t)*theta_c + delta_c)
# delta: a learned (H, D) phase bias per layer, kept in [-2pi, 0]. The score is the dot product of the
# 2D-long [mu cos(phi), mu sin(phi)]: the PyTorch path builds those (pope_cos_sin, pope_cartesian) for SDPA.
# Porting: pope_kernel.py takes theta and delta from pope_frequencies and pope_delta; the rest is
# copied in its @triton.jit helpers: _softplus (pope_magnitude; called by _cartesian_tile,
# _cartesian_grad and _decode_turn), _cos_sin (pope_cos_sin's cos and sin), _cartesian_tile and
# _cartesian_grad (pope_cartesian and its backward, with d mu/dx = sigmoid(x): the training kernels'
# phases t*theta for queries, s*theta + delta for keys) and _relative_key (KVCache.attend's PoPE
# score: the decoding kernel's phase (s - t)*theta + delta on a cache of magnitudes). A variant:
# edit here, train with --attn_impl=torch, port it there. The tests' float64 references take mu from
# pope_magnitude (tests/helpers.py), so till the port only tests/test_kernel.py (on a GPU also
# tests/test_gpu.py) fails; new phases or scores need new references.

pope_magnitude = F.softplus  # mu = softplus(x): a module global, so a variant (or a test) can replace it

def pope_frequencies(D, base=10000.0, device=None, dtype=torch.float32):  # rounded once from float64
    return torch.logspace(0, -(D - 1) / D, D, base=base, device=device, dtype=torch.float64).to(dtype)

def pope_delta(delta, bound="wrap"):  # into [-2pi, 0]; "project" also clamps the parameter (project_delta_)
    if bound == "wrap":
        return delta - math.tau * torch.ceil(delta.detach() / math.tau)
    return torch.clamp(delta, -math.tau, 0.0)

def pope_cos_sin(positions, theta, delta=None):  # phi = t*theta: (T, 2, D), or + delta: (H, T, 2, D)
    phase = positions.to(theta.dtype)[:, None] * theta
    if delta is not None:
        phase = phase + delta.to(theta.dtype)[..., None, :]
    return torch.stack([torch.cos(phase), torch.sin(phase)], dim=-2)

def pope_cartesian(x, cos_sin, raw=True):  # (B, H, T, 2D) of the raw x, or (raw=False) of magnitudes x
    mu = pope_magnitude(x.to(cos_sin.dtype)) if raw else x
    return (mu.unsqueeze(-2) * cos_sin).flatten(-2)

def pope_attention_torch(q, k, v, delta, *, causal=True, base=10000.0, q_offset=0):  # as pope_attention
    qpos = torch.arange(q_offset, q_offset + q.size(2), device=q.device)
    kpos = torch.arange(k.size(2), device=q.device)
    theta = pope_frequencies(q.size(-1), base, q.device, torch.promote_types(q.dtype, torch.float32))
    qc = pope_cartesian(q, pope_cos_sin(qpos, theta)).to(v.dtype)
    kc = pope_cartesian(k, pope_cos_sin(kpos, theta, delta)).to(v.dtype)
    mask = kpos[None, :] <= qpos[:, None] if causal and (q_offset or q.size(2) != k.size(2)) else None
    return F.scaled_dot_product_attention(qc, kc, v, attn_mask=mask, is_causal=causal and mask is None,
                                          scale=1.0 / math.sqrt(q.size(-1)))

# RoPE, with YaRN (Peng et al., arXiv 2309.00071) for longer contexts
def yarn_inv_freq(head_dim, base, scale, orig_len, beta_fast=32.0, beta_slow=1.0):
    # as YaRN's reference code: pairs turning fast over orig_len kept, slow ones / s, a linear ramp between
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scale <= 1.0:
        return theta.float(), 1.0
    pair_index = lambda b: head_dim * math.log(orig_len / (b * 2 * math.pi)) / (2 * math.log(base))  # noqa
    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0.0, 1.0)
    theta = (1 - ramp) * theta + ramp * theta / scale
    return theta.float(), 0.1 * math.log(scale) + 1.0

def rope_cos_sin(inv_freq, positions):  # apply_rope's cos and [-sin, sin]: (T, D) each
    ang = positions.float()[:, None] * inv_freq
    cos, sin = ang.cos(), ang.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

def apply_rope(x, cos, sin):  # x[i] + 1j x[i + D/2] times e^(1j angle_i)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([x2, x1], dim=-1) * sin.to(x.dtype)

# the model
def use_pope_kernel(attn_impl, q, k, v, delta, *, compiled=None, decoding=False):
    """The one rule: (True, why) for pope_kernel.py, (False, why) for PyTorch; decoding: a KVCache's k, v."""
    if attn_impl == "torch":
        return False, "attn_impl='torch'"
    if pope_kernel is None and attn_impl == "triton":
        raise RuntimeError(f"attn_impl='triton' needs pope_kernel.py, but {KERNEL_MISSING}")
    if attn_impl == "auto" and not q.is_cuda:
        return False, f"attn_impl='auto' on {q.device.type}; the kernels run on CUDA"
    # Until the kernel wins there (results/kernel/train-*: H200, 124M, bf16, 32k tokens; ms/step, PyTorch vs
    # kernel, torch.compile: 1k 77.05 vs 76.38, 4k 99.74 vs 100.38, 16k 186.03 vs 195.60; ab-heads-*: 1k a tie),
    # unless deterministic: SDPA's deterministic kernels are far slower (results/kernel/determinism.json)
    if attn_impl == "auto" and (torch.compiler.is_compiling() if compiled is None else compiled) and \
            not decoding and q.size(2) > 1024 and not torch.are_deterministic_algorithms_enabled():
        return False, "attn_impl='auto', torch.compile, over 1024 tokens: the PyTorch path, as fast or faster"
    why = KERNEL_MISSING if pope_kernel is None else pope_kernel.decode_unsupported_reason(k, v) if decoding \
        else pope_kernel.kernel_unsupported_reason(q, k, v, delta)
    if why is None or attn_impl == "triton" and not decoding:
        return True, f"attn_impl={attn_impl!r}" + (f"; it will refuse this input: {why}" if why else "")
    return False, f"attn_impl={attn_impl!r}; the kernel does not take this input: {why}"

class KVCache:
    """generate()'s static cache of `context` slots a layer; pos advances in place (a CUDA graph replays).
    PoPE's keys: mu_k alone, phases made as read (5,283 tok/s, Cartesian keys 3,382: H200, batch 8, 8k)."""

    def __init__(self, model, B, context, dtype):
        cfg, device, attns = model.config, model.lm_head.weight.device, [b.attn for b in model.transformer.h]
        H, D = cfg.n_head, cfg.n_embd // cfg.n_head
        self.k = [torch.zeros(B, H, context, D, device=device, dtype=dtype) for _ in attns]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.kernel = use_pope_kernel(cfg.attn_impl, self.k[0], self.k[0], self.v[0], None, decoding=True)[0]
        self.slots, self.pos = torch.arange(context, device=device), torch.tensor(0, device=device)
        self.pos_emb, self.dtype = cfg.pos_emb, dtype
        turn = dict(pope_kernel.decode_launch(self.k[0]), counts=torch.zeros(B * H, dtype=torch.int32,
                    device=device)) if self.kernel else {}  # picked once; counts: the kernel's chunk tally
        if cfg.pos_emb == "rope":  # (every layer's is the same)
            turn["inv_freq"] = self.inv_freq = attns[0].inv_freq
        self.turn = [turn] * cfg.n_layer  # the decoding kernel's arguments, per layer
        if cfg.pos_emb == "pope":  # theta and the bounded deltas, read once, in the dtype of the phases
            self.theta = pope_frequencies(D, cfg.pope_base, device, torch.promote_types(dtype, torch.float32))
            self.delta = torch.stack([pope_delta(a.delta, a.delta_bound) for a in attns]).to(self.theta.dtype)
            self.turn = [dict(turn, theta=self.theta, delta=d) for d in self.delta]

    def start(self, T):  # GPT.forward's: the positions of its T tokens, the mask, RoPE's rotation per layer
        self.positions = self.pos.view(1) if T == 1 else self.pos + self.slots[:T]  # (pos advances after)
        if T > 1 or not self.kernel:  # (T, context): the slots past each query masked
            self.bias = torch.where(self.slots > self.positions[:, None], -math.inf, 0.0).to(self.dtype)
            if self.pos_emb == "rope":
                self.rotation = [r.to(self.dtype) for r in rope_cos_sin(self.inv_freq, self.positions)]

    def attend(self, layer, q, k, v, scale):  # raw q and k turned, k and v written, the slots up to each read
        if q.size(2) == 1 and self.kernel:  # one token: the kernel turns q and k, writes them, reads 0..pos
            return pope_kernel.decode_attention(q, k, v, self.k[layer], self.v[layer], self.positions, scale,
                                                **self.turn[layer])
        if self.pos_emb == "rope":
            q, k = apply_rope(q, *self.rotation), apply_rope(k, *self.rotation)
        if self.pos_emb == "pope":
            k = pope_magnitude(k.to(self.theta.dtype))
        k = self.k[layer].index_copy_(2, self.positions, k.to(self.dtype))  # (returns the whole cache)
        v = self.v[layer].index_copy_(2, self.positions, v)
        if self.pos_emb == "pope":  # the queries' and every slot's Cartesian form
            q = pope_cartesian(q, pope_cos_sin(self.positions, self.theta)).to(v.dtype)
            k = pope_cartesian(k, pope_cos_sin(self.slots, self.theta, self.delta[layer]), False).to(v.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias, scale=scale)

class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx, self.n_head, self.head_dim = layer_idx, config.n_head, config.n_embd // config.n_head
        self.pos_emb, self.attn_impl = config.pos_emb, config.attn_impl
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # hooks (identities): q and k as projected, before RoPE or a cache (eval_frequencies.py reads them)
        self.q_probe, self.k_probe = nn.Identity(), nn.Identity()
        self.scale = 1.0 / math.sqrt(self.head_dim)  # (RoPE's, and its inv_freq: GPT.set_rope_scaling)
        if self.pos_emb == "pope":  # delta: the keys' learned phase bias (initialised in GPT.__init__)
            self.delta = nn.Parameter(torch.zeros(config.n_head, self.head_dim))
            self.delta_bound, self.pope_base = config.pope_delta_bound, config.pope_base
            self.register_buffer("theta", pope_frequencies(self.head_dim, config.pope_base), persistent=False)

    def forward(self, x, cache=None):
        B, T, C = x.size()
        # as 3H heads: compiled, view-permute-unbind's grads were wrong, split's slow (results/kernel/qkv-forms)
        q, k, v = self.c_attn(x).view(B, T, 3 * self.n_head, -1).transpose(1, 2).split(self.n_head, 1)
        q, k = self.q_probe(q), self.k_probe(k)  # (B, H, T, D) each
        if cache is not None:  # generate(): over the cache's slots up to each query (it turns q and k)
            y = cache.attend(self.layer_idx, q, k, v, self.scale)
        elif self.pos_emb == "pope":
            delta = pope_delta(self.delta, self.delta_bound)
            if use_pope_kernel(self.attn_impl, q, k, v, delta)[0]:
                y = pope_kernel.pope_attention(q, k, v, delta, self.theta)
            else:
                y = pope_attention_torch(q, k, v, delta, base=self.pope_base)
        else:
            if self.pos_emb == "rope":
                rot = rope_cos_sin(self.inv_freq, torch.arange(T, device=x.device))
                q, k = apply_rope(q, *rot), apply_rope(k, *rot)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))

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
            wte=nn.Embedding(config.vocab_size, config.n_embd), drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.RMSNorm(config.n_embd, eps=1e-6)))
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
        if config.pos_emb == "rope":  # each layer's inv_freq and scale
            self.set_rope_scaling(config.rope_scaling)

    @torch.no_grad()
    def project_delta_(self):  # pope_delta_bound="project": train.py clamps delta after every step
        if self.config.pos_emb == "pope" and self.config.pope_delta_bound == "project":
            for block in self.transformer.h:
                block.attn.delta.clamp_(-math.tau, 0.0)

    def cast_weights_(self, dtype):  # for decoding without autocast; delta and the frequencies stay float32
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding, nn.RMSNorm)):
                m.to(dtype)
        return self

    def get_num_params(self):  # (the tied embedding counted once; there is no position table)
        return sum(p.numel() for p in self.parameters())

    def attention_path(self, device=None, compiled=False, T=None, decoding=False):  # for logs: the one rule's
        cfg = self.config  # choice and why; decoding: generate()'s one-token steps on a cache of T slots
        if cfg.pos_emb != "pope":
            return f"{cfg.pos_emb}: PyTorch SDPA (model.py)"
        shape = (1, cfg.n_head, T or cfg.block_size, cfg.n_embd // cfg.n_head)  # (one number, expanded)
        q = torch.zeros((), device=device or self.lm_head.weight.device,
                        dtype=self.cache_dtype() if decoding else None).expand(shape)
        kernel, why = use_pope_kernel(cfg.attn_impl, q, q, q, q[0, :, 0], compiled=compiled, decoding=decoding)
        return f"pope: {'the kernel of pope_kernel.py' if kernel else 'the PyTorch path of model.py'} ({why})"

    def cache_dtype(self):  # generate()'s KV cache: in the attention's dtype
        dev, dtype = self.lm_head.weight.device.type, self.lm_head.weight.dtype
        return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else dtype

    def forward(self, idx, targets=None, loss_mask=None, cache=None):  # loss: mean where loss_mask != 0
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
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), reduction="none")
        if loss_mask is None:
            return logits, loss.mean()
        m = loss_mask.reshape(-1).to(loss.dtype)
        return logits, (loss * m).sum() / m.sum().clamp(min=1.0)

    def set_rope_scaling(self, scale, orig_len=None):  # YaRN on (scale > 1) or off (1.0), also at eval time
        cfg, D = self.config, self.config.n_embd // self.config.n_head
        if cfg.pos_emb != "rope" or scale < 1.0:
            raise ValueError(f"rope_scaling (YaRN) must be >= 1 and is for pos_emb='rope' only; got {scale}")
        cfg.rope_scaling, cfg.rope_scaling_orig_len = float(scale), int(orig_len or cfg.rope_scaling_orig_len)
        inv_freq, mscale = yarn_inv_freq(D, cfg.rope_base, scale, cfg.rope_scaling_orig_len or cfg.block_size)
        for block in self.transformer.h:
            block.attn.register_buffer("inv_freq", inv_freq.to(self.lm_head.weight.device), persistent=False)
            block.attn.scale = mscale ** 2 / math.sqrt(D)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):  # delta is not decayed
        groups = [{"params": [], "weight_decay": weight_decay}, {"params": [], "weight_decay": 0.0}]
        for n, p in self.named_parameters():
            if p.requires_grad:
                groups[p.dim() < 2 or n.endswith("attn.delta")]["params"].append(p)
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda" or None)

    def flops_per_token(self, T=None):  # nanoGPT's count: 6N + the attention matmuls (PoPE's QK^T over 2D)
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, T or cfg.block_size
        return 6 * self.get_num_params() + 6 * L * H * ((2 if cfg.pos_emb == "pope" else 1) * Q + Q) * T

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops=989e12):  # peak: H100/H200 dense bf16
        return self.flops_per_token() * self.config.block_size * fwdbwd_per_iter / dt / peak_flops

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, vocab_size=None, context=None,
                 mode="eager", times=None):
        """On a KVCache of `context` slots (block_size), then over the last `context` tokens; the one-token
        step "eager", or on CUDA a "graph" ("compile": compiled first); temperature 0: greedy."""
        device, N, (B, T0) = self.lm_head.weight.device, context or self.config.block_size, idx.shape
        if mode not in ("eager", "graph", "compile") or mode != "eager" and device.type != "cuda":
            raise ValueError(f"mode must be 'eager', or on CUDA 'graph' or 'compile'; got {mode!r}, {device}")
        if T0 > N:
            raise ValueError(f"the prompt has {T0} tokens, more than the context of {N}: crop it or raise it")
        clock = lambda: (device.type == "cuda" and torch.cuda.synchronize(device), time.perf_counter())[1]
        cache, t0 = KVCache(self, B, N, self.cache_dtype()), clock()
        out, tok = torch.cat([idx, idx.new_empty(B, max_new_tokens)], 1), idx.new_empty(B, 1)  # tok: in/out

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

def sample_next(logits, temperature=1.0, top_k=None, vocab_size=None):  # Gumbel-max: no host sync
    logits = logits[:, :vocab_size]  # a view: the ids past vocab_size (padding rows) are never drawn
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    ids = None
    if top_k is not None and top_k < logits.size(-1):
        logits, ids = torch.topk(logits, top_k)
    log_e = torch.empty(logits.shape, device=logits.device).exponential_().clamp_(min=1e-30).log_()
    i = torch.add(logits, log_e, alpha=-temperature).argmax(dim=-1, keepdim=True)  # (T times the draw)
    return i if ids is None else ids.gather(-1, i)

def cuda_graph(fn, state=(), compile=False, warmup=1):
    # (replay, fn's output): warm-up calls on a side stream (compilation, cuBLAS), state put back, capture
    if compile:  # freezing folds the weights' casts once instead of running them at every step
        fn = torch.compile(fn, fullgraph=True, options={"freezing": True})
    saved = [t.detach().clone() for t in state]
    (side := torch.cuda.Stream()).wait_stream(torch.cuda.current_stream())
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

# checkpoints: the one reader (train.py's resume and fine-tune, sample.py, the eval scripts)
class CheckpointError(ValueError):  # not an intact train.py checkpoint: one line, naming the file
    pass

def all_finite(t):
    """No NaN or inf in t, from its min and max (both propagate NaN): one pass, no copy of t."""
    return t.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())

def read_checkpoint(path):
    """A train.py checkpoint's dict on the CPU (weights_only=True), its zip's CRCs checked first."""
    try:
        with zipfile.ZipFile(path) as z:
            if (bad := z.testzip()) is not None:
                raise CheckpointError(f"{path} is damaged: {bad} fails its CRC check; use an intact copy")
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # reads what is used
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(f"no checkpoint file {path}: train.py writes out_dir/ckpt.pt") from None
    except (zipfile.BadZipFile, EOFError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a checkpoint torch.save wrote, or is cut short ({e})") from None
    except pickle.UnpicklingError:
        raise CheckpointError(f"{path} is refused: loading it would run code") from None
    if not (isinstance(ckpt, dict) and all(isinstance(ckpt.get(k), dict) for k in ("model", "model_args"))):
        raise CheckpointError(f"{path} is not a train.py checkpoint (a dict with 'model' and 'model_args')")
    if bad := [k for k, v in ckpt["model"].items() if not all_finite(v)]:
        raise CheckpointError(f"{path} has NaN or inf weights ({bad[0]}, {len(bad) - 1} more): it diverged")
    return ckpt

def load_checkpoint(path, device="cpu", **overrides):  # (model in eval mode, checkpoint); GPTConfig overrides
    ckpt = read_checkpoint(path)
    with torch.device(device):  # the random init the weights replace runs there: on a GPU, in no time
        model = GPT(GPTConfig(**{**ckpt["model_args"], **overrides}))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    return model.to(device).eval(), ckpt
