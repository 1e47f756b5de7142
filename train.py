"""
Train a GPT with PoPE, RoPE or no positional embedding, nanoGPT style: python train.py [config/FILE.py]
[--key=value ...], or under torchrun for DDP. --help lists every setting. Fine-tune: --init_from=path/ckpt.pt;
a checkpoint's full-split loss: --init_from=resume --eval_only=True --eval_full=True (into out_dir/eval.json).
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext, suppress
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import configure
from model import GPT, CheckpointError, GPTConfig, cuda_graph as capture_graph, read_checkpoint
from prepare.common import (AT_LEAST_1, DEVICE_RULE, KERNEL_RULE, PrepareError, broken_rules,
                            check_dataset, check_outputs, lock_folder, model_vocab, output_file,
                            resolve_device, unlock_folder, write_json)

# -----------------------------------------------------------------------------
# defaults: the paper's OpenWebText setup at 124M (RMSNorm, head dim 64, batch 64 x 1024, AdamW 6e-4 -> 6e-5
# cosine over 100k iters, 1k warmup, wd 0.01, beta2 0.95, grad clip 1.0, no dropout)
# I/O
out_dir = "out"
eval_interval, log_interval = 1000, 10
eval_iters = 100  # batches per split for the periodic eval
eval_only = False  # evaluate and exit (with init_from="resume": a checkpoint)
eval_full = False  # eval over the whole split (every row / window) instead of eval_iters batches
eval_splits = "train,val"  # comma-separated splits for the eval
always_save_checkpoint = True  # else only when val loss improves
init_from = "scratch"  # "scratch" | "resume" (out_dir/ckpt.pt) | path/to/ckpt.pt (weights only: fine-tuning)
data_changed_ok = False  # a resume may go on with other data than its checkpoint's (for this resume only)
overwrite = False  # a new run (scratch or fine-tune) may replace out_dir's checkpoint
seed = 1337
# data: data_dir/<dataset>/ as prepare/*.py writes it (see Data)
dataset, data_dir = "openwebtext", "data"
gradient_accumulation_steps = 4  # micro-steps per optimizer step (global, split over DDP ranks)
batch_size = 16  # micro-batch size
block_size = 1024
train_mask = True  # the loss where {split}_mask.bin scores; False: every train token (the eval keeps masks)
# model
n_layer, n_head, n_embd = 12, 12, 768
dropout, bias = 0.0, False
pos_emb = "pope"  # "pope" | "rope" | "none"
pope_base = rope_base = 10000.0
pope_delta_init = "zero"  # "zero" | "uniform"
pope_delta_bound = "wrap"  # "wrap" | "clamp" | "project": how delta stays in [-2pi, 0] (model.pope_delta)
attn_impl = "auto"  # "auto" | "torch" | "triton"
rope_scaling = 1.0  # YaRN scale for RoPE (1.0 = off)
rope_scaling_orig_len = 0  # YaRN's original context (0 = block_size)
# AdamW and its learning rate schedule
learning_rate, min_lr = 6e-4, 6e-5  # a linear warmup to learning_rate, then a cosine decay to min_lr
max_iters = 100000
weight_decay, grad_clip = 0.01, 1.0  # grad_clip 0 disables
beta1, beta2 = 0.9, 0.95
decay_lr = True  # False: learning_rate after the warmup
warmup_iters, lr_decay_iters = 1000, 100000
# system
device = "auto"  # "auto" (cuda if available) | "cpu" | "cuda" | "cuda:1" ...
dtype = "auto"  # "auto" (bfloat16 on cuda, float32 on cpu) | "float32" | "bfloat16" | "float16"
compile = False  # torch.compile the model
compile_mode = "default"  # "default" | "reduce-overhead" (CUDA graphs, for small models) | "max-autotune"
peak_flops = 989e12  # for MFU: dense bf16 peak of an H100/H200
cuda_graph = False  # one GPU: the whole optimizer step as one CUDA graph (small models are host-bound)
# -----------------------------------------------------------------------------
DEFAULTS = {k: v for k, v in globals().items() if k[0] != "_" and type(v) in (int, float, bool, str)}
MODEL_KEYS = [k for k in GPTConfig.__dataclass_fields__ if k != "vocab_size"]  # (the data sets vocab_size)
RESUME_MAY_CHANGE = ("attn_impl", "dropout")  # the model keys a resume may set anew
FINETUNE_KEEPS = "n_layer n_head n_embd bias pos_emb pope_base rope_base pope_delta_bound".split()
RESUMES_FROM = ("optimizer", "config", "meta", "data", "iter_num", "best_val_loss")  # (its keys)
SPLIT_NAMES = ("train", "val", "test")  # eval_splits' choices (an eval's batches seed by index)
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets all
MAX_BATCH_TOKENS = 1 << 24  # batch_size x block_size: a micro-batch's positions (int64 indices)
RULES = {  # setting: (its rule on its value v and the settings c, what it must be); NaN fails all.
    # configurator.py checks the types, GPTConfig the model's settings
    **dict.fromkeys(("gradient_accumulation_steps", "block_size", "eval_interval", "log_interval",
                     "eval_iters", "lr_decay_iters"), AT_LEAST_1),
    "out_dir": (lambda v, c: v.strip() != "", "a folder's name"),
    "batch_size": (lambda v, c: 1 <= v and v * c["block_size"] <= MAX_BATCH_TOKENS,
                   f">= 1, batch_size x block_size <= {MAX_BATCH_TOKENS:,}; larger batches: "
                   "gradient_accumulation_steps"),
    "max_iters": (lambda v, c: v >= 0, ">= 0"),
    "warmup_iters": (lambda v, c: v >= 0, ">= 0"),
    "seed": (lambda v, c: 0 <= v < 2**63, "in [0, 2**63)"),
    "learning_rate": (lambda v, c: 0 < v < math.inf, "> 0 and finite"),
    "min_lr": (lambda v, c: 0 <= v <= c["learning_rate"], "in [0, learning_rate]"),
    "weight_decay": (lambda v, c: 0 <= v < math.inf, ">= 0 and finite"),
    "grad_clip": (lambda v, c: 0 <= v < math.inf, ">= 0 and finite (0: no clipping)"),
    "beta1": (lambda v, c: 0 <= v < 1, "in [0, 1)"),
    "beta2": (lambda v, c: 0 <= v < 1, "in [0, 1)"),
    "peak_flops": (lambda v, c: 0 < v < math.inf, "> 0 and finite: the GPU's peak FLOP/s, for MFU"),
    "eval_splits": (lambda v, c: set(v.split(",")) <= set(SPLIT_NAMES),
                    "train, val or test, comma-separated"),
    "dtype": (lambda v, c: v in ("auto", "float32", "bfloat16", "float16"),
              "auto, float32, bfloat16 or float16"),
    "compile_mode": (lambda v, c: v in ("default", "reduce-overhead", "max-autotune"),
                     "default, reduce-overhead or max-autotune"),
    "device": DEVICE_RULE,
    "attn_impl": KERNEL_RULE,
}


def settings_problems(c):
    """The settings of c that break their RULES row, as 'key=value (must be ...)'; GPTConfig's."""
    problems = broken_rules(c, RULES)
    try:
        GPTConfig(**{k: c[k] for k in MODEL_KEYS})
    except ValueError as e:
        problems.append(str(e))
    return problems


