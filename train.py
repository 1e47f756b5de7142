"""
Train a GPT with PoPE, RoPE or no positional embedding, nanoGPT style.

Usage:
    python train.py [config/FILE.py] [--key=value ...]
    python train.py config/pope_124m.py --batch_size=16 --max_iters=2000
    torchrun --standalone --nproc_per_node=8 train.py config/pope_124m.py
    python train.py --out_dir=out-jsb --init_from=resume --eval_only=True \
        --eval_full=True --eval_splits=test     # full-split NLL/accuracy of a checkpoint
    python train.py --help                     # every key with its default

Configuration: the defaults below, then the config file (plain Python
assignments), then --key=value overrides (Python literals; strings may be bare).
Unknown keys and wrongly typed values are errors.

Data: data/<dataset>/{train,val[,test]}.bin token ids (uint16, or uint32 when
vocab_size > 65535), meta.json with vocab_size, dtype and "tokenizer": "gpt2"
or "itos", and optionally {split}_mask.bin (uint8, 1 = the token is scored as
a target) and "row_len": L (the .bin holds fixed rows of L tokens; batches then
take whole rows instead of random windows). Make them with prepare/*.py.
"""

import ast
import difflib
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

# -----------------------------------------------------------------------------
# defaults: the paper's OpenWebText setup at 124M (RMSNorm, head dim 64, batch
# 64 x 1024, AdamW 6e-4 -> 6e-5 cosine over 100k iters, 1k warmup, wd 0.01,
# beta2 0.95, grad clip 1.0, no dropout)
# I/O
out_dir = "out"
eval_interval = 1000
log_interval = 10
eval_iters = 100  # batches per split for the periodic eval
eval_only = False  # evaluate and exit (with init_from="resume": a checkpoint)
eval_full = False  # eval over the whole split (every row / window) instead of eval_iters batches
eval_splits = "train,val"  # comma-separated splits for the eval
always_save_checkpoint = True  # else only when val loss improves
init_from = "scratch"  # "scratch" | "resume" (out_dir/ckpt.pt) | path/to/ckpt.pt (weights only: fine-tuning)
seed = 1337
# data
dataset = "openwebtext"
data_dir = "data"  # datasets live in data_dir/<dataset>/
gradient_accumulation_steps = 4  # micro-steps per optimizer step (global, split over DDP ranks)
batch_size = 16  # micro-batch size
block_size = 1024
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
attn_impl = "auto"  # "auto" | "torch" | "triton"
rope_scaling = 1.0  # YaRN scale for RoPE (1.0 = off)
rope_scaling_orig_len = 0  # YaRN's original context (0 = block_size)
# AdamW
learning_rate = 6e-4
max_iters = 100000
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0  # 0 disables
# learning rate schedule
decay_lr = True
warmup_iters = 1000
lr_decay_iters = 100000
min_lr = 6e-5
# system
device = "auto"  # "auto" (cuda if available) | "cpu" | "cuda" | "cuda:1" ...
dtype = "auto"  # "auto" (bfloat16 on cuda, float32 on cpu) | "float32" | "bfloat16" | "float16"
compile = False  # torch.compile the model
# torch.compile mode: "default" | "reduce-overhead" (CUDA graphs: small models are bound by kernel
# launches; 2.6x (RoPE) and 4x (PoPE) faster steps for the indirect-indexing model on an H200) | "max-autotune"
compile_mode = "default"
peak_flops = 989e12  # for MFU: dense bf16 peak of an H100/H200
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]


