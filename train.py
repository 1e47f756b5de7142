"""
Train a GPT with PoPE, RoPE or no positional embedding, nanoGPT style:
python train.py [config/FILE.py] [--key=value ...], or under torchrun for DDP. --help lists every
setting. Fine-tune: --init_from=path/ckpt.pt; a checkpoint's full-split loss: --init_from=resume
--eval_only=True --eval_full=True (into out_dir/eval.json).
"""

import json
import math
import os
import sys
import time
from contextlib import nullcontext, suppress
from dataclasses import asdict
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import configure
from model import GPT, CheckpointError, GPTConfig, all_finite, read_checkpoint
from model import cuda_graph as capture_graph
from prepare.common import (
    AT_LEAST_1,
    DEVICE_RULE,
    KERNEL_RULE,
    SEED_RULE,
    PrepareError,
    broken_rules,
    check_dataset,
    check_outputs,
    lock_folder,
    model_vocab,
    output_file,
    resolve_device,
    unlock_folder,
    write_json,
)

# -----------------------------------------------------------------------------
# defaults: the paper's OpenWebText setup at 124M (RMSNorm, batch 64 x 1024)
# I/O
out_dir = "out"
eval_interval = 1000
log_interval = 10
eval_iters = 100  # batches per split for the periodic eval
eval_only = False  # evaluate and exit (init_from: resume or a path)
eval_full = False  # the whole split, not eval_iters batches
eval_splits = "train,val"  # comma-separated
always_save_checkpoint = True  # else only when val loss improves
init_from = "scratch"  # "scratch" | "resume" (out_dir/ckpt.pt) | path/ckpt.pt (a fine-tune)
data_changed_ok = False  # a resume may go on with other data (this once)
overwrite = False  # a new run may replace out_dir's checkpoint
seed = 1337
# data: data_dir/<dataset>/ as prepare/*.py writes it (see Data)
dataset = "openwebtext"
data_dir = "data"
gradient_accumulation_steps = 4  # micro-steps per optimizer step (global, split over DDP ranks)
batch_size = 16  # micro-batch size
block_size = 1024
train_mask = True  # the loss where {split}_mask.bin scores; False: every train token (eval: masks)
# model
n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0
bias = False
pos_emb = "pope"  # "pope" | "rope" | "none"
pope_base = 10000.0
rope_base = 10000.0
pope_delta_init = "zero"  # "zero" | "uniform"
pope_delta_bound = "wrap"  # "wrap" | "clamp" | "project": delta's bound (model.pope_delta)
attn_impl = "auto"  # "auto" | "torch" | "triton"
rope_scaling = 1.0  # YaRN scale for RoPE (1.0 = off)
rope_scaling_orig_len = 0  # YaRN's original context (0 = block_size)
# AdamW and its learning rate schedule: a linear warmup to learning_rate, a cosine decay to min_lr
learning_rate = 6e-4
min_lr = 6e-5
max_iters = 100000
weight_decay = 0.01
grad_clip = 1.0  # 0 disables
beta1 = 0.9
beta2 = 0.95
decay_lr = True  # False: learning_rate after the warmup
warmup_iters = 1000
lr_decay_iters = 100000
# system
device = "auto"  # "auto" | "cpu" | "cuda[:N]"
dtype = "auto"  # "auto" (bfloat16 on cuda) | "float32" | "bfloat16" | "float16"
compile = False
peak_flops = 989e12  # for MFU: dense bf16 peak of an H100/H200
cuda_graph = False  # one GPU: the whole optimizer step as one CUDA graph (for host-bound models)
# -----------------------------------------------------------------------------
DEFAULTS = {k: v for k, v in globals().items()
            if k[0] != "_" and type(v) in (int, float, bool, str)}