def settings(argv):
    """(cfg, checkpoint or None): the defaults with argv applied (configurator.py), checked before
    anything is written. A resume continues its checkpoint's settings, the keys given on top; a
    fine-tune keeps its source's FINETUNE_KEEPS (shape). One run per out_dir: rank 0 locks it (the
    OS drops the lock however the run ends), a resume before it reads its checkpoint."""
    cfg, given = configure(argv, DEFAULTS, __doc__)
    unset = [k for k in TORCHRUN if k not in os.environ]
    if 0 < len(unset) < len(TORCHRUN):
        found = [k for k in TORCHRUN if k not in unset]
        sys.exit(f"error: {', '.join(found)} set without {', '.join(unset)}: start a DDP run with "
                 "torchrun, or unset them")
    resume, path = cfg["init_from"] == "resume", os.path.join(cfg["out_dir"], "ckpt.pt")
    master = os.environ.get("RANK", "0") == "0"
    hint = "wait for it to end, or pick another --out_dir"
    if master:  # a folder no run can write into (read-only, full, a file): one line, first
        check_outputs(out_dir=path)
    ckpt = None
    if cfg["init_from"] != "scratch":
        if resume and master and os.path.isdir(cfg["out_dir"]):
            lock_folder(cfg["out_dir"], hint)
        ckpt = read_checkpoint(src := path if resume else cfg["init_from"])
        missing = [k for k in RESUMES_FROM if k not in ckpt] if resume else []
        if missing:
            sys.exit(f"error: {src} has no {', '.join(missing)}: a run cannot resume from it; "
                     f"fine-tune from it into another out_dir (--init_from={src})")
        margs = ckpt["model_args"]
        fixed = [k for k in MODEL_KEYS if k not in RESUME_MAY_CHANGE] if resume else FINETUNE_KEEPS
        clash = [f"{k}={cfg[k]!r} (checkpoint: {margs[k]!r})" for k in fixed
                 if k in given and cfg[k] != margs[k]]
        if clash:
            sys.exit(f"error: {src}'s model differs: {', '.join(clash)}; drop those settings")
    if resume:
        saved = {k: v for k, v in ckpt["config"].items()
                 if k in DEFAULTS and k != "data_changed_ok"}  # (for one resume)
        cfg = {**DEFAULTS, **saved, **{k: cfg[k] for k in given}, "out_dir": cfg["out_dir"]}
    elif ckpt is not None:
        cfg.update({k: margs[k] for k in FINETUNE_KEEPS})
        if cfg["rope_scaling"] > 1.0 and cfg["rope_scaling_orig_len"] == 0:
            cfg["rope_scaling_orig_len"] = margs["block_size"]  # YaRN stretches the source's context
    problems = settings_problems(cfg)
    if problems:
        sys.exit("error: bad settings: " + "; ".join(problems))
    if master and not resume:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        lock_folder(cfg["out_dir"], hint)
        if os.path.exists(path) and not cfg["overwrite"]:
            sys.exit(f"error: {path} exists: resume it with --init_from=resume, or pick another "
                     "--out_dir (--overwrite=True replaces it)")
    return cfg, ckpt