def configure(argv, defaults):
    """Apply a config file and --key=value overrides to a dict of defaults."""
    cfg = dict(defaults)

    def set_key(key, val, where):
        if key not in cfg:
            close = difflib.get_close_matches(key, cfg, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            sys.exit(f"error: unknown config key '{key}' ({where}).{hint}\nvalid keys: {', '.join(sorted(cfg))}")
        want = type(defaults[key])
        if want is float and type(val) is int:
            val = float(val)
        if type(val) is not want:
            sys.exit(f"error: config key '{key}' ({where}) must be {want.__name__} "
                     f"(default {defaults[key]!r}), got {type(val).__name__} {val!r}")
        cfg[key] = val

    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__)
            print("keys and defaults:")
            for k in defaults:
                print(f"  --{k}={defaults[k]!r}")
            sys.exit(0)
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                sys.exit(f"error: config file {arg} not found (configs live in config/)")
            scope = {}
            exec(open(arg).read(), {}, scope)
            for k, v in scope.items():
                if not k.startswith("_") and not callable(v) and type(v).__name__ != "module":
                    set_key(k, v, f"in {arg}")
        else:
            if "=" not in arg:
                sys.exit(f"error: expected --key=value, got {arg}")
            key, val = arg[2:].split("=", 1)
            try:
                val = ast.literal_eval(val)
            except (SyntaxError, ValueError):
                pass  # a bare string, e.g. --dataset=jsb
            set_key(key, val, f"--{key}")
    return cfg


# -----------------------------------------------------------------------------
# data

class Data:
    """Token memmaps of one dataset, with optional loss masks and fixed rows.

    Training batches are drawn from a generator seeded by (seed, iter, global
    micro-step), so the sampler's whole state is the iteration number: a resumed
    run draws exactly the batches the uninterrupted run would have, and N DDP
    ranks together draw exactly the global batch of one process."""

    def __init__(self, data_dir, block_size):
        meta_path = os.path.join(data_dir, "meta.json")
        name = os.path.basename(os.path.normpath(data_dir))
        if not os.path.isfile(meta_path):
            raise SystemExit(f"error: no dataset at {data_dir} (missing meta.json). "
                             f"Create it with: python prepare/{name}.py (see README.md, Data)")
        self.dir = data_dir
        self.meta = json.load(open(meta_path))
        self.dtype = np.dtype(self.meta.get("dtype", "uint16"))
        self.row_len = self.meta.get("row_len")
        if self.row_len and block_size < self.row_len - 1:
            raise SystemExit(f"error: dataset rows hold {self.row_len} tokens, so block_size must be at least "
                             f"{self.row_len - 1}; got block_size={block_size}")
        self.T = self.row_len - 1 if self.row_len else block_size

    def arrays(self, split):
        path = os.path.join(self.dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path} not found; re-run the prepare script for this dataset")
        # a fresh memmap per batch, as nanoGPT does, avoids a memory leak
        data = np.memmap(path, dtype=self.dtype, mode="r")
        mpath = os.path.join(self.dir, f"{split}_mask.bin")
        mask = np.memmap(mpath, dtype=np.uint8, mode="r") if os.path.isfile(mpath) else None
        if mask is not None and len(mask) != len(data):
            raise SystemExit(f"error: {mpath} has {len(mask)} entries but {path} has {len(data)}")
        need = self.row_len if self.row_len else self.T + 1
        if len(data) < need:
            raise SystemExit(f"error: {path} holds {len(data)} tokens, fewer than one sequence ({need})")
        return data, mask

    def num_sequences(self, split):
        data, _ = self.arrays(split)
        return len(data) // self.row_len if self.row_len else (len(data) - 1) // self.T

    def starts(self, split, n, gen):
        """n random sequence starts."""
        data, _ = self.arrays(split)
        if self.row_len:
            return torch.randint(len(data) // self.row_len, (n,), generator=gen) * self.row_len
        return torch.randint(len(data) - self.T, (n,), generator=gen)

    def batch(self, split, starts, device):
        data, mask = self.arrays(split)
        # one fancy-indexed gather for all rows: a Python loop over rows costs milliseconds per
        # step, which is most of a step for the small task models
        ix = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.T + 1)
        w = torch.from_numpy(data[ix].astype(np.int64))
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        m = torch.from_numpy(mask[ix[:, 1:]].astype(np.float32)) if mask is not None else None
        if "cuda" in str(device):
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
            m = m.pin_memory().to(device, non_blocking=True) if m is not None else None
        else:
            x, y, m = x.to(device), y.to(device), (m.to(device) if m is not None else None)
        return x, y, m


