r"""
Which positional frequencies a trained model uses (the paper's last analysis, arXiv 2509.10534:
RoPE models suppress their high-frequency channels, PoPE models use a broader range): per layer,
head and frequency channel, the mean magnitude of the query's and key's channel and the channel's
weight in the score.

Usage:
  python eval_frequencies.py --ckpt out-pope/ckpt.pt out-rope/ckpt.pt --data data/english/val.bin
  python eval_frequencies.py --ckpt A.pt B.pt --labels PoPE,RoPE --data val.bin \
      --json f.json --plot f.png

q and k are the attention's own: forward hooks on model.CausalSelfAttention's q_probe and k_probe
(each head's projection, before RoPE or a cache). Each model runs the first --tokens tokens
(default: up to 65536) in windows of its block size T (positions 0..T-1), in float32; the sums are
float64. A split of fixed rows (meta.json's row_len) is read as train.py reads it, a window per
row, its first min(T, row_len - 1) tokens.
  PoPE  channel c = 0..D-1 at theta_c = base^(-c/D) (model.pope_frequencies); magnitude
        mu = pope_magnitude(x_c).
  RoPE  pair i = the two dims model.apply_rope rotates together (found by rotating each basis
        vector), at the angle it turns per position (the model's inv_freq, YaRN included);
        magnitude = the pair's norm.
  NoPE  the same pairs and norms, at the frequencies RoPE would give them (a reference: nothing
        rotates).
Per (layer, head, channel): q_mag, k_mag = the mean magnitude over all positions; weight = the
mean of mag_q[t] * mag_k[s] over the causal pairs s <= t of every window (the channel's mean size
in the score before its cosine). share = weight summed over heads, each layer's row normalised to
sum to 1. Channels are ordered by frequency, highest first; the top quarter is the C // 4
highest-frequency channels of C.
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from model import (CheckpointError, load_checkpoint, apply_rope, pope_frequencies, pope_magnitude,
                   rope_cos_sin, yarn_inv_freq)
from prepare.common import (AT_LEAST_1, DEVICE_RULE, KERNEL_RULE, PrepareError, check_flags,
                            check_kernel, check_outputs, die, load_meta, output_file, read_tokens,
                            resolve_device, run_main, vocab_key, write_json)

DEFAULT_TOKENS = 65536  # without --tokens: up to this many, fewer where --data holds fewer
FLAGS = {"tokens": AT_LEAST_1, "batch_size": AT_LEAST_1, "device": DEVICE_RULE,
         "attn_impl": KERNEL_RULE}  # flag: (rule, what it must be), as train.py's RULES


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--ckpt", nargs="+", required=True, help="one or more train.py checkpoints (ckpt.pt)")
    add("--data", required=True,
        help='a prepared split X.bin (meta.json beside it); X.txt or X.jsonl')
    add("--tokens", type=int,
        help=f"tokens per model, in whole windows (default: up to {DEFAULT_TOKENS})")
    add("--labels",
        help="comma-separated names, one per --ckpt (default: D of D/ckpt.pt, else X of X.pt)")
    add("--batch_size", type=int, default=8, help="windows per forward pass (default 8)")
    add("--json", help="write every array here")
    add("--plot",
        help="write a PNG here: layer x frequency heat maps, the mean over layers (matplotlib)")
    add("--device", default="auto", help="auto (cuda if available) | cpu | cuda | cuda:1 ...")
    add("--attn_impl", choices=["auto", "torch", "triton"],
        help="attention code (default: the checkpoint's)")
    add("--no_progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    check_flags(args, FLAGS)
    args.labels = args.labels and [x.strip() for x in args.labels.split(",")]
    if args.labels and len(args.labels) != len(args.ckpt):
        die(f"--labels has {len(args.labels)} names for {len(args.ckpt)} checkpoints")
    # fail before the slow part
    if missing := [path for path in args.ckpt if not os.path.isfile(path)]:
        die(f"checkpoint {missing[0]} not found (train.py writes out_dir/ckpt.pt)")
    if os.path.splitext(args.data)[1].lower() not in (".bin", ".txt", ".jsonl"):
        die(f"--data must be a .bin (with meta.json beside it), .txt or .jsonl; got {args.data}")
    if not (os.path.isfile(args.data) and os.path.getsize(args.data)):
        die(f"data file {args.data} is missing or empty")
    args.labels = args.labels or [
        Path(p).stem if Path(p).name != "ckpt.pt" else Path(p).resolve().parent.name
        for p in args.ckpt]
    if len(set(args.labels)) < len(args.labels):  # (results are keyed by label)
        die(f"two checkpoints share the label {max(args.labels, key=args.labels.count)!r}; "
            "give --labels")
    try:  # before the slow part
        check_outputs(json=args.json, plot=args.plot)
    except PrepareError as e:
        die(e)
    return args


def channels(model):
    """(frequencies, dims): each channel's frequency and the head dims it reads, in the model's
    own order."""
    cfg, D = model.config, model.config.n_embd // model.config.n_head
    if cfg.pos_emb == "pope":
        freqs = pope_frequencies(D, cfg.pope_base, dtype=torch.float64).numpy()
        return freqs, np.arange(D)[:, None]
    inv_freq = model.transformer.h[0].attn.inv_freq if cfg.pos_emb == "rope" else \
        yarn_inv_freq(D, cfg.rope_base, 1.0, 1)[0]  # NoPE: RoPE's frequencies, for the axis
    # each basis vector e_j, rotated one position, turns in its pair's plane by the pair's frequency
    one = rope_cos_sin(inv_freq.cpu().double(), torch.ones(1))  # the rotation to position 1
    r = apply_rope(torch.eye(D, dtype=torch.float64).view(D, 1, 1, D), *one)[:, 0, 0]
    partner = (r.abs() * (1 - torch.eye(D, dtype=torch.float64))).argmax(1)
    if (r.abs() > 1e-12).sum(1).ne(2).any() or partner[partner].ne(torch.arange(D)).any():
        die("model.apply_rope does not rotate the head dims in pairs; this script measures pairs")
    pairs = torch.stack([torch.arange(D), partner], 1)[torch.arange(D) < partner]
    freqs = torch.atan2(r[pairs[:, 0], pairs[:, 1]].abs(), r[pairs[:, 0], pairs[:, 0]]).numpy()
    return freqs, pairs.numpy()


@torch.no_grad()
def measure(label, path, model, windows, stride, bs, device, bar):
    """The (n, T) windows (one every stride tokens) through the model: the docstring's
    statistics."""
    cfg, (freqs, dims), (n, T) = model.config, channels(model), windows.shape
    idx = torch.as_tensor(dims, device=device)

    def mag(x):
        """(B, H, T, C) magnitudes in float64: model.pope_magnitude (PoPE) or the norm of each
        pair."""
        x = x.double()
        if cfg.pos_emb == "pope":
            return pope_magnitude(x)
        return torch.hypot(x[..., idx[:, 0]], x[..., idx[:, 1]])
    sums = torch.zeros(3, cfg.n_layer, cfg.n_head, len(dims), dtype=torch.float64, device=device)
    held = {}

    def on_k(layer):
        def hook(module, inp, k):
            mq, mk = mag(held.pop(layer)), mag(k)
            sums[0, layer] += mq.sum((0, 2))
            sums[1, layer] += mk.sum((0, 2))
            # sum_t mag_q[t] * sum_{s<=t} mag_k[s]
            sums[2, layer] += (mq * mk.cumsum(2)).sum((0, 2))
        return hook
    attns = [block.attn for block in model.transformer.h]
    handles = [h for i, a in enumerate(attns) for h in (
        a.q_probe.register_forward_hook(lambda m, inp, q, i=i: held.__setitem__(i, q)),
        a.k_probe.register_forward_hook(on_k(i)))]
    try:
        for j in range(0, n, bs):
            batch = np.array(windows[j:j + bs], dtype=np.int64)  # (a copy)
            model(torch.from_numpy(batch).to(device))
            bar.update(1)
    finally:
        for h in handles:
            h.remove()
    order = np.argsort(-freqs, kind="stable")  # highest frequency first
    s = sums[..., torch.as_tensor(order, device=device)].cpu().numpy()
    q, k, w = s[0] / (n * T), s[1] / (n * T), s[2] / (n * T * (T + 1) / 2)  # (positions; pairs)
    share = w.sum(1) / w.sum((1, 2))[:, None]  # (layer, channel): over heads, each row sums to 1
    top = share[:, :(n_top := max(1, len(order) // 4))].sum(1)
    return {"label": label, "ckpt": path, "pos_emb": cfg.pos_emb, "n_layer": cfg.n_layer,
            "n_head": cfg.n_head, "head_dim": cfg.n_embd // cfg.n_head, "window": T,
            "stride": stride, "tokens": n * T, "freq": freqs[order].tolist(),
            "dims": dims[order].tolist(), "q_mag": q.tolist(), "k_mag": k.tolist(),
            "weight": w.tolist(), "share": share.tolist(), "top_quarter": n_top,
            "top_quarter_share": top.tolist(), "top_quarter_share_mean": float(top.mean())}


def write_plot(path, models):
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    fig = Figure(figsize=(7, 2.4 * (len(models) + 1)), layout="constrained")
    axes = fig.subplots(len(models) + 1, 1, sharex=True)  # one frequency axis for every model
    # cells span the geometric midpoints between channels' frequencies
    for ax, m in zip(axes, models):
        lf = np.log(m["freq"])
        d = np.diff(lf) if len(lf) > 1 else np.array([-1.0])
        edges = np.exp(np.concatenate([[lf[0] - d[0] / 2], lf[:-1] + d / 2, [lf[-1] + d[-1] / 2]]))
        im = ax.pcolormesh(edges, np.arange(m["n_layer"] + 1) - 0.5, np.array(m["share"]),
                           cmap="viridis")
        fig.colorbar(im, ax=ax, label="share")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set(xscale="log", ylabel="layer",
               title=f"{m['label']} ({m['pos_emb']}): score weight by channel")
    for m in models:
        axes[-1].plot(m["freq"], np.array(m["share"]).mean(0) * len(m["freq"]), marker=".",
                      linestyle="--" if m["pos_emb"] == "none" else "-",
                      label=f"{m['label']} ({m['pos_emb']})")
    axes[-1].axhline(1, color="gray", linestyle=":", linewidth=1)
    axes[-1].set(xlabel="frequency (radians per position)",
                 ylabel="mean share x channels (1 = even)",
                 title="Mean over layers")
    axes[-1].legend()
    with output_file(path) as f:
        fig.savefig(f, dpi=120, format="png")
    print(f"wrote {path}")
    return fig


def main(argv=None):
    args = parse_args(argv)
    device = resolve_device(args.device)
    runs, streams, row_len, limit = [], {}, None, args.tokens or DEFAULT_TOKENS
    for i, path in enumerate(args.ckpt):
        try:
            # (default: the checkpoint's)
            impl = {"attn_impl": args.attn_impl} if args.attn_impl else {}
            model, ckpt = load_checkpoint(path, device, **impl)
        except CheckpointError as e:
            die(str(e))
        check_kernel(model.config, device, path)
        label, meta = args.labels[i], ckpt.get("meta") or {}
        if (key := vocab_key(meta)) not in streams:  # one token stream per tokenizer
            try:
                dataset = (ckpt.get("config") or {}).get("dataset")
                streams[key] = read_tokens(args.data, meta, limit, path, dataset=dataset)[:limit]
            except PrepareError as e:
                die(e)
            # (its meta.json: checked by read_tokens)
            if os.path.splitext(args.data)[1].lower() == ".bin":
                row_len = load_meta(os.path.dirname(os.path.abspath(args.data))).get("row_len")
        T = model.config.block_size
        # a window per row, or back to back
        T, stride = (min(T, row_len - 1), row_len) if row_len else (T, T)
        toks = streams[key]
        if min(len(toks), args.tokens or T) < T:
            die(f"{args.data}: {min(len(toks), args.tokens or T)} tokens, "
                f"less than a window of {path} ({T})")
        if args.tokens is not None and len(toks) < args.tokens:
            die(f"{args.data} has only {len(toks)} tokens for {path}; pass --tokens <= {len(toks)}")
        # (n, T) views, no copy
        windows = np.lib.stride_tricks.sliding_window_view(toks, T)[::stride]
        if len(windows) * stride != len(toks):  # say how much of the data was used
            print(f"note: {label}: {len(windows)} whole windows of {T} from {len(toks)} tokens "
                  f"of {args.data}" + (f" (one per row of {row_len})" if row_len else ""),
                  file=sys.stderr)
        if (vmax := int(np.max(toks))) >= model.config.vocab_size:
            die(f"{args.data} holds token id {vmax}; "
                f"{path} has a vocabulary of {model.config.vocab_size}")
        runs.append((label, path, model, windows, stride))
    total = sum(-(-len(windows) // args.batch_size) for _, _, _, windows, _ in runs)
    with tqdm(total=total, unit="batch", file=sys.stderr, disable=args.no_progress) as bar:
        models = [measure(*r, args.batch_size, device, bar) for r in runs]
    for m in models:
        print(f"\n{m['label']} ({m['pos_emb']}): share of the score weight in the top quarter "
              f"of frequencies ({m['top_quarter']} of {len(m['freq'])} channels, theta >= "
              f"{m['freq'][m['top_quarter'] - 1]:.3g})")
        print("  layer " + "".join(f"{i:>7}" for i in range(m["n_layer"])) + "   mean")
        shares = [*m["top_quarter_share"], m["top_quarter_share_mean"]]
        print("  share " + "".join(f"{x:7.3f}" for x in shares))
    result = {"data": args.data, "tokens": limit, "device": device,
              "models": {m["label"]: m for m in models},
              "definitions": __doc__[__doc__.index("q and k are"):].strip()}
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    if args.plot:
        write_plot(args.plot, models)
    return result


if __name__ == "__main__":
    run_main(main)
