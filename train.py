"""
Train a GPT with PoPE, RoPE or no positional embedding, nanoGPT style.

Usage:
    python train.py [config/FILE.py] [--key=value ...]
    python train.py config/pope_124m.py --batch_size=16 --max_iters=2000
    torchrun --standalone --nproc_per_node=8 train.py config/pope_124m.py
    python train.py --out_dir=out-jsb-pope --init_from=resume --eval_only=True \\
        --eval_full=True --eval_splits=test     # full-split NLL/accuracy of a checkpoint
    python train.py --help                     # every key with its default

Configuration (configurator.py): the defaults below, then the config file (plain
Python assignments), then --key=value overrides (Python literals; strings may be
bare). Unknown keys, wrongly typed values and nonsense settings are errors.

Data: data/<dataset>/{train,val[,test]}.bin token ids (uint16, or uint32 when
vocab_size > 65535), meta.json with vocab_size, dtype and "tokenizer": "gpt2"
or "itos", and optionally {split}_mask.bin (uint8, 1 = the token is scored as
a target) and "row_len": L (the .bin holds fixed rows of L tokens; batches then
take whole rows instead of random windows). Make them with prepare/*.py.
"""

import errno
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import (check_resume_data, claim_out_dir, config_problems, configure, load_weights, log_file,
                          model_args, resume_config, rng_states, set_rng_states)
from model import GPT, GPTConfig, kernel_unsupported_reason
from model import cuda_graph as capture_graph  # (cuda_graph is a setting below)
from prepare.common import REPO_ROOT, Data, PrepareError, make_gen, unlock_folder, write_atomic, write_json

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
data_changed_ok = False  # a resume may go on with data other than its checkpoint's (meta.json or a size differs)
seed = 1337
# data
dataset = "openwebtext"
data_dir = "data"  # datasets live in data_dir/<dataset>/
gradient_accumulation_steps = 4  # micro-steps per optimizer step (global, split over DDP ranks)
batch_size = 16  # micro-batch size
block_size = 1024
train_mask = True  # the loss where {split}_mask.bin scores; False: every train token (the eval keeps the masks)
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
pope_delta_bound = "wrap"  # "wrap" | "clamp" | "project": how delta stays in [-2pi, 0] (model.pope_delta)
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
compile_mode = "default"  # "default" | "reduce-overhead" (CUDA graphs, for small models) | "max-autotune"
peak_flops = 989e12  # for MFU: dense bf16 peak of an H100/H200
overwrite = False  # a new run (scratch or fine-tune) may replace out_dir's checkpoint and log
# one GPU: the whole optimizer step (batch gather, forward, backward, clip, AdamW) as one CUDA graph,
# with the training split held on the GPU. Small models are otherwise bound by host time.
cuda_graph = False
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]


@torch.no_grad()
def evaluate(model, data, split, cfg, device, ctx, full=False, bar=False):
    """Mean loss over scored targets and token accuracy (argmax == target over the
    same targets), on eval_iters fixed random batches or, with full, on every
    row / non-overlapping window of the split. bar: a progress bar on stderr where
    that is a terminal (it clears itself, so logs stay clean)."""
    model.eval()
    loss_sum, correct, count = 0.0, 0.0, 0.0
    batches = data.eval_starts(split, cfg["batch_size"], cfg["eval_iters"], cfg["seed"], full)
    for starts in tqdm(batches, desc=f"eval {split}", leave=False, file=sys.stderr, disable=None if bar else True):
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


def train_step(model, raw_model, optimizer, scaler, ctx, accum, grad_clip, batch):
    """The optimizer step, the one both paths run: forward and backward of accum
    micro-batches (batch(micro) -> inputs, targets, loss mask or None; under DDP the
    gradients sync on the last one only), gradient clipping, AdamW, PoPE's delta
    bound. Returns the mean loss as a tensor (reading it syncs the GPU). The eager
    loop calls it every iteration; GraphedStep captures it once as a CUDA graph."""
    total = 0.0
    for micro in range(accum):
        x, y, m = batch(micro)
        sync = not isinstance(model, DDP) or micro == accum - 1
        with nullcontext() if sync else model.no_sync():
            with ctx:
                _, loss = model(x, y, m)
                loss = loss / accum
            scaler.scale(loss).backward()
        total = total + loss.detach()
    if grad_clip > 0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    raw_model.project_delta_()
    optimizer.zero_grad(set_to_none=True)
    return total