def make_gen(*key):
    """A torch.Generator seeded from a tuple of ints, e.g. (seed, iter, micro)."""
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0] >> 1))
    return g


@torch.no_grad()
def evaluate(model, data, split, cfg, device, ctx, full=False):
    """Mean loss over scored targets and token accuracy (argmax == target over the
    same targets), on eval_iters fixed random batches or, with full, on every
    row / non-overlapping window of the split."""
    model.eval()
    if full:
        n = data.num_sequences(split)
        step = data.row_len if data.row_len else data.T
        all_starts = torch.arange(n) * step
        chunks = list(all_starts.split(cfg["batch_size"]))
    else:
        chunks = [data.starts(split, cfg["batch_size"], make_gen(cfg["seed"], split_id(split), k))
                  for k in range(cfg["eval_iters"])]
    loss_sum, correct, count = 0.0, 0.0, 0.0
    for starts in chunks:
        x, y, m = data.batch(split, starts, device)
        with ctx:
            logits, loss = model(x, y, m)
        w = m if m is not None else torch.ones_like(y, dtype=torch.float32)
        n_scored = w.sum().item()
        loss_sum += loss.item() * n_scored
        correct += ((logits.argmax(-1) == y).float() * w).sum().item()
        count += n_scored
    model.train()
    return {"loss": loss_sum / max(count, 1), "acc": correct / max(count, 1), "tokens": int(count)}


def split_id(split):
    return {"train": 0, "val": 1, "test": 2}.get(split, 3)


