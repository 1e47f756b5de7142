"""
Perplexity against context length: does a model trained at context T still
predict well at 2T, ..., 10T? PoPE (arXiv 2509.10534) extrapolates zero-shot,
RoPE blows up, RoPE+YaRN (arXiv 2309.00071) holds up to its fine-tuning length.

Usage:
    python eval_extrapolation.py --ckpt A.pt [B.pt ...] --data PATH [--lengths 1024,2048,...]
        [--yarn] [--yarn_scale S] [--json out.json] [--plot out.png] [--max_tokens N] [--device auto]

Examples:
    python eval_extrapolation.py --ckpt out-pope/ckpt.pt out-rope/ckpt.pt --yarn \\
        --data data/openwebtext/val.bin --json extrapolation.json --plot extrapolation.png
    python eval_extrapolation.py --ckpt out-rope-yarn/ckpt.pt --data pg19_test.jsonl
    python eval_extrapolation.py --ckpt out-pope/ckpt.pt --data hf:pg19    # needs `datasets` + network

Data (--data):
    X.bin        token ids of a prepared dataset split (e.g. data/openwebtext/val.bin); its meta.json
                 (dtype, vocab) must sit beside it. Used as one stream, as is. Masks and rows are ignored.
    X.txt        UTF-8 text, tokenized with each checkpoint's tokenizer (meta.json of its dataset:
                 gpt2 BPE or a character list) as one stream.
    X.jsonl      one {"text": ...} document per line; each document is followed by <|endoftext|>
                 (gpt2) or by "\\n\\n" (character vocabularies that have "\\n").
    hf:pg19      the PG-19 test split through HF `datasets` (streamed, documents joined as for .jsonl);
                 hf:NAME[:SPLIT] for another hub dataset with a "text" column. Offline, pass a local
                 .txt/.jsonl export instead.
    Text is tokenized only as far as needed (--max_tokens + 1 tokens).

Which tokens are scored:
    The data is one token stream t_0 .. t_{N-1}. The budget B (--max_tokens; default: the largest
    multiple of the longest length that fits in N - 1 targets, capped at 2^20) is the same at every
    length. At length L there are n_L = floor(B / L) non-overlapping windows; window j feeds
    t_{jL} .. t_{jL+L-1} (positions 0 .. L-1, no earlier context) and scores the next-token
    predictions of t_{jL+1} .. t_{jL+L} at every position. So every length scores the targets
    t_1 .. t_{n_L L}: the first B targets, minus a tail shorter than L when L does not divide B.
    The NLL of a length is the mean over those n_L * L targets (equal to the mean over windows of
    each window's mean NLL, the paper's per-sequence average); ppl = exp(NLL). At L = block_size
    with B = floor((N-1)/L) * L this is exactly train.py --eval_only --eval_full on that split
    (train.py windows the data by its --block_size, so pass the checkpoint's block_size there).
    The NLL by position bucket is over the windows of the longest length: position p of the
    window (predicting t_{jL+p+1} from p+1 tokens), buckets of --bucket_size positions.

Default lengths: the training block size x 1..10 (the smallest block_size among the checkpoints).

YaRN (RoPE checkpoints only):
    --yarn adds a "+YaRN" series per RoPE checkpoint (--yarn_only keeps only that one): inverse
    frequencies from model.yarn_inv_freq (ramp alpha = 1, beta = 32, logits scaled by
    (0.1 ln s + 1)^2 / sqrt(D)), with original length L0 = the checkpoint's rope_scaling_orig_len,
    or its block_size when it was not trained with YaRN. The scale at length L is
        s(L) = max(s_ckpt, L / L0)              (s_ckpt = the checkpoint's rope_scaling, 1 if none)
    or the fixed --yarn_scale. So a plain RoPE model gets s = 1 (plain RoPE) up to its block size
    and s = L / block_size beyond; a model fine-tuned with YaRN s = 4 keeps s = 4 up to 4 L0 and
    stretches further beyond. The plain series of a RoPE checkpoint always uses its saved s_ckpt
    (YaRN fine-tuned models are evaluated as trained). Every JSON record holds the s it used.

Outputs:
    a table on stdout (perplexity per length and series, per position bucket at the longest
    length, and on CUDA the peak memory above the weights per length); --json: per series and
    length NLL, ppl, scored token count, windows, YaRN scale, peak extra memory (CUDA);
    --plot: perplexity against length (log y), one line per series (needs matplotlib; skipped
    with a note otherwise). A progress bar over windows goes to stderr (tqdm if installed).

On CUDA the model runs under bf16 autocast (--dtype) with attn_impl auto: the fused PoPE Triton
kernel when pope_kernel provides it, SDPA for RoPE. NLLs are computed from float32 logits.
"""