MODEL_KEYS = [k for k in GPTConfig.__dataclass_fields__ if k != "vocab_size"]  # (the data's)
RESUME_MAY_CHANGE = ("attn_impl", "dropout")  # the model keys a resume may set anew
FINETUNE_KEEPS = "n_layer n_head n_embd bias pos_emb pope_base rope_base pope_delta_bound".split()
RESUMES_FROM = ("optimizer", "config", "meta", "data", "iter_num", "best_val_loss")
SPLIT_NAMES = ("train", "val", "test")  # eval_splits' choices (an eval's batches seed by index)
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # torchrun sets all
MAX_BATCH_TOKENS = 1 << 24  # batch_size x block_size: a micro-batch's positions (int64 indices)
RULES = {  # setting: (rule(value, settings), what it must be); NaN fails all
    **dict.fromkeys(
        ("gradient_accumulation_steps", "block_size", "eval_interval", "log_interval", "eval_iters",
         "lr_decay_iters"),
        AT_LEAST_1,
    ),
    "out_dir": (lambda v, c: v.strip() != "", "a folder's name"),
    "batch_size": (lambda v, c: 1 <= v and v * c["block_size"] <= MAX_BATCH_TOKENS,
                   f">= 1, batch_size x block_size <= {MAX_BATCH_TOKENS:,}; larger batches: "
                   "gradient_accumulation_steps"),
    "max_iters": (lambda v, c: v >= 0, ">= 0"),
    "eval_only": (lambda v, c: not v or c["init_from"] != "scratch",
                  "False unless init_from=resume or a path"),
    "warmup_iters": (lambda v, c: v >= 0, ">= 0"),
    "seed": SEED_RULE,
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
    "device": DEVICE_RULE,
    "attn_impl": KERNEL_RULE,
}


def settings(argv):
    """(cfg, checkpoint or None, the run's GPTConfig less the data's vocab_size): the defaults with
    argv applied, checked (RULES, GPTConfig) before anything is written. A resume continues its
    checkpoint's settings, the keys given on top; a fine-tune keeps FINETUNE_KEEPS. One run per
    out_dir: rank 0 locks it."""
    cfg, given = configure(argv, DEFAULTS, __doc__)
    unset = [k for k in TORCHRUN if k not in os.environ]
    if 0 < len(unset) < len(TORCHRUN):
        found = [k for k in TORCHRUN if k not in unset]
        sys.exit(f"error: {', '.join(found)} set without {', '.join(unset)}: start a DDP run with "
                 "torchrun, or unset them")
    resume = cfg["init_from"] == "resume"
    path = os.path.join(cfg["out_dir"], "ckpt.pt")
    master = os.environ.get("RANK", "0") == "0"
    hint = "wait for it to end, or pick another --out_dir"
    if master:  # a folder no run can write into (read-only, a file): one line, first
        check_outputs(out_dir=path)
    ckpt = None
    if cfg["init_from"] != "scratch":
        if resume and master and os.path.isdir(cfg["out_dir"]):
            lock_folder(cfg["out_dir"], hint)
        src = path if resume else cfg["init_from"]
        ckpt = read_checkpoint(src)
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
    elif ckpt is not None:  # YaRN's keys too, unless given
        yarn = [k for k in ("rope_scaling", "rope_scaling_orig_len") if k not in given]
        cfg.update({k: margs[k] for k in FINETUNE_KEEPS + yarn})
        if cfg["rope_scaling"] > 1.0 and cfg["rope_scaling_orig_len"] == 0:
            cfg["rope_scaling_orig_len"] = margs["rope_scaling_orig_len"] or margs["block_size"]
    problems = broken_rules(cfg, RULES)
    try:
        model_config = GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})
    except ValueError as e:
        problems.append(str(e))
    if problems:
        sys.exit("error: bad settings: " + "; ".join(problems))
    if master and not resume:
        os.makedirs(cfg["out_dir"], exist_ok=True)
        lock_folder(cfg["out_dir"], hint)
        if os.path.exists(path) and not cfg["overwrite"]:
            sys.exit(f"error: {path} exists: resume it with --init_from=resume, or pick another "
                     "--out_dir (--overwrite=True replaces it)")
    return cfg, ckpt, model_config


# data: batches seeded by (seed, iteration, micro-step): a resume, N DDP ranks draw one run's