def get_lr(it, cfg):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters (or, without
    decay_lr, the constant learning_rate), then min_lr."""
    if it < cfg["warmup_iters"]:
        return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
    if not cfg["decay_lr"]:
        return cfg["learning_rate"]
    if it > cfg["lr_decay_iters"]:
        return cfg["min_lr"]
    ratio = (it - cfg["warmup_iters"]) / max(1, cfg["lr_decay_iters"] - cfg["warmup_iters"])
    return cfg["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg["learning_rate"] - cfg["min_lr"])


def save_atomic(obj, path):
    """Write to a temp file, then rename: a crash never leaves a half checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main(argv):
    cfg = configure(argv, {k: globals()[k] for k in config_keys})

    # distributed setup
    ddp = int(os.environ.get("RANK", -1)) != -1
    dev = cfg["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: device='cuda' but CUDA is not available here; pass --device=cpu")
    if ddp:
        rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
        if dev.startswith("cuda"):
            dev = f"cuda:{local_rank}"
            torch.cuda.set_device(dev)
        if cfg["gradient_accumulation_steps"] % world:
            sys.exit(f"error: gradient_accumulation_steps={cfg['gradient_accumulation_steps']} must be divisible "
                     f"by the number of processes ({world})")
    else:
        rank, world = 0, 1
    master = rank == 0
    accum = cfg["gradient_accumulation_steps"] // world
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dt = cfg["dtype"]
    if dt == "auto":
        dt = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if dt not in ("float32", "bfloat16", "float16"):
        sys.exit(f"error: dtype must be auto, float32, bfloat16 or float16; got {dt!r}")
    if cfg["compile_mode"] not in ("default", "reduce-overhead", "max-autotune"):
        sys.exit(f"error: compile_mode must be default, reduce-overhead or max-autotune; got {cfg['compile_mode']!r}")
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dt]
    ctx = nullcontext() if dt == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    out_dir = cfg["out_dir"]
    if master:
        os.makedirs(out_dir, exist_ok=True)

    # model
    model_keys = ["n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "pos_emb", "pope_base",
                  "rope_base", "pope_delta_init", "attn_impl", "rope_scaling", "rope_scaling_orig_len"]
    model_args = {k: cfg[k] for k in model_keys}
    iter_num, best_val_loss, ckpt = 0, 1e9, None
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    if cfg["init_from"] == "resume":
        if not os.path.isfile(ckpt_path):
            sys.exit(f"error: init_from='resume' but {ckpt_path} does not exist; train first or fix out_dir")
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        for k in model_keys:  # the architecture comes from the checkpoint; attn_impl may change
            if k not in ("attn_impl", "dropout"):
                model_args[k] = ckpt["model_args"][k]
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    elif cfg["init_from"].endswith(".pt"):
        # fine-tuning: weights from another run; fresh optimizer and iteration count. The context
        # (block_size) and YaRN may change; YaRN's original length defaults to the source's context.
        if not os.path.isfile(cfg["init_from"]):
            sys.exit(f"error: init_from checkpoint {cfg['init_from']} does not exist")
        ckpt = torch.load(cfg["init_from"], map_location="cpu", weights_only=False)
        for k in ("n_layer", "n_head", "n_embd", "bias", "pos_emb", "pope_base", "rope_base"):
            model_args[k] = ckpt["model_args"][k]
        if model_args["rope_scaling_orig_len"] == 0 and model_args["rope_scaling"] > 1.0:
            model_args["rope_scaling_orig_len"] = ckpt["model_args"]["block_size"]
        ckpt = {"model": ckpt["model"]}
    elif cfg["init_from"] != "scratch":
        sys.exit(f"error: init_from must be 'scratch', 'resume' or a path to a .pt checkpoint, got {cfg['init_from']!r}")
    cfg["block_size"] = model_args["block_size"]  # a resumed run keeps its checkpoint's context
    data = Data(os.path.join(cfg["data_dir"], cfg["dataset"]), cfg["block_size"])
    T = data.T
    model_args["vocab_size"] = data.meta["vocab_size"]
    if data.meta.get("tokenizer") == "gpt2":  # 50257 -> 50304, a multiple of 64, as nanoGPT: faster matmuls
        model_args["vocab_size"] = (data.meta["vocab_size"] + 63) // 64 * 64
    tokens_per_iter = accum * world * cfg["batch_size"] * T
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} ({accum} accum x {world} procs x {cfg['batch_size']} x {T})")
    torch.manual_seed(cfg["seed"] + rank)
    model = GPT(GPTConfig(**model_args))
    if ckpt is not None:
        model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.to(dev)
    if master:
        print(f"model: {model.get_num_params() / 1e6:.2f}M parameters, pos_emb={model_args['pos_emb']}")
    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type)
    if ckpt is not None and "optimizer" in ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
    raw_model = model
    if cfg["compile"]:
        if master:
            print("compiling the model...")
        model = torch.compile(model, mode=cfg["compile_mode"])
    if ddp:
        # 100 MB buckets: under torch.compile, DDP splits the graph at every bucket, and the default
        # 25 MB gives ~20 pieces for 124M. With gradients as views of the buckets (no copy), the
        # PoPE-124M step on 2 H200s went from 46.8 to 43.5 ms (1 GPU: 40.4-41.1 ms); RESULTS.md, section 6
        model = DDP(model, device_ids=[int(dev.split(":")[1])] if device_type == "cuda" else None,
                    bucket_cap_mb=100, gradient_as_bucket_view=True)
    if ckpt is not None and "rng" in ckpt:  # RNG states last, so nothing above consumes from them
        rng = {k: v[rank % len(v)] if v else None for k, v in ckpt["rng"].items()}  # one state per rank
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if device_type == "cuda" and rng["cuda"] is not None:
            torch.cuda.set_rng_state(rng["cuda"], dev)
        ckpt = None  # free memory
    else:
        random.seed(cfg["seed"] + rank)
        np.random.seed(cfg["seed"] + rank)

    metrics = open(os.path.join(out_dir, "metrics.jsonl"), "a") if master else None

    def log(rec):
        if master:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()

    def gather_rng(state):
        if not ddp:
            return [state]
        out = [None] * world
        dist.all_gather_object(out, state)
        return out

    splits = [s for s in cfg["eval_splits"].split(",") if s]
    t0, it0, it_start = time.time(), iter_num, iter_num  # it0: first iteration of the timing window
    running_mfu = -1.0
    while True:
        lr = get_lr(iter_num, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        last = iter_num >= cfg["max_iters"]
        if iter_num % cfg["eval_interval"] == 0 or last or cfg["eval_only"]:
            res = {s: evaluate(model, data, s, cfg, dev, ctx, cfg["eval_full"]) for s in splits}
            if master:
                msg = ", ".join(f"{s} loss {r['loss']:.4f} acc {r['acc']:.4f}" for s, r in res.items())
                print(f"step {iter_num}: {msg}")
                log({"iter": iter_num, "eval": res})
            val_loss = res["val"]["loss"] if "val" in res else None
            if cfg["eval_only"]:
                if master:
                    with open(os.path.join(out_dir, "eval.json"), "w") as f:
                        json.dump({"iter": iter_num, "full": cfg["eval_full"], **res}, f, indent=1)
                break
            improved = val_loss is not None and val_loss < best_val_loss
            if improved:
                best_val_loss = val_loss
            # every rank gathers (a collective), whatever it would decide about saving
            rng = {"python": gather_rng(random.getstate()), "numpy": gather_rng(np.random.get_state()),
                   "torch": gather_rng(torch.get_rng_state()),
                   "cuda": gather_rng(torch.cuda.get_rng_state(dev)) if device_type == "cuda" else None}
            if master and iter_num > 0 and (improved or cfg["always_save_checkpoint"] or val_loss is None):
                save_atomic({
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                    "config": cfg, "meta": data.meta, "rng": rng,
                    "sampler": {"seed": cfg["seed"], "iter_num": iter_num, "world": world},
                }, ckpt_path)
                print(f"saved checkpoint to {ckpt_path}")
            t0, it0 = time.time(), iter_num  # keep eval time out of the step timing
        if last:
            break

        # one optimizer step over accum micro-batches; DDP syncs grads on the last one only
        loss_acc = torch.zeros((), device=dev)
        for micro in range(accum):
            gen = make_gen(cfg["seed"], iter_num, rank * accum + micro)
            x, y, m = data.batch("train", data.starts("train", cfg["batch_size"], gen), dev)
            sync = (not ddp) or micro == accum - 1
            with (nullcontext() if sync else model.no_sync()):
                with ctx:
                    _, loss = model(x, y, m)
                    loss = loss / accum
                scaler.scale(loss).backward()
            loss_acc += loss.detach()
        if cfg["grad_clip"] > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        if iter_num % cfg["log_interval"] == 0:
            if ddp:  # every rank joins: the logged loss is the mean over the global batch
                dist.all_reduce(loss_acc)  # a sum: gloo has no AVG
                loss_acc /= world
            lossf = loss_acc.item()  # syncs the GPU
            t1 = time.time()
            dt_iter = (t1 - t0) / (iter_num - it0 + 1)
            t0, it0 = t1, iter_num + 1
            if master:
                tok_s = tokens_per_iter / dt_iter
                if iter_num > it_start:  # the first window holds compile and warm-up
                    mfu = raw_model.estimate_mfu(cfg["batch_size"] * accum * world, dt_iter, cfg["peak_flops"])
                    running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
                eta = (cfg["max_iters"] - iter_num) * dt_iter
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.3e}, {dt_iter * 1000:.1f} ms, "
                      f"{tok_s:,.0f} tok/s, mfu {max(running_mfu, 0) * 100:.2f}%, eta {eta / 60:.1f} min")
                log({"iter": iter_num, "loss": lossf, "lr": lr, "dt_ms": dt_iter * 1000, "tok_per_s": tok_s,
                     "mfu": running_mfu, "time": t1})
        iter_num += 1

    if master:
        metrics.close()
    if ddp:
        # leave together: a rank that tears its process group down while rank 0 is still
        # writing the last checkpoint can abort in gloo's teardown ("terminate called
        # without an active exception", 2 runs in 12 on a 2-core box without this barrier)
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