# -----------------------------------------------------------------------------
# data: nanoGPT's get_batch, with fixed rows, loss masks and batches seeded by (seed, iteration, micro-step):
# a resume draws the batches the uninterrupted run would have, and N DDP ranks draw those of one process

def make_gen(*key):  # a generator seeded by ints
    return torch.Generator().manual_seed(int(np.random.SeedSequence(key).generate_state(1, "u8")[0]) >> 1)


class Data:
    """A dataset of prepare/*.py: {split}.bin token ids, meta.json, {split}_mask.bin (1 = a target) or none.
    A batch takes whole rows where meta has row_len, else windows of block_size + 1 tokens. The files are
    opened once: a prepare run that swaps a new set in cannot change the data under a run."""

    def __init__(self, path, block_size, splits):
        self.dir, self.meta = path, check_dataset(path, splits)
        self.dtype, self.row_len = np.dtype(self.meta["dtype"]), self.meta.get("row_len")
        self.T = self.row_len - 1 if self.row_len else block_size
        if self.T > block_size:
            raise PrepareError(f"{path} holds rows of {self.row_len} tokens: block_size must be >= {self.T}")
        names = [f for s in sorted(set(splits)) for f in (f"{s}.bin", f"{s}_mask.bin")]
        self.files = {f: open(f"{path}/{f}", "rb") for f in names if os.path.exists(f"{path}/{f}")}
        stats = {f: os.fstat(h.fileno()) for f, h in self.files.items()}  # what a rewrite changes:
        self.stamp = {"bytes": {f: st.st_size for f, st in stats.items()},  # (checkpoints keep it)
                      "mtime_ns": {f: st.st_mtime_ns for f, st in stats.items()}}
        sizes = self.stamp["bytes"]
        if short := [s for s in splits if sizes[f"{s}.bin"] <= self.T * self.dtype.itemsize]:
            raise PrepareError(f"{path}/{short[0]}.bin holds fewer than block_size + 1 = {self.T + 1} tokens")

    def arrays(self, split, masked=True):  # a fresh memmap per batch, as nanoGPT does, avoids a memory leak
        mask = self.files.get(f"{split}_mask.bin") if masked else None
        return (np.memmap(self.files[f"{split}.bin"], dtype=self.dtype, mode="r"),
                None if mask is None else np.memmap(mask, dtype=np.uint8, mode="r"))

    def starts(self, split, n, gen):
        N = len(self.arrays(split)[0])
        if self.row_len:
            return torch.randint(N // self.row_len, (n,), generator=gen) * self.row_len
        return torch.randint(N - self.T, (n,), generator=gen)

    def get_batch(self, split, starts, device, masked=True):
        data, mask = self.arrays(split, masked)
        ix = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.T + 1)  # one gather for every row
        w = torch.from_numpy(data[ix].astype(np.int64))
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        m = None if mask is None else torch.from_numpy(mask[ix[:, 1:]].astype(np.float32))
        if "cuda" in str(device):
            return [t if t is None else t.pin_memory().to(device, non_blocking=True) for t in (x, y, m)]
        return x.to(device), y.to(device), m if m is None else m.to(device)