import argparse
import json
import math
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from model import load_checkpoint

DEFAULT_MAX_TOKENS = 1 << 20  # cap on the default budget of scored tokens per length
HF_ALIASES = {"pg19": ("deepmind/pg19", "test")}
TEXT_CHUNK_CHARS = 1 << 20


def die(msg):
    raise SystemExit(f"error: {msg}")


# -----------------------------------------------------------------------------
# arguments

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", nargs="+", required=True, help="one or more train.py checkpoints (ckpt.pt)")
    p.add_argument("--data", required=True, help="X.bin (meta.json beside it), X.txt, X.jsonl or hf:pg19")
    p.add_argument("--lengths", default=None, help="comma-separated context lengths (default: block_size x 1..10)")
    p.add_argument("--labels", default=None, help="comma-separated series names, one per --ckpt")
    p.add_argument("--yarn", action="store_true", help="add a RoPE+YaRN series for every RoPE checkpoint")
    p.add_argument("--yarn_only", action="store_true", help="with --yarn: drop the plain series of RoPE checkpoints")
    p.add_argument("--yarn_scale", type=float, default=None,
                   help="fixed YaRN scale s (implies --yarn; default: the s(L) rule)")
    p.add_argument("--max_tokens", type=int, default=None,
                   help="scored tokens per length (default: the largest multiple of the longest length "
                        f"that fits, at most {DEFAULT_MAX_TOKENS})")
    p.add_argument("--bucket_size", type=int, default=None, help="positions per NLL bucket (default: the block size)")
    p.add_argument("--batch_tokens", type=int, default=16384,
                   help="tokens per forward pass (windows = max(1, this // length))")
    p.add_argument("--batch_size", type=int, default=None, help="windows per forward pass (overrides --batch_tokens)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None, help="write a PNG plot here (needs matplotlib)")
    p.add_argument("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:1 ...")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="auto: bf16 autocast on CUDA, float32 on the CPU")
    p.add_argument("--attn_impl", default="auto", choices=["auto", "torch", "triton"],
                   help="PoPE attention: auto uses the Triton kernel on CUDA when available")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.yarn_scale is not None:
        if args.yarn_scale < 1.0:
            die(f"--yarn_scale must be >= 1 (1 = plain RoPE), got {args.yarn_scale}")
        args.yarn = True
    if args.yarn_only and not args.yarn:
        die("--yarn_only needs --yarn (or --yarn_scale)")
    for name in ("max_tokens", "bucket_size", "batch_tokens", "batch_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            die(f"--{name} must be >= 1, got {v}")
    return args


def parse_lengths(text):
    try:
        lengths = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        die(f"--lengths must be comma-separated integers, got {text!r}")
    if not lengths:
        die("--lengths is empty")
    bad = [L for L in lengths if L < 1]
    if bad:
        die(f"context lengths must be >= 1, got {bad}")
    return sorted(set(lengths))


# -----------------------------------------------------------------------------
# checkpoints

def default_label(path):
    path = os.path.normpath(path)
    base = os.path.basename(path)
    if base == "ckpt.pt":
        return os.path.basename(os.path.dirname(os.path.abspath(path))) or base
    return os.path.splitext(base)[0]


def load_model(path, device, attn_impl):
    if not os.path.isfile(path):
        die(f"checkpoint {path} not found (train one with train.py: it writes out_dir/ckpt.pt)")
    try:
        model, ckpt = load_checkpoint(path, device=device, attn_impl=attn_impl)
    except Exception as e:  # noqa: BLE001 (unpickling, missing keys, shape mismatches: all say the same)
        die(f"could not load {path} as a train.py checkpoint: {type(e).__name__}: {e}")
    return model, ckpt


def max_model_length(model):
    """Longest context the model's config allows: None (no limit) unless it has a learned table."""
    wpe = getattr(model.transformer, "wpe", None) if hasattr(model, "transformer") else None
    return wpe.weight.size(0) if wpe is not None else None


def codec_key(meta):
    if meta.get("tokenizer") == "gpt2":
        return "gpt2"
    if "itos" in meta:
        return json.dumps(meta["itos"])
    return None


# -----------------------------------------------------------------------------
# data

def data_kind(spec):
    if spec.startswith("hf:"):
        return "hf"
    ext = os.path.splitext(spec)[1].lower()
    if ext not in (".bin", ".txt", ".jsonl"):
        die(f"--data must be a .bin (with meta.json beside it), .txt, .jsonl or hf:NAME; got {spec}")
    if not os.path.isfile(spec):
        die(f"data file {spec} not found")
    if os.path.getsize(spec) == 0:
        die(f"data file {spec} is empty (0 bytes)")
    return ext[1:]


def load_bin(path):
    meta_path = os.path.join(os.path.dirname(os.path.abspath(path)), "meta.json")
    if not os.path.isfile(meta_path):
        die(f"{path}: no meta.json beside it ({meta_path}); a prepared dataset dir holds "
            f"train/val/test.bin and meta.json (see prepare/)")
    with open(meta_path) as f:
        meta = json.load(f)
    dtype = np.dtype(meta.get("dtype", "uint16"))
    size = os.path.getsize(path)
    if size % dtype.itemsize:
        die(f"{path} has {size} bytes, not a multiple of {dtype} ({dtype.itemsize} bytes) as meta.json says")
    base = os.path.splitext(path)[0]
    if os.path.isfile(base + "_mask.bin"):
        print(f"note: {base}_mask.bin is ignored: every token of {path} is scored", file=sys.stderr)
    if meta.get("row_len"):
        print(f"note: {path} holds fixed rows of {meta['row_len']} tokens; windows here run across rows",
              file=sys.stderr)
    return np.memmap(path, dtype=dtype, mode="r"), meta


def safe_cut(buf):
    """An index to split text at without changing its tokenization: just after a "\\n" with
    non-whitespace on both sides (no gpt2 pre-token spans it, and a character codec never
    cares). 0 if there is none."""
    i = len(buf) - 1
    while True:
        i = buf.rfind("\n", 0, i)
        if i <= 0:
            return 0
        if i + 1 < len(buf) and not buf[i - 1].isspace() and not buf[i + 1].isspace():
            return i + 1


def iter_text_chunks(f, chunk_chars=TEXT_CHUNK_CHARS):
    buf = ""
    while True:
        piece = f.read(chunk_chars)
        if not piece:
            if buf:
                yield buf
            return
        buf += piece
        cut = safe_cut(buf)
        if cut:
            yield buf[:cut]
            buf = buf[cut:]


def separator_ids(meta, encode):
    if meta.get("tokenizer") == "gpt2":
        return list(encode("<|endoftext|>"))
    itos = meta.get("itos", [])
    return list(encode("\n\n")) if "\n" in itos else []


def encode_or_die(encode, text, where):
    try:
        return encode(text)
    except ValueError as e:
        die(f"{where}: cannot tokenize with the checkpoint's vocabulary: {e}")


def iter_hf_docs(spec):
    name, _, split = spec[3:].partition(":")
    repo, default_split = HF_ALIASES.get(name, (name, "test"))
    split = split or default_split
    how = ("offline, download it yourself (PG-19: https://github.com/google-deepmind/pg19, the test/ books) "
           "and pass a local file: --data pg19_test.jsonl (one {\"text\": book} per line) or a .txt")
    try:
        # bounded waits so that a machine without network fails instead of hanging
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
        os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "10")
        import datasets
    except ImportError:
        die(f"--data {spec} needs the HF `datasets` package (pip install datasets) and network access "
            f"or a cached copy of {repo}; {how}")
    try:
        ds = datasets.load_dataset(repo, split=split, streaming=True)
        it = iter(ds)
        first = next(it)
    except StopIteration:
        die(f"{repo} split {split} is empty")
    except Exception as e:  # noqa: BLE001 (network, missing scripts, auth: all end the same way)
        die(f"could not load {repo} (split {split}) with datasets: {type(e).__name__}: {e}; {how}")
    if "text" not in first:
        die(f"{repo} has no 'text' column (columns: {sorted(first)})")
    yield first["text"]
    for row in it:
        yield row["text"]