class GraphedStep:
    """train_step as one CUDA graph (one GPU, bf16 or float32), its batches gathered
    on the GPU from the training split held there; AdamW becomes capturable (lr a
    tensor). Replaying it costs almost no host time. The batches are the eager loop's:
    their starts come from the same generators and are copied in before each replay."""

    def __init__(self, step, raw_model, optimizer, data, cfg, accum):
        params = list(raw_model.parameters())
        dev = params[0].device
        tokens, mask = data.arrays("train", masked=cfg["train_mask"])
        self.tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(dev)
        self.mask = torch.from_numpy(np.asarray(mask)).to(dev) if mask is not None else None
        self.offsets = torch.arange(data.T + 1, device=dev)
        self.starts = torch.zeros(accum, cfg["batch_size"], dtype=torch.long, device=dev)
        self.host = [torch.zeros_like(self.starts, device="cpu").pin_memory() for _ in range(2)]
        self.copied = [None, None]  # event: the copy out of host[i] is done
        self.data, self.cfg, self.accum = data, cfg, accum
        self.lr = torch.tensor(cfg["learning_rate"], device=dev)
        for g in optimizer.param_groups:  # AdamW reads lr from the tensor, updated before each replay
            g.update(lr=self.lr, capturable=True, foreach=True, fused=None)
        for p in params:  # AdamW's state made now (a fresh run's first step would), so the warm-up can be undone
            st = optimizer.state[p]
            st["step"] = st["step"].to(dev, torch.float32) if st else torch.zeros((), device=dev)
            for k in ("exp_avg", "exp_avg_sq"):
                st.setdefault(k, torch.zeros_like(p, memory_format=torch.preserve_format))
        state = params + [t for p in params for t in optimizer.state[p].values()]
        self.replay, self.loss = capture_graph(lambda: step(self.batch), state, warmup=3)

    def batch(self, micro):
        """Micro-batch micro: Data.batch's rows, gathered on the GPU from self.starts."""
        ix = self.starts[micro][:, None] + self.offsets
        w = self.tokens[ix].long()
        return w[:, :-1], w[:, 1:], (self.mask[ix[:, 1:]].float() if self.mask is not None else None)

    def __call__(self, iter_num, lr):
        """One optimizer step; returns the (static) loss tensor."""
        i = iter_num % 2
        if self.copied[i] is not None:
            self.copied[i].synchronize()  # host[i] is being read by the copy of two steps ago
        for micro in range(self.accum):
            gen = make_gen(self.cfg["seed"], iter_num, micro)
            self.host[i][micro] = self.data.starts("train", self.cfg["batch_size"], gen)
        self.starts.copy_(self.host[i], non_blocking=True)
        self.copied[i] = torch.cuda.Event()
        self.copied[i].record()
        self.lr.fill_(lr)
        self.replay()
        return self.loss