@torch.no_grad()
def evaluate(model, data, split, dev, ctx, full=False, bar=False):
    """Loss and accuracy on the scored targets of eval_iters fixed batches, or with full the whole split."""
    model.eval()
    loss_sum, correct, count = 0.0, 0.0, 0.0
    N, step, key = len(data.arrays(split)[0]), data.row_len or data.T, SPLIT_NAMES.index(split)
    batches = (torch.arange((N - (not data.row_len)) // step) * step).split(batch_size) if full else [
        data.starts(split, batch_size, make_gen(seed, key, k)) for k in range(eval_iters)]
    for starts in tqdm(batches, f"eval {split}", leave=False, file=sys.stderr, disable=None if bar else True):
        x, y, m = data.get_batch(split, starts, dev)
        with ctx:
            logits, loss = model(x, y, m)
        w = m if m is not None else torch.ones_like(y, dtype=torch.float32)
        loss_sum += loss.item() * w.sum().item()
        correct += ((logits.argmax(-1) == y).float() * w).sum().item()
        count += w.sum().item()
    model.train()
    return {"loss": loss_sum / max(count, 1), "acc": correct / max(count, 1), "tokens": int(count)}


def log_record(log, rec):
    """A line of metrics.jsonl; a full disk is one line naming it (closed: nothing to flush)."""
    try:
        print(json.dumps(rec), file=log, flush=True)
    except OSError as e:
        with suppress(OSError):
            log.close()
        raise PrepareError(f"cannot write {log.name}: {e.strerror}") from None


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (without decay_lr: learning_rate)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if not decay_lr:
        return learning_rate
    ratio = min(1.0, (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def train_step(model, raw_model, optimizer, scaler, ctx, accum, clip, batch):
    """One optimizer step over accum micro-batches (batch(micro) -> x, y, mask); GraphedStep captures it."""
    total = 0.0
    for micro in range(accum):
        x, y, m = batch(micro)
        with nullcontext() if not isinstance(model, DDP) or micro == accum - 1 else model.no_sync():
            with ctx:
                _, loss = model(x, y, m)
                loss = loss / accum
            scaler.scale(loss).backward()
        total = total + loss.detach()
    if clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), clip)
    scaler.step(optimizer)
    scaler.update()
    raw_model.project_delta_()
    optimizer.zero_grad(set_to_none=True)
    return total


class GraphedStep:
    """train_step as one CUDA graph, gathering the eager loop's batches from the training split on the GPU
    (their starts copied in before each replay); AdamW becomes capturable (lr a tensor)."""

    def __init__(self, step, raw_model, optimizer, data, accum):
        params = list(raw_model.parameters())
        dev = params[0].device
        tokens, mask = data.arrays("train", masked=train_mask)
        self.tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(dev)
        self.mask = torch.from_numpy(np.asarray(mask)).to(dev) if mask is not None else None
        self.offsets = torch.arange(data.T + 1, device=dev)
        self.starts = torch.zeros(accum, batch_size, dtype=torch.long, device=dev)
        self.host = [torch.zeros_like(self.starts, device="cpu").pin_memory() for _ in range(2)]
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]  # the copy out of host[i] is done
        self.data, self.accum, self.lr = data, accum, torch.tensor(learning_rate, device=dev)
        for g in optimizer.param_groups:  # AdamW reads lr from the tensor, updated before each replay
            g.update(lr=self.lr, capturable=True, foreach=True, fused=None)
        for p in params:  # AdamW's state made now (a first step would), so that the warm-up can be undone
            st = optimizer.state[p]
            st["step"] = st["step"].to(dev, torch.float32) if st else torch.zeros((), device=dev)
            for k in ("exp_avg", "exp_avg_sq"):
                st.setdefault(k, torch.zeros_like(p, memory_format=torch.preserve_format))
        state = params + [t for p in params for t in optimizer.state[p].values()]
        self.replay, self.loss = capture_graph(lambda: step(self.batch), state, warmup=3)

    def batch(self, micro):
        ix = self.starts[micro][:, None] + self.offsets
        w = self.tokens[ix].long()
        return w[:, :-1], w[:, 1:], (self.mask[ix[:, 1:]].float() if self.mask is not None else None)

    def __call__(self, iter_num, lr):
        i = iter_num % 2
        self.copied[i].synchronize()  # host[i] is being read by the copy of two steps ago (if any)
        for micro in range(self.accum):
            self.host[i][micro] = self.data.starts("train", batch_size, make_gen(seed, iter_num, micro))
        self.starts.copy_(self.host[i], non_blocking=True)
        self.copied[i].record()
        self.lr.fill_(lr)
        self.replay()
        return self.loss