def make_gen(*key):
    """A torch.Generator seeded by the ints key."""
    state = np.random.SeedSequence(key).generate_state(1, "u8")[0]
    return torch.Generator().manual_seed(int(state) >> 1)


class Data:
    """A dataset of prepare/*.py: {split}.bin token ids, meta.json, {split}_mask.bin (1 = a target)
    or none. A batch takes whole rows where meta has row_len, else windows of block_size + 1
    tokens. Files open once: a set prepared meanwhile cannot change a run's data."""

    def __init__(self, path, block_size, splits):
        self.dir = path
        self.meta = check_dataset(path, splits)
        self.dtype = np.dtype(self.meta["dtype"])
        self.row_len = self.meta.get("row_len")
        self.T = self.row_len - 1 if self.row_len else block_size
        if self.T != block_size:
            raise PrepareError(f"{path} holds rows of {self.row_len} tokens: "
                               f"block_size must be {self.T}")
        names = [f for s in sorted(set(splits)) for f in (f"{s}.bin", f"{s}_mask.bin")]
        self.files = {f: open(f"{path}/{f}", "rb") for f in names if os.path.exists(f"{path}/{f}")}
        # the files' sizes and times (checkpoints keep them): what a rewrite changes
        stats = {f: os.fstat(h.fileno()) for f, h in self.files.items()}
        self.stamp = {"bytes": {f: st.st_size for f, st in stats.items()},
                      "mtime_ns": {f: st.st_mtime_ns for f, st in stats.items()}}
        sizes = self.stamp["bytes"]
        short = [s for s in splits if sizes[f"{s}.bin"] <= self.T * self.dtype.itemsize]
        if short:
            raise PrepareError(f"{path}/{short[0]}.bin holds fewer than block_size + 1 = "
                               f"{self.T + 1} tokens")

    def arrays(self, split, masked=True):
        """The split's tokens and mask (or None), fresh memmaps each batch (nanoGPT's: no leak)."""
        mask = self.files.get(f"{split}_mask.bin") if masked else None
        tokens = np.memmap(self.files[f"{split}.bin"], dtype=self.dtype, mode="r")
        return tokens, None if mask is None else np.memmap(mask, dtype=np.uint8, mode="r")

    def starts(self, split, n, gen):
        """n random starts of rows (or windows) in split, drawn with gen."""
        N = len(self.arrays(split)[0])
        if self.row_len:
            return torch.randint(N // self.row_len, (n,), generator=gen) * self.row_len
        return torch.randint(N - self.T, (n,), generator=gen)

    def get_batch(self, split, starts, device, masked=True):
        """x, y and the loss mask (or None) of the rows at starts, on device."""
        data, mask = self.arrays(split, masked)
        ix = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.T + 1)
        w = torch.from_numpy(data[ix].astype(np.int64))
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        m = None if mask is None else torch.from_numpy(mask[ix[:, 1:]].astype(np.float32))
        if "cuda" in str(device):
            return [t if t is None else t.pin_memory().to(device, non_blocking=True)
                    for t in (x, y, m)]
        return x.to(device), y.to(device), m if m is None else m.to(device)