def load_text_tokens(spec, kind, meta, encode, need, chunk_chars=TEXT_CHUNK_CHARS):
    """Tokenize a .txt / .jsonl / hf: source until `need` tokens (or its end)."""
    out, n = [], 0
    if kind == "txt":
        with open(spec, encoding="utf-8") as f:
            for chunk in iter_text_chunks(f, chunk_chars):
                ids = encode_or_die(encode, chunk, spec)
                out.append(np.asarray(ids, dtype=np.int64))
                n += len(ids)
                if n >= need:
                    break
    else:
        sep = separator_ids(meta, encode)
        if kind == "jsonl":
            def docs():
                with open(spec, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        if not line.strip():
                            continue
                        try:
                            doc = json.loads(line)
                        except json.JSONDecodeError as e:
                            die(f"{spec}:{lineno}: not valid JSON ({e})")
                        if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                            die(f"{spec}:{lineno}: expected an object with a \"text\" string")
                        yield doc["text"]
            source = docs()
        else:
            source = iter_hf_docs(spec)
        for text in source:
            ids = list(encode_or_die(encode, text, spec)) + sep
            out.append(np.asarray(ids, dtype=np.int64))
            n += len(ids)
            if n >= need:
                break
    toks = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return toks[:need]


def check_vocab(data_meta, ckpt_meta, data_path, ckpt_path):
    a, b = codec_key(data_meta), codec_key(ckpt_meta)
    if a is not None and b is not None and a != b:
        die(f"{data_path} was tokenized with a different vocabulary than {ckpt_path}'s training data "
            f"({'gpt2' if a == 'gpt2' else 'a character list'} vs {'gpt2' if b == 'gpt2' else 'a character list'})")


# -----------------------------------------------------------------------------
# progress

class SimpleProgress:
    """A fallback progress printer (stderr) when tqdm is not installed."""

    def __init__(self, total, desc="", file=None):
        self.total, self.n, self.desc = total, 0, desc
        self.file = file or sys.stderr
        self.t0 = self.last = time.time()
        self.next_pct = 0

    def set_description(self, desc):
        self.desc = desc

    def update(self, k=1):
        self.n += k
        pct = 100 * self.n // max(self.total, 1)
        now = time.time()
        if pct >= self.next_pct or now - self.last > 30 or self.n >= self.total:
            el = now - self.t0
            eta = el / self.n * (self.total - self.n) if self.n else 0.0
            print(f"{self.desc} {self.n}/{self.total} windows ({pct}%), {el:.0f}s elapsed, eta {eta:.0f}s",
                  file=self.file, flush=True)
            self.next_pct, self.last = pct + 5, now

    def close(self):
        pass


class NoProgress(SimpleProgress):
    def update(self, k=1):
        self.n += k


def make_progress(total, disable=False):
    if disable:
        return NoProgress(total)
    try:
        from tqdm import tqdm
    except ImportError:
        return SimpleProgress(total)
    return tqdm(total=total, unit="win", file=sys.stderr, dynamic_ncols=True)


# -----------------------------------------------------------------------------
# evaluation

@torch.no_grad()
def eval_length(model, toks, L, budget, device, ctx, batch_windows, progress=None, per_position=False):
    """Mean NLL over the n = budget // L non-overlapping windows of length L at the start of toks
    (see the module docstring). Returns (nll_sum, tokens, windows, per-position NLL sums or None)."""
    n = budget // L
    nll_sum, pos_sum = 0.0, (np.zeros(L, dtype=np.float64) if per_position else None)
    for j0 in range(0, n, batch_windows):
        js = range(j0, min(n, j0 + batch_windows))
        x = torch.from_numpy(np.stack([np.asarray(toks[j * L:j * L + L], dtype=np.int64) for j in js]))
        y = torch.from_numpy(np.stack([np.asarray(toks[j * L + 1:j * L + L + 1], dtype=np.int64) for j in js]))
        x, y = x.to(device), y.to(device)
        with ctx:
            logits, _ = model(x, y)
        # per window, so that only one window's float32 logits exist at a time
        nll = torch.stack([F.cross_entropy(logits[i].float(), y[i], reduction="none") for i in range(len(js))])
        nll = nll.double()
        nll_sum += nll.sum().item()
        if per_position:
            pos_sum += nll.sum(0).cpu().numpy()
        del logits
        if progress is not None:
            progress.update(len(js))
    return nll_sum, n * L, n, pos_sum


def ppl_of(nll):
    if not math.isfinite(nll):
        return float("nan")
    return math.exp(nll) if nll < 700 else float("inf")


def finite_or_none(x):
    """JSON has no inf/nan: those become null."""
    return x if math.isfinite(x) else None


def yarn_scale_rule(s_ckpt, orig_len, fixed):
    if fixed is not None:
        return lambda L: float(fixed)
    return lambda L: max(float(s_ckpt), L / orig_len)


# -----------------------------------------------------------------------------
# output

def fmt_ppl(x):
    if not math.isfinite(x):
        return "inf" if x == float("inf") else "nan"
    return f"{x:.3f}" if x < 1e4 else f"{x:.3e}"


def print_tables(series, lengths, bucket_rows_len):
    names = [s["label"] for s in series]
    w = max(12, *(len(n) + 2 for n in names))
    same_tokens = len({tuple(s["results"][str(L)]["tokens"] for L in lengths) for s in series}) == 1
    print("\nperplexity by context length" + ("" if same_tokens else " (scored tokens in brackets)"))
    head = f"{'length':>8} " + (f"{'tokens':>10} " if same_tokens else "") + "".join(f"{n:>{w}}" for n in names)
    print(head)
    print("-" * len(head))
    for L in lengths:
        row = f"{L:>8} "
        if same_tokens:
            row += f"{series[0]['results'][str(L)]['tokens']:>10} "
        for s in series:
            r = s["results"][str(L)]
            cell = fmt_ppl(r["ppl"]) + ("" if same_tokens else f" [{r['tokens']}]")
            row += f"{cell:>{w}}"
        print(row)
    if all("peak_extra_mem_mb" in s["results"][str(L)] for s in series for L in lengths):
        print("\npeak GPU memory above the weights, MB (windows per forward pass in brackets)")
        print(head)
        print("-" * len(head))
        for L in lengths:
            row = f"{L:>8} " + (" " * 11 if same_tokens else "")
            for s in series:
                r = s["results"][str(L)]
                row += f"{r['peak_extra_mem_mb']:.0f} [{r['windows_per_batch']}]".rjust(w)
            print(row)
    print(f"\nNLL (nats/token) by position in the windows of length {bucket_rows_len}")
    head = f"{'positions':>17} " + "".join(f"{n:>{w}}" for n in names)
    print(head)
    print("-" * len(head))
    nb = len(series[0]["buckets"]["rows"])
    for i in range(nb):
        b = series[0]["buckets"]["rows"][i]
        row = f"{b['start']:>8}-{b['end'] - 1:<8} "
        for s in series:
            v = s["buckets"]["rows"][i]["nll"]
            row += f"{(f'{v:.4f}' if v is not None else 'nan'):>{w}}"
        print(row)


def write_plot(path, series, lengths, train_lens):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: matplotlib is not installed; no plot written to {path} (pip install matplotlib)")
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in series:
        ys = [s["results"][str(L)]["ppl"] for L in lengths]
        ys = [y if y is not None and math.isfinite(y) else float("nan") for y in ys]
        ax.plot(lengths, ys, marker="o", label=s["label"])
    for T in sorted(set(train_lens)):
        ax.axvline(T, color="gray", linestyle=":", linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title("Perplexity against context length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return True


# -----------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    lengths = parse_lengths(args.lengths) if args.lengths is not None else None
    labels = None
    if args.labels is not None:
        labels = [x.strip() for x in args.labels.split(",")]
        if len(labels) != len(args.ckpt):
            die(f"--labels has {len(labels)} names for {len(args.ckpt)} checkpoints")
    for path in args.ckpt:
        if not os.path.isfile(path):
            die(f"checkpoint {path} not found (train one with train.py: it writes out_dir/ckpt.pt)")
    kind = data_kind(args.data)

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        die("--device cuda but CUDA is not available here; pass --device cpu")
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    if args.dtype == "auto":
        use_bf16 = device_type == "cuda" and torch.cuda.is_bf16_supported()
    else:
        use_bf16 = args.dtype == "bfloat16"
    ctx = torch.autocast(device_type=device_type, dtype=torch.bfloat16) if use_bf16 else nullcontext()
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # checkpoints
    models = []
    for i, path in enumerate(args.ckpt):
        model, ckpt = load_model(path, device, args.attn_impl)
        margs = ckpt.get("model_args", {})
        cfg = model.config
        models.append({
            "path": path, "model": model, "meta": ckpt.get("meta") or {}, "config": cfg,
            "label": labels[i] if labels else default_label(path),
            "s_ckpt": float(margs.get("rope_scaling", 1.0)) if cfg.pos_emb == "rope" else 1.0,
            "orig_len": int(margs.get("rope_scaling_orig_len") or cfg.block_size),
        })
    base_len = min(m["config"].block_size for m in models)
    if lengths is None:
        lengths = [base_len * k for k in range(1, 11)]
    Lmax = max(lengths)
    for m in models:
        limit = max_model_length(m["model"])
        if limit is not None and Lmax > limit:
            die(f"{m['path']} has a learned position table of {limit} positions; lengths up to {limit} only "
                f"(asked for {Lmax})")
    bucket_size = args.bucket_size or base_len

    # series: (model entry, label, YaRN scale rule or None)
    series = []
    for m in models:
        is_rope = m["config"].pos_emb == "rope"
        if not (is_rope and args.yarn_only):
            rule = (lambda L, s=m["s_ckpt"]: s) if is_rope else None
            series.append({"m": m, "label": m["label"], "rule": rule, "yarn": False})
        if is_rope and args.yarn:
            series.append({"m": m, "label": m["label"] + "+YaRN", "yarn": True,
                           "rule": yarn_scale_rule(m["s_ckpt"], m["orig_len"], args.yarn_scale)})
        elif args.yarn and not is_rope:
            print(f"note: {m['label']} is pos_emb={m['config'].pos_emb}; YaRN applies to RoPE only")
    seen = {}
    for s in series:
        k = seen[s["label"]] = seen.get(s["label"], 0) + 1
        if k > 1:
            s["label"] = f"{s['label']}#{k}"

    # data: one token stream per tokenizer
    need = (args.max_tokens if args.max_tokens is not None else max(DEFAULT_MAX_TOKENS, Lmax)) + 1
    streams = {}
    bin_meta = None
    for m in models:
        key = "bin" if kind == "bin" else codec_key(m["meta"])
        if kind == "bin":
            if key not in streams:
                streams[key], bin_meta = load_bin(args.data)
            check_vocab(bin_meta, m["meta"], args.data, m["path"])
        elif key not in streams:
            if key is None:
                die(f"{m['path']} has no tokenizer in its meta (\"tokenizer\": \"gpt2\" or \"itos\"); "
                    f"give token ids as a .bin instead of text")
            from sample import load_codec
            encode, _ = load_codec(m["meta"])
            streams[key] = load_text_tokens(args.data, kind, m["meta"], encode, need)
        m["toks"] = streams[key]
        N = len(m["toks"])
        if N == 0:
            die(f"{args.data} holds no tokens")
        if N < Lmax + 1:
            die(f"{args.data} has {N} tokens, fewer than one window of the longest length {Lmax}: "
                f"need at least {Lmax + 1} tokens ({Lmax} inputs + 1 more for the last target); "
                f"give more data or shorter --lengths")
        if args.max_tokens is not None:
            if args.max_tokens < Lmax:
                die(f"--max_tokens={args.max_tokens} is less than the longest length {Lmax}; "
                    f"every length needs at least one window")
            if args.max_tokens > N - 1:
                die(f"--max_tokens={args.max_tokens} but {args.data} has only {N} tokens "
                    f"({N - 1} scoreable targets); at most {(N - 1) // Lmax * Lmax} at length {Lmax}")
            budget = args.max_tokens
        else:
            budget = min(max(1, DEFAULT_MAX_TOKENS // Lmax), (N - 1) // Lmax) * Lmax
        m["budget"] = budget
        vmax = int(np.max(np.asarray(m["toks"][:budget + 1])))
        if vmax >= m["config"].vocab_size:
            die(f"{args.data} holds token id {vmax} but {m['path']} has a vocabulary of {m['config'].vocab_size}")

    # run
    total = sum(s["m"]["budget"] // L for s in series for L in lengths)
    progress = make_progress(total, disable=args.no_progress)
    t_start = time.time()
    out_series = []
    for s in series:
        m, model = s["m"], s["m"]["model"]
        rec = {"label": s["label"], "ckpt": m["path"], "pos_emb": m["config"].pos_emb,
               "block_size": m["config"].block_size, "params": model.get_num_params(),
               "tokens_available": int(len(m["toks"])), "max_tokens": m["budget"],
               "yarn": None, "results": {}, "buckets": None}
        if m["config"].pos_emb == "rope":
            rec["yarn"] = {"eval_time": s["yarn"], "ckpt_scale": m["s_ckpt"], "orig_len": m["orig_len"],
                           "rule": ("fixed --yarn_scale" if s["yarn"] and args.yarn_scale is not None
                                    else "s = max(s_ckpt, L / orig_len)" if s["yarn"] else "s = s_ckpt")}
        for L in lengths:
            if hasattr(progress, "set_description"):
                progress.set_description(f"{s['label']} L={L}")
            scale = None
            if s["rule"] is not None:
                scale = s["rule"](L)
                model.set_rope_scaling(scale, m["orig_len"])
            bs = args.batch_size or max(1, args.batch_tokens // L)
            if device_type == "cuda":
                # peak memory above the weights: shows the attention never holds a T x T tensor
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                mem0 = torch.cuda.memory_allocated()
            t0 = time.time()
            nll_sum, ntok, nwin, pos = eval_length(model, m["toks"], L, m["budget"], device, ctx, bs,
                                                   progress, per_position=(L == Lmax))
            nll = nll_sum / ntok
            r = {"length": L, "nll": nll, "ppl": ppl_of(nll), "tokens": ntok, "windows": nwin,
                 "seconds": round(time.time() - t0, 3)}
            if device_type == "cuda":
                r["peak_extra_mem_mb"] = round((torch.cuda.max_memory_allocated() - mem0) / 2**20, 1)
                r["windows_per_batch"] = bs
            if scale is not None:
                r["rope_scaling"] = scale
                r["mscale"] = 0.1 * math.log(scale) + 1.0 if scale > 1 else 1.0
            rec["results"][str(L)] = r
            if L == Lmax:
                rows = []
                for a in range(0, L, bucket_size):
                    b = min(L, a + bucket_size)
                    bn = float(pos[a:b].sum() / (nwin * (b - a)))
                    rows.append({"start": a, "end": b, "nll": bn, "ppl": ppl_of(bn), "tokens": nwin * (b - a)})
                rec["buckets"] = {"length": L, "bucket_size": bucket_size, "rows": rows}
        if m["config"].pos_emb == "rope":
            model.set_rope_scaling(m["s_ckpt"], m["orig_len"])
        out_series.append(rec)
    progress.close()

    print(f"\n{args.data} ({kind}): {time.time() - t_start:.1f}s on {device}"
          f"{' (bf16 autocast)' if use_bf16 else ''}")
    for s in out_series:
        y = s["yarn"]
        extra = ""
        if y is not None:
            extra = f", YaRN {y['rule']} (s_ckpt={y['ckpt_scale']:g}, orig_len={y['orig_len']})"
        print(f"  {s['label']}: {s['ckpt']} pos_emb={s['pos_emb']} block_size={s['block_size']}, "
              f"budget {s['max_tokens']} of {s['tokens_available']} tokens{extra}")
    print_tables(out_series, lengths, Lmax)

    result = {
        "data": {"spec": args.data, "kind": kind},
        "lengths": lengths, "bucket_size": bucket_size, "device": device,
        "dtype": "bfloat16 autocast" if use_bf16 else "float32",
        "scored_tokens": ("at length L: windows j = 0..floor(B/L)-1 of tokens [jL, jL+L) of the stream, "
                          "every next-token target [jL+1, jL+L] scored; B = max_tokens"),
        "models": {},
    }
    for s in out_series:
        for r in s["results"].values():
            r["ppl"] = finite_or_none(r["ppl"])
            r["nll"] = finite_or_none(r["nll"])
        for r in s["buckets"]["rows"]:
            r["ppl"], r["nll"] = finite_or_none(r["ppl"]), finite_or_none(r["nll"])
        result["models"][s["label"]] = s
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        write_plot(args.plot, out_series, lengths, [m["config"].block_size for m in models])
    return result


if __name__ == "__main__":
    main()