def setup_device():
    """DDP (under torchrun), the device, the dtype and its autocast context: (rank, world, dev, dt, ctx)."""
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    dev = resolve_device(device)
    dt = dtype if dtype != "auto" else "bfloat16" if dev.startswith("cuda") else "float32"
    if gradient_accumulation_steps % world:
        sys.exit(f"error: gradient_accumulation_steps is not a multiple of the {world} processes")
    if cuda_graph and (world > 1 or dev == "cpu" or dt == "float16" or compile_mode == "reduce-overhead"):
        sys.exit("error: cuda_graph needs one CUDA GPU, bfloat16 or float32, no compile_mode=reduce-overhead")
    if world > 1:
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
        if dev.startswith("cuda"):
            dev = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(dev)
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ctx = nullcontext() if dt == "float32" else torch.autocast(dev.split(":")[0], dtype=getattr(torch, dt))
    return rank, world, dev, dt, ctx


def main(argv):
    cfg, ckpt = settings(argv)
    globals().update(cfg)  # from here on, the settings are plain names, as in nanoGPT
    rank, world, dev, dt, ctx = setup_device()
    master, resume, device_type = rank == 0, init_from == "resume", dev.split(":")[0]
    accum, ckpt_path = gradient_accumulation_steps // world, os.path.join(out_dir, "ckpt.pt")
    data = Data(f"{data_dir}/{dataset}", block_size, eval_splits.split(",") + ["train"] * (not eval_only))
    if resume:  # a resume goes on with its checkpoint's data (meta.json, files' sizes and times)
        changed = ["meta.json"] * (ckpt["meta"] != data.meta) + [
            f for f in data.files if any(ckpt["data"].get(k, {}).get(f, now[f]) != now[f]
                                         for k, now in data.stamp.items())]
        if changed and not data_changed_ok:
            sys.exit(f"error: {', '.join(changed)} in {data.dir} changed since {ckpt_path} was saved: "
                     "restore it, or pass --data_changed_ok=True to go on with this data")

    V = model_vocab(data.meta)
    margs = {**{k: cfg[k] for k in MODEL_KEYS}, "vocab_size": V}
    iter_num, best_val_loss = (ckpt["iter_num"], ckpt["best_val_loss"]) if resume else (0, 1e9)
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**margs))
    if ckpt is not None:
        if (v := ckpt["model_args"]["vocab_size"]) != V:
            sys.exit(f"error: {init_from} has vocab_size {v}, {dataset} {V}: use data with that vocabulary")
        model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.to(dev)
    tokens_per_iter = accum * world * batch_size * data.T
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} ({accum} accum x {world} procs x {batch_size} x "
              f"{data.T}), data {data.dir}\nmodel: {model.get_num_params() / 1e6:.2f}M parameters, "
              f"{model.attention_path(compiled=compile)}")
    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    if resume:
        optimizer.load_state_dict(ckpt["optimizer"])
    ckpt, raw_model = None, model  # (free memory)
    model = torch.compile(model, mode=compile_mode) if compile else model
    if world > 1:  # 100 MB buckets: torch.compile splits the graph at each (25 MB: ~20 pieces at 124M)
        model = DDP(model, device_ids=[int(dev.split(":")[1])] if device_type == "cuda" else None,
                    bucket_cap_mb=100, gradient_as_bucket_view=True)

    def train_batch(micro):  # this rank's micro-batch of iteration iter_num's global batch
        starts = data.starts("train", batch_size, make_gen(seed, iter_num, rank * accum + micro))
        return data.get_batch("train", starts, dev, masked=train_mask)

    step = partial(train_step, model, raw_model, optimizer, scaler, ctx, accum, grad_clip)
    graphed = GraphedStep(step, raw_model, optimizer, data, accum) if cuda_graph and not eval_only else None
    if master and not (resume or eval_only):  # a new run: no checkpoint or eval.json of an old one stays
        for f in filter(os.path.exists, (ckpt_path, os.path.join(out_dir, "eval.json"))):
            os.remove(f)
    log = open(os.path.join(out_dir, "metrics.jsonl"), "a" if resume or eval_only else "w") if master else None
    t0, it0, it_start, running_mfu = time.time(), iter_num, iter_num, -1.0  # it0: the timing window's start
    while True:
        lr = get_lr(iter_num)
        for group in optimizer.param_groups if graphed is None else ():
            group["lr"] = lr
        last = iter_num >= max_iters
        if iter_num % eval_interval == 0 or last or eval_only:
            res = {s: evaluate(model, data, s, dev, ctx, eval_full, master) for s in eval_splits.split(",")}
            if master:
                print(f"step {iter_num}: " + ", ".join(f"{s} loss {r['loss']:.4f} acc {r['acc']:.4f}"
                                                        for s, r in res.items()))
                if eval_only:  # an evaluation alone: into eval.json, not the run's log
                    write_json(os.path.join(out_dir, "eval.json"), {"iter": iter_num, "full": eval_full, **res})
                else:
                    log_record(log, {"iter": iter_num, "eval": res})
            if eval_only:
                break
            if not all(torch.isfinite(p).all() for p in raw_model.parameters()):  # a diverged run never saves
                sys.exit(f"error: the weights are not finite at iteration {iter_num}: the run diverged")
            improved = "val" in res and res["val"]["loss"] < best_val_loss
            best_val_loss = res["val"]["loss"] if improved else best_val_loss
            # not at the iteration a run starts from: a resumed run's checkpoint is already that
            if master and iter_num > it_start and (improved or always_save_checkpoint or "val" not in res):
                state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "config": cfg,
                         "model_args": margs, "iter_num": iter_num, "best_val_loss": best_val_loss,
                         "meta": data.meta, "data": data.stamp}
                with output_file(ckpt_path) as f:  # whole or not at all: a crash leaves the old one
                    torch.save(state, f)
                print(f"saved checkpoint to {ckpt_path}")
            t0, it0 = time.time(), iter_num  # keep eval time out of the step timing
        if last:
            break
        if dropout > 0:  # dropout alone draws from torch's RNG in a step: reseeded, resumes stay bitwise
            torch.manual_seed(make_gen(seed, iter_num, rank, 1).initial_seed())
        loss_acc = graphed(iter_num, lr) if graphed is not None else step(train_batch)
        if iter_num % log_interval == 0:
            if world > 1:  # every rank joins: the logged loss is the mean over the global batch
                dist.all_reduce(loss_acc)  # a sum: gloo has no AVG
                loss_acc /= world
            lossf, t1 = loss_acc.item(), time.time()  # (.item() syncs the GPU)
            dt_iter, warm = (t1 - t0) / (iter_num - it0 + 1), it0 > it_start  # (not 1st: compile)
            if warm and device_type == "cuda":  # MFU against a GPU's peak: CUDA only
                mfu = raw_model.estimate_mfu(batch_size * accum * world, dt_iter, peak_flops)
                running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
            t0, it0 = t1, iter_num + 1
            if master:
                eta = f"{(max_iters - iter_num) * dt_iter / 60:.1f}" if warm else "?"
                mfu_s = f", mfu {max(running_mfu, 0) * 100:.2f}%" if device_type == "cuda" else ""
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.3e}, {dt_iter * 1000:.1f} ms, "
                      f"{tokens_per_iter / dt_iter:,.0f} tok/s{mfu_s}, eta {eta} min")
                rec = {"iter": iter_num, "loss": lossf, "lr": lr, "dt_ms": dt_iter * 1000, "time": t1,
                       "tok_per_s": tokens_per_iter / dt_iter, **({"mfu": running_mfu} if mfu_s else {})}
                log_record(log, rec)
        iter_num += 1

    if world > 1:  # leave together, then end without the interpreter's shutdown: DDP keeps references to the
        dist.barrier()  # process group, and gloo's threads running into it end in SIGABRT (torch 2.13)
        dist.destroy_process_group()
        unlock_folder(out_dir)  # (os._exit runs no atexit handler, nor flushes stdout)
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (PrepareError, CheckpointError) as e:  # missing or damaged data, a file that is no checkpoint, ...
        sys.exit(f"error: {e}")
    except OSError as e:  # a file that cannot be read or written
        sys.exit(f"error: {e.filename}: {e.strerror}")