@torch.no_grad()
def evaluate(model, data, split, dev, ctx, c, bar=False):
    """Loss and accuracy on split's scored targets: c's eval_iters batches (the same each eval),
    or with eval_full the whole split (rows, or windows and one more for the last targets)."""
    model.eval()
    B = c["batch_size"]
    tail = 0
    if c["eval_full"]:
        step = data.row_len or data.T
        n = len(data.arrays(split)[0])
        if not data.row_len:
            n -= 1  # (a window's last target)
        batches = list((torch.arange(n // step) * step).split(B))
        tail = n % step
        if tail:
            batches.append(torch.tensor([n - step]))
    else:
        key = SPLIT_NAMES.index(split)
        gens = [make_gen(c["seed"], key, k) for k in range(c["eval_iters"])]
        batches = [data.starts(split, B, gen) for gen in gens]
    loss_sum, correct, count = 0.0, 0.0, 0.0
    disable = None if bar else True
    for starts in tqdm(batches, f"eval {split}", leave=False, file=sys.stderr, disable=disable):
        x, y, m = data.get_batch(split, starts, dev)
        if tail and starts is batches[-1]:
            m = torch.ones_like(y, dtype=torch.float32) if m is None else m.clone()
            m[:, :-tail] = 0
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


def get_lr(it, c):
    """c's learning rate at iteration it: a linear warmup, then a cosine decay to min_lr at
    lr_decay_iters (without decay_lr: learning_rate)."""
    lr = c["learning_rate"]
    warmup = c["warmup_iters"]
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if not c["decay_lr"]:
        return lr
    ratio = min(1.0, (it - warmup) / max(1, c["lr_decay_iters"] - warmup))
    return c["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - c["min_lr"])


def train_step(model, raw_model, optimizer, scaler, ctx, accum, clip, batch):
    """One optimizer step over accum micro-batches (batch(micro) -> x, y, mask); GraphedStep
    captures it."""
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
    """train_step as one CUDA graph, gathering the eager loop's batches from the train split on the
    GPU (their starts copied in before each replay); AdamW becomes capturable (lr a tensor)."""

    def __init__(self, step, raw_model, optimizer, data, accum, c):
        params = list(raw_model.parameters())
        dev = params[0].device
        tokens, mask = data.arrays("train", masked=c["train_mask"])
        self.tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(dev)
        self.mask = torch.from_numpy(np.asarray(mask)).to(dev) if mask is not None else None
        self.offsets = torch.arange(data.T + 1, device=dev)
        self.starts = torch.zeros(accum, c["batch_size"], dtype=torch.long, device=dev)
        self.host = [torch.zeros_like(self.starts, device="cpu").pin_memory() for _ in range(2)]
        self.copied = [torch.cuda.Event(), torch.cuda.Event()]  # the copy out of host[i] is done
        self.data = data
        self.seed = c["seed"]
        self.lr = torch.tensor(c["learning_rate"], device=dev)
        for g in optimizer.param_groups:  # lr: a tensor, filled before each replay
            g.update(lr=self.lr, capturable=True, foreach=True, fused=None)
        for p in params:  # AdamW's state now: the warm-up can be undone
            st = optimizer.state[p]
            st["step"] = st["step"].to(dev, torch.float32) if st else torch.zeros((), device=dev)
            for k in ("exp_avg", "exp_avg_sq"):
                st.setdefault(k, torch.zeros_like(p, memory_format=torch.preserve_format))
        state = params + [t for p in params for t in optimizer.state[p].values()]
        self.replay, self.loss = capture_graph(partial(step, self.batch), state, warmup=3)

    def batch(self, micro):
        ix = self.starts[micro][:, None] + self.offsets
        w = self.tokens[ix].long()
        m = None if self.mask is None else self.mask[ix[:, 1:]].float()
        return w[:, :-1], w[:, 1:], m

    def __call__(self, iter_num, lr):
        """Step iter_num at learning rate lr: its loss."""
        i = iter_num % 2
        self.copied[i].synchronize()  # the copy of two steps ago reads host[i]
        accum, B = self.starts.shape
        for micro in range(accum):
            self.host[i][micro] = self.data.starts("train", B, make_gen(self.seed, iter_num, micro))
        self.starts.copy_(self.host[i], non_blocking=True)
        self.copied[i].record()
        self.lr.fill_(lr)
        self.replay()
        return self.loss


def setup_device(c):
    """DDP (under torchrun), the device, the dtype and its autocast context of settings c:
    (rank, world, dev, dt, ctx)."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    dev = resolve_device(c["device"])
    dt = c["dtype"]
    if dt == "auto":
        dt = "bfloat16" if dev.startswith("cuda") else "float32"
    if c["gradient_accumulation_steps"] % world:
        sys.exit(f"error: gradient_accumulation_steps is not a multiple of the {world} processes")
    if c["cuda_graph"] and (world > 1 or dev == "cpu" or dt == "float16"):
        sys.exit("error: cuda_graph needs one CUDA GPU and bfloat16 or float32")
    if world > 1:
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
        if dev.startswith("cuda"):
            dev = f"cuda:{os.environ['LOCAL_RANK']}"
            torch.cuda.set_device(dev)
    ctx = nullcontext()
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if dt != "float32":
        ctx = torch.autocast(dev.split(":")[0], dtype=getattr(torch, dt))
    return rank, world, dev, dt, ctx


def main(argv):
    """A run, nanoGPT's loop; the settings are plain names here, the helpers take them as c."""
    cfg, ckpt, model_config = settings(argv)
    globals().update(cfg)
    rank, world, dev, dt, ctx = setup_device(cfg)
    master = rank == 0
    resume = init_from == "resume"
    device_type = dev.split(":")[0]
    accum = gradient_accumulation_steps // world
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    splits = eval_splits.split(",")
    data = Data(f"{data_dir}/{dataset}", block_size, splits if eval_only else splits + ["train"])
    if resume:  # a resume goes on with its checkpoint's data
        changed = [f for f in data.files if any(ckpt["data"].get(k, {}).get(f, now[f]) != now[f]
                                                for k, now in data.stamp.items())]
        if ckpt["meta"] != data.meta:
            changed.insert(0, "meta.json")
        if changed and not data_changed_ok:
            sys.exit(f"error: {', '.join(changed)} in {data.dir} changed since {ckpt_path} was "
                     "saved: restore it, or pass --data_changed_ok=True to go on with this data")

    model_config.vocab_size = model_vocab(data.meta)
    margs = asdict(model_config)
    if ckpt is not None and ckpt["model_args"]["vocab_size"] != model_config.vocab_size:
        sys.exit(f"error: {init_from} has vocab_size {ckpt['model_args']['vocab_size']}, "
                 f"{dataset} {model_config.vocab_size}: use data with that vocabulary")
    iter_num = 0
    best_val_loss = 1e9
    if resume or eval_only:  # (eval.json's iter: the checkpoint's)
        iter_num = ckpt.get("iter_num", 0)
        best_val_loss = ckpt.get("best_val_loss", 1e9)
    torch.manual_seed(seed)
    model = GPT(model_config)
    if ckpt is not None:
        model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.to(dev)
    tokens_per_iter = accum * world * batch_size * data.T
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} ({accum} accum x {world} procs x "
              f"{batch_size} x {data.T}), data {data.dir}\n"
              f"model: {model.get_num_params() / 1e6:.2f}M parameters, "
              f"{model.attention_path(compiled=compile)}")
    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    if resume:
        optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("scaler"):  # float16's loss scale (empty when off)
            scaler.load_state_dict(ckpt["scaler"])
    ckpt = None  # (free memory)
    raw_model = model
    if compile:
        model = torch.compile(model)
    if world > 1:  # large buckets: torch.compile splits the graph at each
        model = DDP(model, device_ids=[int(dev.split(":")[1])] if device_type == "cuda" else None,
                    bucket_cap_mb=100, gradient_as_bucket_view=True)

    def train_batch(micro):
        """This rank's micro-batch of iteration iter_num's global batch."""
        starts = data.starts("train", batch_size, make_gen(seed, iter_num, rank * accum + micro))
        return data.get_batch("train", starts, dev, masked=train_mask)

    step = partial(train_step, model, raw_model, optimizer, scaler, ctx, accum, grad_clip)
    graphed = None
    if cuda_graph and not eval_only:
        graphed = GraphedStep(step, raw_model, optimizer, data, accum, cfg)
    if master and not (resume or eval_only):  # a new run: no checkpoint or eval.json of an old one
        for f in filter(os.path.exists, (ckpt_path, os.path.join(out_dir, "eval.json"))):
            os.remove(f)
    log = None
    if master:
        log = open(os.path.join(out_dir, "metrics.jsonl"), "a" if resume or eval_only else "w")
    t0 = time.time()
    it0 = iter_num  # the timing window's first iteration
    it_start = iter_num
    running_mfu = -1.0
    saved = False
    while True:
        lr = get_lr(iter_num, cfg)
        if graphed is None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        last = iter_num >= max_iters
        if iter_num % eval_interval == 0 or last or eval_only:
            res = {s: evaluate(model, data, s, dev, ctx, cfg, master) for s in splits}
            if master:
                scores = [f"{s} loss {r['loss']:.4f} acc {r['acc']:.4f}" for s, r in res.items()]
                print(f"step {iter_num}: " + ", ".join(scores))
                if eval_only:  # into eval.json, not the run's log
                    rec = {"iter": iter_num, "full": eval_full, **res}
                    write_json(os.path.join(out_dir, "eval.json"), rec)
                else:
                    log_record(log, {"iter": iter_num, "eval": res})
            if eval_only:
                break
            if not all(all_finite(p) for p in raw_model.parameters()):  # never saved
                sys.exit(f"error: the weights are not finite at iteration {iter_num}: it diverged")
            improved = "val" in res and res["val"]["loss"] < best_val_loss
            if improved:
                best_val_loss = res["val"]["loss"]
            # not at a run's first iteration: a resume's checkpoint is that one
            if master and iter_num > it_start and (improved or always_save_checkpoint
                                                   or "val" not in res):
                state = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "config": cfg,
                    "model_args": margs,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "meta": data.meta,
                    "data": data.stamp,
                }
                with output_file(ckpt_path) as f:  # whole or not at all: a crash leaves the old one
                    torch.save(state, f)
                saved = True
                print(f"saved checkpoint to {ckpt_path}")
            t0 = time.time()  # keep eval time out of the step timing
            it0 = iter_num
        if last:
            break
        if dropout > 0:  # the step's only draw from torch's RNG: reseeded, resumes stay bitwise
            torch.manual_seed(make_gen(seed, iter_num, rank, 1).initial_seed())
        if graphed is None:
            loss_acc = step(train_batch)
        else:
            loss_acc = graphed(iter_num, lr)
        if iter_num % log_interval == 0:
            if world > 1:  # every rank joins: the logged loss is the mean over the global batch
                dist.all_reduce(loss_acc)  # a sum: gloo has no AVG
                loss_acc /= world
            lossf = loss_acc.item()  # (it syncs the GPU)
            t1 = time.time()
            dt_iter = (t1 - t0) / (iter_num - it0 + 1)
            warm = it0 > it_start  # (not the first: compilation)
            if warm and device_type == "cuda":
                mfu = raw_model.estimate_mfu(batch_size * accum * world, dt_iter, peak_flops)
                running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
            t0 = t1
            it0 = iter_num + 1
            if master:
                eta = f"{(max_iters - iter_num) * dt_iter / 60:.1f}" if warm else "?"
                rec = {"iter": iter_num, "loss": lossf, "lr": lr, "dt_ms": dt_iter * 1000,
                       "time": t1, "tok_per_s": tokens_per_iter / dt_iter}
                mfu_s = ""
                if device_type == "cuda":
                    mfu_s = f", mfu {max(running_mfu, 0) * 100:.2f}%"
                    rec["mfu"] = running_mfu
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.3e}, {dt_iter * 1000:.1f} ms, "
                      f"{tokens_per_iter / dt_iter:,.0f} tok/s{mfu_s}, eta {eta} min")
                log_record(log, rec)
        iter_num += 1

    if master and not (eval_only or saved):  # say why
        why = f"val loss never below {best_val_loss:.4f}, always_save_checkpoint=False"
        if max_iters <= it_start:
            why = f"max_iters={max_iters} <= the checkpoint's iter {it_start}"
        print(f"note: no checkpoint saved: {why}", file=sys.stderr)
    if world > 1:
        # leave together, then skip the interpreter's shutdown: DDP holds references to the
        # process group, and gloo's threads running into it end in SIGABRT (torch 2.13)
        dist.barrier()
        dist.destroy_process_group()
        unlock_folder(out_dir)  # (os._exit runs no atexit handler, nor flushes stdout)
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (PrepareError, CheckpointError) as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        sys.exit(f"error: {e.filename}: {e.strerror}")
