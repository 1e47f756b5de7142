"""
train.py's configurator. As in nanoGPT, the defaults stay at the top of
train.py; this file applies a config file and --key=value overrides to them,
says which settings make no sense, and holds the rules of a resumed or
fine-tuned run. train.py calls, in order:

    cfg, given = configure(argv, defaults, __doc__)        # defaults < config file < --key=value
    claim_out_dir(cfg)                                     # one run per out_dir; nothing replaced unless asked
    cfg, ckpt = resume_config(cfg, given, defaults, argv)  # a resume's or a fine-tune's settings and checkpoint
    config_problems(cfg)                                   # [] or one line per nonsense setting
    check_resume_data(...), model_args(cfg, meta), load_weights(...), set_rng_states(...)
    rng_states(world)                                      # at every checkpoint: what a resume continues

Every refusal is one line, `error: ...` (sys.exit), naming the problem and the fix.
Checkpoints are read by model.py's read_checkpoint / load_checkpoint, the one reader.

Usage: a module, not a script: `from configurator import configure, ...`
(train.py, sample.py and the eval scripts do); `python configurator.py --help` prints this.
"""

import argparse
import ast
import dataclasses
import difflib
import math
import os
import random
import re
import shlex
import sys
import traceback

import numpy as np
import torch
import torch.distributed as dist

from model import GPTConfig, CheckpointError, read_checkpoint
from prepare.common import REPO_ROOT, PrepareError, data_changes, lock_folder

MODEL_KEYS = [f.name for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size"]  # (the data sets the vocabulary)
RESUME_MAY_CHANGE = ("attn_impl", "dropout")  # model keys a resumed run may set anew
# a fine-tune keeps its source's shape and positional scheme; the context (block_size) and YaRN may change
FINETUNE_KEEPS = ("n_layer", "n_head", "n_embd", "bias", "pos_emb", "pope_base", "rope_base", "pope_delta_bound")


def configure(argv, defaults, doc=""):
    """Apply config files and --key=value overrides (in argv's order) to a dict of
    defaults; --help prints doc (the script's docstring) and every key with its
    default. Returns (cfg, the set of keys set)."""
    cfg, given = dict(defaults), set()

    def set_key(key, val, where):
        if key not in cfg:
            close = difflib.get_close_matches(key, cfg, n=3, cutoff=0.8) or difflib.get_close_matches(key, cfg, n=3)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            sys.exit(f"error: unknown config key '{key}' ({where}); {hint}python train.py --help lists the keys")
        want = type(defaults[key])
        if want is float and type(val) is int:
            val = float(val)
        if type(val) is not want:
            sys.exit(f"error: config key '{key}' ({where}) must be {want.__name__} "
                     f"(default {defaults[key]!r}), got {type(val).__name__} {val!r}")
        if want is str and not val.strip() and defaults[key].strip():  # --out_dir= : a path or a name, never ''
            sys.exit(f"error: config key '{key}' ({where}) is empty; give it a value, e.g. --{key}={defaults[key]} "
                     "(the default), or leave it out")
        cfg[key] = val
        given.add(key)

    for arg in argv:
        if arg in ("-h", "--help"):
            print(doc)
            print("keys and defaults:")
            for k in defaults:
                print(f"  --{k}={defaults[k]!r}")
            sys.exit(0)
        if not arg.startswith("--"):
            if not os.path.isfile(arg):
                in_repo = not os.path.isabs(arg) and os.path.isfile(REPO_ROOT / arg)
                sys.exit(f"error: config file {arg} not found" + (
                    f": paths are relative to the current directory ({os.getcwd()}); it exists in {REPO_ROOT}: "
                    f"run from the repository root or pass {REPO_ROOT / arg}" if in_repo
                    else " (configs live in config/)"))
            scope = {}
            try:
                exec(compile(open(arg).read(), arg, "exec"), {}, scope)
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
    """Every nonsense setting, one line each naming the values it got (empty list:
    all fine). The model's own rules (pos_emb, head dims, YaRN, ...) are GPTConfig's:
    building one checks them."""
    sizes = c["n_layer"] >= 1 and c["n_head"] >= 1 and c["n_embd"] >= 1
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
        (sizes, "n_layer, n_head and n_embd must be >= 1"),
        (c["pope_base"] > 1 and c["rope_base"] > 1, "pope_base and rope_base must be > 1 (the paper's: 10000)"),
        (c["rope_scaling_orig_len"] >= 0, "rope_scaling_orig_len must be >= 0 (0 = block_size)"),
        (c["dtype"] in ("auto", "float32", "bfloat16", "float16"), "dtype must be auto, float32, bfloat16 or float16"),
        (re.fullmatch(r"auto|cpu|cuda(:\d+)?", c["device"]), "device must be auto, cpu, cuda or cuda:N"),
        (c["compile_mode"] in ("default", "reduce-overhead", "max-autotune"),
         "compile_mode must be default, reduce-overhead or max-autotune"),
        (c["peak_flops"] > 0, "peak_flops must be > 0"),
        (all(s in ("train", "val", "test") for s in c["eval_splits"].split(",")),
         "eval_splits must be a comma-separated list of train, val, test"),
    ]
    problems = [f"{msg} (got {_settings(c, msg)})" for ok, msg in checks if not ok]
    try:
        if sizes:  # (with n_head 0 its divisibility line would repeat the one above)
            GPTConfig(**{k: c[k] for k in MODEL_KEYS})
    except ValueError as e:
        problems.append(str(e))
    return problems