def setup_device(cfg):
    """DDP (under torchrun), the device, the dtype and its autocast context. Refuses,
    before anything is written, what cannot run here. Returns (ddp, rank, world, dev, dtype, ctx)."""
    ddp, rank, world = int(os.environ.get("RANK", -1)) != -1, 0, 1
    dev = cfg["device"]
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: device='cuda' but CUDA is not available here; pass --device=cpu")
    if ddp:
        rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
        if cfg["gradient_accumulation_steps"] % world:
            sys.exit(f"error: gradient_accumulation_steps={cfg['gradient_accumulation_steps']} must be divisible "
                     f"by the number of processes ({world})")
        dist.init_process_group(backend="nccl" if dev.startswith("cuda") else "gloo")
        if dev.startswith("cuda"):
            dev = f"cuda:{local_rank}"
            torch.cuda.set_device(dev)
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dt = cfg["dtype"]
    if dt == "auto":
        dt = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ctx = nullcontext() if dt == "float32" else torch.autocast(device_type=device_type, dtype=getattr(torch, dt))
    if cfg["cuda_graph"] and (ddp or device_type != "cuda" or dt == "float16" or cfg["compile_mode"] == "reduce-overhead"):
        sys.exit("error: cuda_graph=True needs one CUDA GPU (no torchrun), bfloat16 or float32, and "
                 "compile_mode other than reduce-overhead (that one makes CUDA graphs of its own)")
    if cfg["pos_emb"] == "pope" and cfg["attn_impl"] == "triton":  # the kernel's own rule, before anything is written
        probe = torch.zeros(1, cfg["n_head"], 1, cfg["n_embd"] // cfg["n_head"], device=dev)
        why = kernel_unsupported_reason(probe, probe, probe, probe[0, :, 0])
        if why:
            sys.exit(f"error: attn_impl='triton' cannot run here: {why}. Pass --attn_impl=auto (the kernel where it "
                     "can run, else PyTorch) or --attn_impl=torch")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return ddp, rank, world, dev, dt, ctx


def leave_ddp(out_dir):
    """Leave together, then end without the interpreter's shutdown: a DDP wrapper keeps
    references to the process group that nothing releases (torch 2.13), so gloo's threads
    run on into the shutdown, where CPython's forced unwind of a C++ thread that needs the
    GIL ends in std::terminate (SIGABRT in rank 1 of 2-rank CPU runs)."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    unlock_folder(out_dir)  # (os._exit runs no atexit handler)
    os._exit(0)


def save_checkpoint(path, state, ours):  # ours: path holds this run's checkpoint already
    try:  # a crash never leaves a half checkpoint
        write_atomic(path, lambda tmp: torch.save(state, tmp))
    except (OSError, RuntimeError) as e:  # a full or read-only disk; torch.save says RuntimeError
        why = getattr(e, "strerror", None) or (str(e).splitlines() or [""])[-1][:160]
        kept = "the checkpoint there before is intact" if ours else "this run saved no checkpoint"
        sys.exit(f"error: could not write {path} ({why}); {kept}. Free disk space (or make out_dir writable) and "
                 + ("resume with --init_from=resume" if ours else "start it again"))
    print(f"saved checkpoint to {path}")


def main(argv):
    defaults = {k: globals()[k] for k in config_keys}
    cfg, given = configure(argv, defaults, __doc__)
    if int(os.environ.get("RANK", 0)) == 0 and os.path.isdir(cfg["out_dir"]):
        claim_out_dir(cfg)  # before a resume reads the checkpoint: no live run can replace it under us
    cfg, ckpt = resume_config(cfg, given, defaults, argv)
    problems = config_problems(cfg)
    if problems:
        sys.exit("error: bad settings: " + "; ".join(problems))
    ddp, rank, world, dev, dt, ctx = setup_device(cfg)
    master, accum, device_type = rank == 0, cfg["gradient_accumulation_steps"] // world, dev.split(":")[0]
    resume = cfg["init_from"] == "resume"
    saved = resume  # out_dir's checkpoint is this run's (a resume, or once it saved)
    if master and not cfg["eval_only"] and cfg["max_iters"] < cfg["warmup_iters"]:
        print(f"warning: max_iters={cfg['max_iters']} < warmup_iters={cfg['warmup_iters']}: the run ends inside its "
              f"warm-up and never reaches learning_rate={cfg['learning_rate']:g}; pass a smaller --warmup_iters "
              "(and --lr_decay_iters=max_iters to decay within the run)")

    # data (checked before anything is written) and the run's folder
    splits = [s for s in cfg["eval_splits"].split(",") if s]
    data_path = os.path.join(cfg["data_dir"], cfg["dataset"])
    in_repo = REPO_ROOT / data_path
    if not os.path.isabs(data_path) and not os.path.isdir(data_path) and in_repo.is_dir():  # data_dir is cwd-relative
        sys.exit(f"error: dataset folder {data_path} not found under ./{cfg['data_dir']} (paths are relative to the "
                 f"current directory, {os.getcwd()}); it exists in {REPO_ROOT / cfg['data_dir']}: run from the "
                 f"repository root or pass --data_dir={REPO_ROOT / cfg['data_dir']}")
    read = sorted(set(splits) | ({"train"} if not cfg["eval_only"] else set()), key=("train", "val", "test").index)
    try:
        data = Data(data_path, cfg["block_size"], read)
    except PrepareError as e:
        sys.exit(f"error: {e}")
    if master:  # which data this run reads: a config's dataset is easy to overlook in a fine-tune
        sizes = ", ".join(f"{s} {len(data.arrays(s)[0]):,}" + " tokens" * (i == 0)
                          for i, s in enumerate(read))
        print(f"data: {data_path} ({sizes})")
        src = ckpt.get("config", {}).get("dataset") if ckpt is not None and not resume else None
        if src is not None and src != cfg["dataset"]:
            print(f"warning: {cfg['init_from']} was trained on dataset '{src}'; this fine-tune trains on "
                  f"'{cfg['dataset']}' ({data_path}); pass --dataset={src} if that is not what you meant")
    out_dir, ckpt_path, log_path = cfg["out_dir"], os.path.join(cfg["out_dir"], "ckpt.pt"), log_file(cfg)
    check_resume_data(cfg, ckpt, data, master)

    # model, optimizer, and the RNG states a resume continues
    margs = model_args(cfg, data.meta)
    iter_num, best_val_loss = (ckpt["iter_num"], ckpt["best_val_loss"]) if resume else (0, 1e9)
    tokens_per_iter = accum * world * cfg["batch_size"] * data.T
    torch.manual_seed(cfg["seed"] + rank)
    model = GPT(GPTConfig(**margs))
    if ckpt is not None:
        load_weights(model, ckpt, ckpt_path if resume else cfg["init_from"], cfg["dataset"])
    if master:  # every check passed: the run's folder (claimed already where out_dir existed)
        claim_out_dir(cfg, create=True)
    model.to(dev)
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} "
              f"({accum} accum x {world} procs x {cfg['batch_size']} x {data.T})")
        print(f"model: {model.get_num_params() / 1e6:.2f}M parameters, pos_emb={margs['pos_emb']}" + (
            "; on the CPU a model this size takes seconds or more per iteration (the CPU demo: "
            "config/indirect_indexing_quick.py)" if device_type == "cpu" and model.get_num_params() > 50e6 else ""))
        print(f"attention: {model.attention_path(dev)}")
    scaler = torch.amp.GradScaler(device_type, enabled=(dt == "float16"))
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"],
                                           (cfg["beta1"], cfg["beta2"]), device_type)
    if resume:
        optimizer.load_state_dict(ckpt["optimizer"])
    raw_model = model
    if cfg["compile"]:
        if master:
            print("compiling the model...")
        model = torch.compile(model, mode=cfg["compile_mode"])
    if ddp:
        # 100 MB buckets: under torch.compile, DDP splits the graph at every bucket, and the default
        # 25 MB gives ~20 pieces for 124M; gradients as views of the buckets save a copy (results/ddp.sh)
        model = DDP(model, device_ids=[int(dev.split(":")[1])] if device_type == "cuda" else None,
                    bucket_cap_mb=100, gradient_as_bucket_view=True)
    set_rng_states(ckpt if resume else None, cfg["seed"], rank, device_type)  # last: nothing above draws from them
    ckpt = None  # free memory
    step = partial(train_step, model, raw_model, optimizer, scaler, ctx, accum, cfg["grad_clip"])
    graphed = GraphedStep(step, raw_model, optimizer, data, cfg, accum) if cfg["cuda_graph"] and not cfg["eval_only"] \
        else None

    def train_batch(micro):  # this rank's micro-batch micro of iteration iter_num's global batch
        gen = make_gen(cfg["seed"], iter_num, rank * accum + micro)
        return data.batch("train", data.starts("train", cfg["batch_size"], gen), dev, masked=cfg["train_mask"])

    metrics = open(log_path, "a") if master else None

    def log(rec):  # (rank 0)
        try:
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
        except OSError as e:  # a full disk: name the file (the top-level handler prints one line)
            raise OSError(e.errno, e.strerror, log_path) from None

    def diverged(what):
        sys.exit(f"error: {what} at iteration {iter_num} is not finite: the run diverged (learning rate too high?). "
                 f"Nothing was saved; the last checkpoint in {out_dir} is untouched")

    t0, it0, it_start = time.time(), iter_num, iter_num  # it0: first iteration of the timing window
    running_mfu, timed_s, timed_iters = -1.0, 0.0, 0  # the ETA's rate: mean step time, evals and first step left out
    while True:
        lr = get_lr(iter_num, cfg)
        if graphed is None:
            for group in optimizer.param_groups:
                group["lr"] = lr
        last = iter_num >= cfg["max_iters"]
        if iter_num % cfg["eval_interval"] == 0 or last or cfg["eval_only"]:
            res = {s: evaluate(model, data, s, cfg, dev, ctx, cfg["eval_full"], bar=master) for s in splits}
            if master:
                msg = ", ".join(f"{s} loss {r['loss']:.4f} acc {r['acc']:.4f}" for s, r in res.items())
                print(f"step {iter_num}: {msg}")
                log({"iter": iter_num, "eval": res})
            if cfg["eval_only"]:
                if master:
                    write_json(os.path.join(out_dir, "eval.json"), {"iter": iter_num, "full": cfg["eval_full"], **res})
                    print(f"wrote {os.path.join(out_dir, 'eval.json')}")
                break
            if not all(math.isfinite(r["loss"]) for r in res.values()):
                diverged("the eval loss")
            if not all(torch.isfinite(p).all() for p in raw_model.parameters()):
                diverged("a weight")
            val_loss = res["val"]["loss"] if "val" in res else None
            improved = val_loss is not None and val_loss < best_val_loss
            best_val_loss = val_loss if improved else best_val_loss
            rng = rng_states(world)  # every rank joins, whatever is decided
            # (not at the iteration a run starts from: a resumed run's checkpoint is already that)
            if master and iter_num > it_start and (improved or cfg["always_save_checkpoint"] or val_loss is None):
                save_checkpoint(ckpt_path, {
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "model_args": margs, "iter_num": iter_num, "best_val_loss": best_val_loss,
                    "config": cfg, "meta": data.meta, "data": data.identity, "rng": rng,
                    "sampler": {"seed": cfg["seed"], "iter_num": iter_num, "world": world}}, saved)
                saved = True
            t0, it0 = time.time(), iter_num  # keep eval time out of the step timing
        if last:
            break

        loss_acc = graphed(iter_num, lr) if graphed is not None else step(train_batch)
        if iter_num % cfg["log_interval"] == 0:
            if ddp:  # every rank joins: the logged loss is the mean over the global batch
                dist.all_reduce(loss_acc)  # a sum: gloo has no AVG
                loss_acc /= world
            lossf = loss_acc.item()  # syncs the GPU
            if not math.isfinite(lossf):
                diverged("the training loss")
            t1 = time.time()
            dt_iter = (t1 - t0) / (iter_num - it0 + 1)
            warm = it0 > it_start  # the window holding the run's first step holds compile and warm-up too
            if warm:
                timed_s, timed_iters = timed_s + t1 - t0, timed_iters + iter_num - it0 + 1
            t0, it0 = t1, iter_num + 1
            if master:
                tok_s = tokens_per_iter / dt_iter
                if warm and device_type == "cuda":  # MFU against a GPU's peak: CUDA only
                    mfu = raw_model.estimate_mfu(cfg["batch_size"] * accum * world, dt_iter, cfg["peak_flops"])
                    running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
                # no rate yet before a window without the first step: "?" rather than minutes of compile x max_iters
                eta = f"{(cfg['max_iters'] - iter_num) * timed_s / timed_iters / 60:.1f}" if timed_iters else "?"
                mfu_s = f", mfu {max(running_mfu, 0) * 100:.2f}%" if device_type == "cuda" else ""
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.3e}, {dt_iter * 1000:.1f} ms, "
                      f"{tok_s:,.0f} tok/s{mfu_s}, eta {eta} min")
                log({"iter": iter_num, "loss": lossf, "lr": lr, "dt_ms": dt_iter * 1000, "tok_per_s": tok_s,
                     **({"mfu": running_mfu} if device_type == "cuda" else {}), "time": t1})
        iter_num += 1

    if master:
        metrics.close()
    if ddp:
        leave_ddp(out_dir)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OSError as e:  # a full or read-only disk wherever train.py writes: one line; what it wrote before is whole
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        sys.exit(f"error: cannot write {e.filename or 'to out_dir'}: {os.strerror(e.errno)}; free disk space or pick a "
                 "writable --out_dir (checkpoints are written whole: the last one is intact)")
