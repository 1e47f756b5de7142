"""
Train a GPT with PoPE, RoPE or no positional embedding, nanoGPT style.

Usage:
    python train.py [config/FILE.py] [--key=value ...]
    python train.py config/pope_124m.py --batch_size=16 --max_iters=2000
    torchrun --standalone --nproc_per_node=8 train.py config/pope_124m.py
    python train.py --out_dir=out-jsb-pope --init_from=resume --eval_only=True \\
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
import builtins
import difflib
import errno
import json
import math
import os
import random
import re
import shlex
import sys
import time
import traceback
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from model import GPT, GPTConfig, check_checkpoint_file, checkpoint_model_args, kernel_unsupported_reason
from prepare.common import (Data, PrepareError, checkpoint_error, data_changes, lock_folder, make_gen, unlock_folder,
                            write_atomic, write_json)

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
# the training loss only on the tokens {split}_mask.bin scores (where the dataset has masks); False: on
# every token of the training split. The eval always scores the masked tokens (its acc stays the target's)
train_mask = True
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
# torch.compile mode: "default" | "reduce-overhead" (CUDA graphs: small models are bound by kernel
# launches; 2.6x (RoPE) and 4x (PoPE) faster steps for the indirect-indexing model on an H200) | "max-autotune"
compile_mode = "default"
peak_flops = 989e12  # for MFU: dense bf16 peak of an H100/H200
overwrite = False  # a new run (scratch or fine-tune) may replace out_dir's checkpoint and log
# one GPU: the whole optimizer step (batch gather, forward, backward, clip, AdamW) as one CUDA graph,
# with the training split held on the GPU. Small models are otherwise bound by host time.
cuda_graph = False
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]


MODEL_KEYS = ["n_layer", "n_head", "n_embd", "block_size", "dropout", "bias", "pos_emb", "pope_base", "rope_base",
              "pope_delta_init", "pope_delta_bound", "attn_impl", "rope_scaling", "rope_scaling_orig_len"]
RESUME_MAY_CHANGE = ("attn_impl", "dropout")  # model keys a resumed run may set anew


def configure(argv, defaults):
    """Apply a config file and --key=value overrides to a dict of defaults.
    Returns (cfg, the set of keys the user set)."""
    cfg, given = dict(defaults), set()

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
        given.add(key)

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
            try:
                exec(builtins.compile(open(arg).read(), arg, "exec"), {}, scope)  # (the key compile hides it)
            except SyntaxError as e:
                sys.exit(f"error: config file {arg}, line {e.lineno}: {e.msg}")
            except Exception as e:  # noqa: BLE001  (the file's own line, not a traceback through configure)
                line = [f", line {f.lineno}" for f in traceback.extract_tb(e.__traceback__) if f.filename == arg]
                sys.exit(f"error: config file {arg}{(line or [''])[-1]}: {type(e).__name__}: {e}")
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
    return cfg, given


def config_problems(c):
    """Every nonsense setting, one line each (empty list: all fine)."""
    checks = [
        (c["batch_size"] >= 1, "batch_size must be >= 1"),
        (c["gradient_accumulation_steps"] >= 1, "gradient_accumulation_steps must be >= 1"),
        (c["block_size"] >= 1, "block_size must be >= 1"),
        (c["max_iters"] >= 0, "max_iters must be >= 0"),
        (c["eval_interval"] >= 1, "eval_interval must be >= 1"),
        (c["log_interval"] >= 1, "log_interval must be >= 1"),
        (c["eval_iters"] >= 1, "eval_iters must be >= 1"),
        (c["learning_rate"] > 0 and math.isfinite(c["learning_rate"]), "learning_rate must be a finite number > 0"),
        (0 <= c["min_lr"] <= c["learning_rate"], "min_lr must be in [0, learning_rate]"),
        (c["warmup_iters"] >= 0, "warmup_iters must be >= 0"),
        (c["lr_decay_iters"] >= 1, "lr_decay_iters must be >= 1"),
        (c["weight_decay"] >= 0, "weight_decay must be >= 0"),
        (0 <= c["beta1"] < 1 and 0 <= c["beta2"] < 1, "beta1 and beta2 must be in [0, 1)"),
        (c["grad_clip"] >= 0, "grad_clip must be >= 0 (0 disables clipping)"),
        (0 <= c["dropout"] < 1, "dropout must be in [0, 1)"),
        (c["n_layer"] >= 1 and c["n_head"] >= 1 and c["n_embd"] >= 1, "n_layer, n_head and n_embd must be >= 1"),
        (c["n_head"] < 1 or c["n_embd"] % c["n_head"] == 0, "n_embd must be divisible by n_head"),
        (c["pope_base"] > 1 and c["rope_base"] > 1, "pope_base and rope_base must be > 1 (the paper's: 10000)"),
        (c["pos_emb"] in ("pope", "rope", "none"), "pos_emb must be pope, rope or none"),
        (c["pope_delta_init"] in ("zero", "uniform"), "pope_delta_init must be zero or uniform"),
        (c["pope_delta_bound"] in ("wrap", "clamp", "project"), "pope_delta_bound must be wrap, clamp or project"),
        (c["attn_impl"] in ("auto", "torch", "triton"), "attn_impl must be auto, torch or triton"),
        (c["rope_scaling"] >= 1, "rope_scaling must be >= 1 (1 = no YaRN)"),
        (c["rope_scaling_orig_len"] >= 0, "rope_scaling_orig_len must be >= 0 (0 = block_size)"),
        (c["dtype"] in ("auto", "float32", "bfloat16", "float16"), "dtype must be auto, float32, bfloat16 or float16"),
        (re.fullmatch(r"auto|cpu|cuda(:\d+)?", c["device"]), "device must be auto, cpu, cuda or cuda:N"),
        (c["compile_mode"] in ("default", "reduce-overhead", "max-autotune"),
         "compile_mode must be default, reduce-overhead or max-autotune"),
        (c["peak_flops"] > 0, "peak_flops must be > 0"),
        (all(s in ("train", "val", "test") for s in c["eval_splits"].split(",")),
         "eval_splits must be a comma-separated list of train, val, test"),
    ]
    return [f"{msg} (got {_settings(c, msg)})" for ok, msg in checks if not ok]


def _settings(c, msg):
    # the values a problem line is about: every key the message names
    return ", ".join(f"{k}={c[k]!r}" for k in c if re.search(rf"\b{k}\b", msg))


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


class GraphedStep:
    """The whole optimizer step as one CUDA graph (one GPU, bf16 or float32): the
    batch gather from the training split held on the GPU, forward and backward of
    every micro-batch, gradient clipping and AdamW (capturable, lr a tensor).
    Replaying it costs almost no host time. The batches are the eager loop's:
    their starts come from the same generators and are copied in before each replay."""

    def __init__(self, model, raw_model, optimizer, data, cfg, dev, ctx, accum):
        params = list(raw_model.parameters())
        tokens, mask = data.arrays("train", masked=cfg["train_mask"])
        self.tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(dev)
        self.mask = torch.from_numpy(np.asarray(mask)).to(dev) if mask is not None else None
        self.offsets = torch.arange(data.T + 1, device=dev)
        self.starts = torch.zeros(accum, cfg["batch_size"], dtype=torch.long, device=dev)
        self.host = [torch.zeros_like(self.starts, device="cpu").pin_memory() for _ in range(2)]
        self.copied = [None, None]  # event: the copy out of host[i] is done
        self.lr = torch.tensor(cfg["learning_rate"], device=dev)
        for g in optimizer.param_groups:  # AdamW reads lr from the tensor, updated before each replay
            g.update(lr=self.lr, capturable=True, foreach=True, fused=None)
        for st in optimizer.state.values():
            st["step"] = st["step"].to(dev, torch.float32)
        self.args = model, raw_model, optimizer, data, cfg, ctx, accum
        # warm-up (compile, autotuning) on a side stream, then capture; the warm-up's updates are undone
        saved = [p.detach().clone() for p in params]
        saved_state = {id(p): {k: v.clone() for k, v in optimizer.state[p].items()} for p in params
                       if p in optimizer.state}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        optimizer.zero_grad(set_to_none=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = self._step()
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)
                for k, t in optimizer.state[p].items():
                    t.copy_(saved_state[id(p)][k]) if id(p) in saved_state else t.zero_()

    def _step(self):
        model, raw_model, optimizer, data, cfg, ctx, accum = self.args
        loss_acc = torch.zeros((), device=self.tokens.device)
        for micro in range(accum):
            ix = self.starts[micro][:, None] + self.offsets
            w = self.tokens[ix].long()
            m = self.mask[ix[:, 1:]].float() if self.mask is not None else None
            with ctx:
                _, loss = model(w[:, :-1], w[:, 1:], m)
            (loss / accum).backward()
            loss_acc += loss.detach() / accum
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg["grad_clip"])
        optimizer.step()
        raw_model.project_delta_()
        return loss_acc

    def __call__(self, iter_num, lr):
        """One optimizer step; returns the (static) loss tensor."""
        model, raw_model, optimizer, data, cfg, ctx, accum = self.args
        i = iter_num % 2
        if self.copied[i] is not None:
            self.copied[i].synchronize()  # host[i] is being read by the copy of two steps ago
        for micro in range(accum):
            self.host[i][micro] = data.starts("train", cfg["batch_size"], make_gen(cfg["seed"], iter_num, micro))
        self.starts.copy_(self.host[i], non_blocking=True)
        self.copied[i] = torch.cuda.Event()
        self.copied[i].record()
        self.lr.fill_(lr)
        self.graph.replay()
        return self.loss


def resume_config(cfg, given, defaults, argv):
    """For init_from=resume: the checkpoint and the run's saved config, with every
    key the user set on top (a model key that disagrees with the checkpoint is an
    error); for a fine-tune (init_from=path.pt): its checkpoint. Else None."""
    if cfg["init_from"] == "scratch":
        return cfg, None
    path = os.path.join(cfg["out_dir"], "ckpt.pt") if cfg["init_from"] == "resume" else cfg["init_from"]
    if cfg["init_from"] != "resume" and not path.endswith(".pt"):
        sys.exit(f"error: init_from must be 'scratch', 'resume' or a path to a .pt checkpoint, got {path!r}")
    if cfg["init_from"] == "resume" and not os.path.exists(path) and os.path.isfile(log_file(cfg)):
        fresh = " ".join(["python train.py"] + [shlex.quote(a) for a in argv if not a.startswith("--init_from=")])
        sys.exit(f"error: {path} not found: {cfg['out_dir']} holds only the log of a run that stopped before its "
                 f"first checkpoint, so there is nothing to resume; start it anew: {fresh}")
    if not os.path.exists(path):
        sys.exit(f"error: checkpoint {path} not found; train first, or fix out_dir / init_from")
    try:  # tensors and plain types only: a file that needs code to unpickle is refused
        check_checkpoint_file(path)  # empty, cut short, or a CRC that does not match: refused
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["model_args"] = checkpoint_model_args(ckpt, path)
    except Exception as e:  # noqa: BLE001  (the one line sample.py and the eval scripts print too)
        sys.exit(f"error: {checkpoint_error(path, e)}")
    if cfg["init_from"] != "resume":
        return cfg, ckpt
    lacks = [k for k in ("optimizer", "iter_num", "best_val_loss", "config") if k not in ckpt]
    if lacks:
        sys.exit(f"error: {path} has no {', '.join(lacks)}, so it cannot be resumed; fine-tune from its weights "
                 f"with --init_from={path} and another --out_dir")
    clash = [f"{k}={cfg[k]!r} (checkpoint: {ckpt['model_args'][k]!r})" for k in MODEL_KEYS
             if k in given and k not in RESUME_MAY_CHANGE and cfg[k] != ckpt["model_args"][k]]
    if clash:
        sys.exit(f"error: --init_from=resume continues {path}, whose model differs: {', '.join(clash)}. "
                 f"Drop those settings, or start a new run with another --out_dir")
    merged = dict(defaults)  # data_changed_ok holds for one resume, never for the next
    merged.update({k: v for k, v in ckpt["config"].items() if k in defaults and k != "data_changed_ok"})
    # the model is the checkpoint's (also for keys its config predates)
    merged.update({k: ckpt["model_args"][k] for k in MODEL_KEYS if k not in RESUME_MAY_CHANGE})
    merged.update({k: cfg[k] for k in given})
    merged["out_dir"] = cfg["out_dir"]  # where the checkpoint is now
    return merged, ckpt


def log_file(cfg):
    return os.path.join(cfg["out_dir"], "metrics.jsonl")


def claim_out_dir(cfg):
    """One run per out_dir: an flock on out_dir/.lock, held until this process ends
    (under DDP, rank 0's). And a new run never replaces a run's checkpoint unless asked."""
    try:
        lock_folder(cfg["out_dir"], "pick another --out_dir")
    except PrepareError as e:
        sys.exit(f"error: {e}")
    ckpt_path = os.path.join(cfg["out_dir"], "ckpt.pt")
    if cfg["init_from"] != "resume" and not cfg["overwrite"] and os.path.exists(ckpt_path):
        old = [p for p in (ckpt_path, log_file(cfg)) if os.path.exists(p)]
        one = len(old) == 1
        sys.exit(f"error: {' and '.join(old)} already exist{'s' if one else ''}: continue that run with --init_from="
                 f"resume, or pick a fresh --out_dir (--overwrite=True replaces {'it' if one else 'them'})")


def rng_states():
    """This process's RNG states as plain lists and tensors (a checkpoint then
    loads with weights_only=True)."""
    py = random.getstate()
    npy = np.random.get_state(legacy=False)
    npy["state"]["key"] = npy["state"]["key"].tolist()
    return {"python": [py[0], list(py[1]), py[2]], "numpy": npy, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None}


def set_rng_states(st, device_type):
    random.setstate((st["python"][0], tuple(st["python"][1]), st["python"][2]))
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if device_type == "cuda" and st["cuda"] is not None:
        torch.cuda.set_rng_state(st["cuda"])


def main(argv):
    defaults = {k: globals()[k] for k in config_keys}
    cfg, given = configure(argv, defaults)
    if int(os.environ.get("RANK", 0)) == 0 and os.path.isdir(cfg["out_dir"]):
        claim_out_dir(cfg)  # before a resume reads the checkpoint: no live run can replace it under us
    cfg, ckpt = resume_config(cfg, given, defaults, argv)
    problems = config_problems(cfg)
    if problems:
        sys.exit("error: bad settings: " + "; ".join(problems))

    # distributed setup
    ddp = int(os.environ.get("RANK", -1)) != -1
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
    else:
        rank, world = 0, 1
    master = rank == 0
    accum = cfg["gradient_accumulation_steps"] // world
    device_type = "cuda" if dev.startswith("cuda") else "cpu"
    dt = cfg["dtype"]
    if dt == "auto":
        dt = "bfloat16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dt]
    ctx = nullcontext() if dt == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)
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

    # data (checked before anything is written) and the run's folder
    splits = [s for s in cfg["eval_splits"].split(",") if s]
    try:
        data = Data(os.path.join(cfg["data_dir"], cfg["dataset"]), cfg["block_size"],
                    sorted(set(splits) | ({"train"} if not cfg["eval_only"] else set())))
    except PrepareError as e:
        sys.exit(f"error: {e}")
    out_dir = cfg["out_dir"]
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    log_path = log_file(cfg)
    if cfg["init_from"] == "resume" and "data" in ckpt:  # the data the checkpoint was trained on, or asked for
        changed = data_changes(ckpt["data"], data.identity)
        if changed and not cfg["data_changed_ok"]:
            sys.exit(f"error: {data.dir} is not the data {ckpt_path} was trained on ({'; '.join(changed)}); restore "
                     "that data, or pass --data_changed_ok=True to go on with this data")
        if changed and master:
            print(f"note: going on with changed data ({'; '.join(changed)}), as --data_changed_ok=True asks")

    # model
    model_args = {k: cfg[k] for k in MODEL_KEYS}
    iter_num, best_val_loss = 0, 1e9
    if ckpt is not None and cfg["init_from"] == "resume":
        model_args.update({k: ckpt["model_args"][k] for k in MODEL_KEYS if k not in RESUME_MAY_CHANGE})
        iter_num, best_val_loss = ckpt["iter_num"], ckpt["best_val_loss"]
    elif ckpt is not None:
        # fine-tuning: weights from another run; fresh optimizer and iteration count. The context
        # (block_size) and YaRN may change; YaRN's original length defaults to the source's context.
        model_args.update({k: ckpt["model_args"][k] for k in ("n_layer", "n_head", "n_embd", "bias", "pos_emb",
                                                               "pope_base", "rope_base", "pope_delta_bound")})
        if model_args["rope_scaling_orig_len"] == 0 and model_args["rope_scaling"] > 1.0:
            model_args["rope_scaling_orig_len"] = ckpt["model_args"]["block_size"]
        ckpt = {"model": ckpt["model"], "model_args": ckpt["model_args"]}
    T = data.T
    model_args["vocab_size"] = data.meta["vocab_size"]
    if data.meta.get("tokenizer") == "gpt2":  # 50257 -> 50304, a multiple of 64, as nanoGPT: faster matmuls
        model_args["vocab_size"] = (data.meta["vocab_size"] + 63) // 64 * 64
    tokens_per_iter = accum * world * cfg["batch_size"] * T
    torch.manual_seed(cfg["seed"] + rank)
    model = GPT(GPTConfig(**model_args))
    if ckpt is not None:
        state, ours = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}, model.state_dict()
        bad = [f"{k} is {tuple(getattr(state.get(k), 'shape', ())) if k in state else 'missing'} there, "
               f"{tuple(v.shape)} here" for k, v in ours.items() if getattr(state.get(k), "shape", None) != v.shape]
        bad += [f"{k} is not in this model" for k in state if k not in ours]
        if bad:  # which weights differ, and the likely reason: another vocabulary
            V, V_here = ckpt["model_args"].get("vocab_size"), model_args["vocab_size"]
            vocab = "" if V == V_here else (f"; the vocabulary differs: the checkpoint's vocab_size is {V}, dataset "
                                            f"{cfg['dataset']}'s {V_here}: use data with the checkpoint's vocabulary")
            sys.exit(f"error: the weights of {ckpt_path if cfg['init_from'] == 'resume' else cfg['init_from']} do not "
                     f"fit this model: {'; '.join(bad[:3])}{f' (and {len(bad) - 3} more)' * (len(bad) > 3)}{vocab}")
        model.load_state_dict(state)
    if master:  # every check passed: the run's folder
        os.makedirs(out_dir, exist_ok=True)
        claim_out_dir(cfg)  # (taken already where out_dir existed)
        if cfg["init_from"] != "resume" and os.path.exists(log_path):
            if not os.path.exists(ckpt_path):
                print(f"note: {log_path} is the log of a run that saved no checkpoint; this run's log replaces it")
            os.remove(log_path)  # a new run, a new log
    model.to(dev)
    if master:
        print(f"tokens per iteration: {tokens_per_iter:,} ({accum} accum x {world} procs x {cfg['batch_size']} x {T})")
        print(f"model: {model.get_num_params() / 1e6:.2f}M parameters, pos_emb={model_args['pos_emb']}")
        print(f"attention: {model.attention_path(dev)}")
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
        set_rng_states({k: v[rank % len(v)] if v else None for k, v in ckpt["rng"].items()}, device_type)
    else:
        random.seed(cfg["seed"] + rank)
        np.random.seed(cfg["seed"] + rank)
    ckpt = None  # free memory
    graphed = None
    if cfg["cuda_graph"] and not cfg["eval_only"]:
        graphed = GraphedStep(model, raw_model, optimizer, data, cfg, dev, ctx, accum)

    metrics = open(log_path, "a") if master else None

    def log(rec):
        if master:
            try:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
            except OSError as e:  # a full disk: name the file (the top-level handler prints one line)
                raise OSError(e.errno, e.strerror, log_path) from None

    def gather(obj):  # one entry per rank (a collective under DDP)
        if not ddp:
            return [obj]
        out = [None] * world
        dist.all_gather_object(out, obj)
        return out

    def diverged(what):
        sys.exit(f"error: {what} at iteration {iter_num} is not finite: the run diverged (learning rate too high?). "
                 f"Nothing was saved; the last checkpoint in {out_dir} is untouched")

    t0, it0, it_start = time.time(), iter_num, iter_num  # it0: first iteration of the timing window
    running_mfu, timed_s, timed_iters = -1.0, 0.0, 0  # the ETA's rate: the mean step time, evals and warm-up left out
    ours = cfg["init_from"] == "resume"  # out_dir's checkpoint is this run's (a resume, or once it saved)
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
            if improved:
                best_val_loss = val_loss
            rng = {k: gather(v) for k, v in rng_states().items()}  # every rank joins, whatever is decided
            # (not at the iteration a run starts from: a resumed run's checkpoint is already that)
            if master and iter_num > it_start and (improved or cfg["always_save_checkpoint"] or val_loss is None):
                state = {
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                    "config": cfg, "meta": data.meta, "data": data.identity, "rng": rng,
                    "sampler": {"seed": cfg["seed"], "iter_num": iter_num, "world": world},
                }
                try:  # a crash never leaves a half checkpoint
                    write_atomic(ckpt_path, lambda tmp: torch.save(state, tmp))
                except (OSError, RuntimeError) as e:  # a full or read-only disk; torch.save says RuntimeError
                    why = getattr(e, "strerror", None) or (str(e).splitlines() or [""])[-1][:160]
                    kept = ("the checkpoint there before is intact", "resume with --init_from=resume") if ours else \
                        ("this run saved no checkpoint", "start it again")
                    sys.exit(f"error: could not write {ckpt_path} ({why}); {kept[0]}. Free disk space (or make "
                             f"out_dir writable) and {kept[1]}")
                ours = True
                print(f"saved checkpoint to {ckpt_path}")
            t0, it0 = time.time(), iter_num  # keep eval time out of the step timing
        if last:
            break

        # one optimizer step over accum micro-batches; DDP syncs grads on the last one only
        loss_acc = torch.zeros((), device=dev)
        for micro in range(accum if graphed is None else 0):
            gen = make_gen(cfg["seed"], iter_num, rank * accum + micro)
            starts = data.starts("train", cfg["batch_size"], gen)
            x, y, m = data.batch("train", starts, dev, masked=cfg["train_mask"])
            sync = (not ddp) or micro == accum - 1
            with (nullcontext() if sync else model.no_sync()):
                with ctx:
                    _, loss = model(x, y, m)
                    loss = loss / accum
                scaler.scale(loss).backward()
            loss_acc += loss.detach()
        if graphed is not None:
            loss_acc = graphed(iter_num, lr)
        else:
            if cfg["grad_clip"] > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            scaler.step(optimizer)
            scaler.update()
            raw_model.project_delta_()
            optimizer.zero_grad(set_to_none=True)

        if iter_num % cfg["log_interval"] == 0:
            if ddp:  # every rank joins: the logged loss is the mean over the global batch
                dist.all_reduce(loss_acc)  # a sum: gloo has no AVG
                loss_acc /= world
            lossf = loss_acc.item()  # syncs the GPU
            if not math.isfinite(lossf):
                diverged("the training loss")
            t1 = time.time()
            dt_iter = (t1 - t0) / (iter_num - it0 + 1)
            if iter_num > it_start:  # the first window holds compile and warm-up
                timed_s, timed_iters = timed_s + t1 - t0, timed_iters + iter_num - it0 + 1
            t0, it0 = t1, iter_num + 1
            if master:
                tok_s = tokens_per_iter / dt_iter
                if iter_num > it_start and device_type == "cuda":  # MFU against a GPU's peak: CUDA only
                    mfu = raw_model.estimate_mfu(cfg["batch_size"] * accum * world, dt_iter, cfg["peak_flops"])
                    running_mfu = mfu if running_mfu < 0 else 0.9 * running_mfu + 0.1 * mfu
                eta = (cfg["max_iters"] - iter_num) * (timed_s / timed_iters if timed_iters else dt_iter)
                mfu_s = f", mfu {max(running_mfu, 0) * 100:.2f}%" if device_type == "cuda" else ""
                print(f"iter {iter_num}: loss {lossf:.4f}, lr {lr:.3e}, {dt_iter * 1000:.1f} ms, "
                      f"{tok_s:,.0f} tok/s{mfu_s}, eta {eta / 60:.1f} min")
                log({"iter": iter_num, "loss": lossf, "lr": lr, "dt_ms": dt_iter * 1000, "tok_per_s": tok_s,
                     **({"mfu": running_mfu} if device_type == "cuda" else {}), "time": t1})
        iter_num += 1

    if master:
        metrics.close()
    if ddp:
        # Leave together, then end the process without the interpreter's shutdown. Building a
        # DDP wrapper leaves references to the process group that neither deleting the wrapper
        # nor destroy_process_group releases (torch 2.13), so gloo's worker and TCP threads are
        # never joined: they run on into the interpreter's shutdown, where a C++ thread that then
        # needs the GIL is ended by CPython with a forced unwind, which ends in std::terminate
        # ("terminate called without an active exception": SIGABRT in rank 1 of 2-rank CPU runs).
        # Everything is written, flushed and closed here, so that shutdown has nothing left to do.
        dist.barrier()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        unlock_folder(out_dir)  # (os._exit runs no atexit handler)
        os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except OSError as e:  # a full or read-only disk wherever train.py writes: one line; what it wrote before is whole
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        sys.exit(f"error: cannot write {e.filename or 'to out_dir'}: {os.strerror(e.errno)}; free disk space or pick a "
                 "writable --out_dir (checkpoints are written whole: the last one is intact)")