def _settings(c, msg):
    # the values a problem line is about: every key the message names
    return ", ".join(f"{k}={c[k]!r}" for k in c if re.search(rf"\b{k}\b", msg))


def log_file(cfg):
    return os.path.join(cfg["out_dir"], "metrics.jsonl")


def claim_out_dir(cfg, create=False):
    """One run per out_dir: an flock on out_dir/.lock, held until this process ends
    (under DDP, rank 0's). With create (once the settings and the data have passed
    their checks, so that their errors come first): makes out_dir first, refuses to
    replace a run's checkpoint unless asked, and a new run's log replaces the old one."""
    if create:
        os.makedirs(cfg["out_dir"], exist_ok=True)
    try:
        lock_folder(cfg["out_dir"], "wait for it to end, or pick another --out_dir")
    except PrepareError as e:
        sys.exit(f"error: {e}")
    ckpt_path, log = os.path.join(cfg["out_dir"], "ckpt.pt"), log_file(cfg)
    if create and cfg["init_from"] != "resume" and not cfg["overwrite"] and os.path.exists(ckpt_path):
        old = [p for p in (ckpt_path, log) if os.path.exists(p)]
        one = len(old) == 1
        sys.exit(f"error: {' and '.join(old)} already exist{'s' if one else ''}: continue that run with --init_from="
                 f"resume, or pick a fresh --out_dir (--overwrite=True replaces {'it' if one else 'them'})")
    if create and cfg["init_from"] != "resume" and os.path.exists(log):
        if not os.path.exists(ckpt_path):
            print(f"note: {log} is the log of a run that saved no checkpoint; this run's log replaces it")
        os.remove(log)  # a new run, a new log


def resume_config(cfg, given, defaults, argv):
    """Returns (cfg, checkpoint). For init_from=resume: the checkpoint, and the run's
    saved config with every key the user set on top (a model key that disagrees with
    the checkpoint is an error); for a fine-tune (init_from=path.pt): its checkpoint,
    and cfg with the source's FINETUNE_KEEPS; from scratch: cfg and None."""
    if cfg["init_from"] == "scratch":
        return cfg, None
    path = os.path.join(cfg["out_dir"], "ckpt.pt") if cfg["init_from"] == "resume" else cfg["init_from"]
    if cfg["init_from"] != "resume" and not path.endswith(".pt"):
        sys.exit(f"error: init_from must be 'scratch', 'resume' or a path to a .pt checkpoint, got {path!r}")
    if cfg["init_from"] == "resume" and not os.path.exists(path) and os.path.isfile(log_file(cfg)):
        fresh = " ".join(["python train.py"] + [shlex.quote(a) for a in argv if not a.startswith("--init_from=")])
        sys.exit(f"error: {path} not found: {cfg['out_dir']} holds only the log of a run that stopped before its "
                 f"first checkpoint, so there is nothing to resume; start it anew: {fresh}")
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    if cfg["init_from"] != "resume":  # a fine-tune: the model keys the source decides are its
        cfg = {**cfg, **{k: ckpt["model_args"][k] for k in FINETUNE_KEEPS}}
        if cfg["rope_scaling_orig_len"] == 0 and cfg["rope_scaling"] > 1.0:
            cfg["rope_scaling_orig_len"] = ckpt["model_args"]["block_size"]  # YaRN stretches the source's context
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


def model_args(cfg, meta):
    """GPTConfig's arguments: cfg's model keys (for a resume or a fine-tune, as
    resume_config set them) and the dataset's vocabulary."""
    V = meta["vocab_size"]
    if meta.get("tokenizer") == "gpt2":  # 50257 -> 50304, a multiple of 64, as nanoGPT: faster matmuls
        V = (V + 63) // 64 * 64
    return {**{k: cfg[k] for k in MODEL_KEYS}, "vocab_size": V}


def load_weights(model, ckpt, source, dataset):
    """The checkpoint's weights into model, or a one-line error naming the weights that
    do not fit (at most three) and the likely reason: another vocabulary."""
    state, ours = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}, model.state_dict()
    bad = [f"{k} is {tuple(getattr(state.get(k), 'shape', ())) if k in state else 'missing'} there, "
           f"{tuple(v.shape)} here" for k, v in ours.items() if getattr(state.get(k), "shape", None) != v.shape]
    bad += [f"{k} is not in this model" for k in state if k not in ours]
    if bad:
        V, V_here = ckpt["model_args"].get("vocab_size"), model.config.vocab_size
        vocab = "" if V == V_here else (f"; the vocabulary differs: the checkpoint's vocab_size is {V}, dataset "
                                        f"{dataset}'s {V_here}: use data with the checkpoint's vocabulary")
        sys.exit(f"error: the weights of {source} do not fit this model: {'; '.join(bad[:3])}"
                 f"{f' (and {len(bad) - 3} more)' * (len(bad) > 3)}{vocab}")
    model.load_state_dict(state)


def check_resume_data(cfg, ckpt, data, master):
    """A resume goes on with the data its checkpoint was trained on (Data.identity:
    meta.json and every file's size), or, with --data_changed_ok=True, with other data.
    A resume that has no step left to train says so (it only evaluates once more)."""
    changed = data_changes(ckpt["data"], data.identity) if cfg["init_from"] == "resume" and "data" in ckpt else []
    if changed and not cfg["data_changed_ok"]:
        sys.exit(f"error: {data.dir} is not the data {os.path.join(cfg['out_dir'], 'ckpt.pt')} was trained on "
                 f"({'; '.join(changed)}); restore that data, or pass --data_changed_ok=True to go on with this data")
    if changed and master:
        print(f"note: going on with changed data ({'; '.join(changed)}), as --data_changed_ok=True asks")
    if cfg["init_from"] == "resume" and not cfg["eval_only"] and ckpt["iter_num"] >= cfg["max_iters"] and master:
        print(f"note: the run is at step {ckpt['iter_num']}, max_iters={cfg['max_iters']}: nothing left to train, one "
              "more eval only; raise --max_iters (and --lr_decay_iters) to train on")


def rng_states(world):
    """Every rank's RNG states, {kind: [rank 0's, rank 1's, ...]}, as plain lists and
    tensors (a checkpoint then loads with weights_only=True). Under DDP a collective:
    every rank calls it."""
    py = random.getstate()
    npy = np.random.get_state(legacy=False)
    npy["state"]["key"] = npy["state"]["key"].tolist()
    mine = {"python": [py[0], list(py[1]), py[2]], "numpy": npy, "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None}
    out = {k: [v] + [None] * (world - 1) for k, v in mine.items()}
    if world > 1:
        for k in out:
            dist.all_gather_object(out[k], mine[k])
    return out


def set_rng_states(ckpt, seed, rank, device_type):
    """A resume (ckpt) continues its checkpoint's RNG states, rank r those of rank r
    (mod the ranks saved); a new run seeds Python's and numpy's RNGs with seed + rank."""
    if ckpt is None or "rng" not in ckpt:
        random.seed(seed + rank)
        np.random.seed(seed + rank)
        return
    st = {k: v[rank % len(v)] if v else None for k, v in ckpt["rng"].items()}
    random.setstate((st["python"][0], tuple(st["python"][1]), st["python"][2]))
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if device_type == "cuda" and st["cuda"] is not None:
        torch.cuda.set_rng_state(st["cuda"])


if __name__ == "__main__":  # (a module: run, it only says what it is)
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print("configurator.py is a module imported by train.py, sample.py and the eval scripts; see --help",
          file=sys.stderr)
