r"""
Zero-shot evaluation of checkpoints on the PoPE paper's Table 5 tasks (LAMBADA,
BLiMP, CBT, HellaSwag, PIQA, ARC-Easy) with EleutherAI's lm-evaluation-harness
(pip install "lm-eval>=0.4,<0.5").

Usage:
    python eval_downstream.py --ckpt PATH [PATH ...]
        [--tasks lambada,blimp,cbt,hellaswag,piqa,arc_easy]
        [--data_dir DIR] [--limit N] [--batch_size N] [--device auto|cpu|cuda|cuda:N]
        [--attn_impl auto|torch|triton] [--json out.json] [--trust_remote_code]
    e.g. python eval_downstream.py --ckpt out-pope/ckpt.pt out-rope/ckpt.pt \
             --data_dir $POPE_SHARED_DATA/evals

The tasks are the harness's own (prompts, metrics, BLiMP's 67-paradigm mean):
lambada_openai, blimp, hellaswag, piqa, arc_easy, plus ours for CBT, which the
harness lacks (config/lm_eval/cbt*.yaml: mean of cbt_cn, cbt_ne). Without
--data_dir they load their Hugging Face datasets; with it, config/lm_eval/local_*.yaml
run the same tasks on the local files (loaders: config/lm_eval/local_data.py;
CBT: cbtest_{CN,NE}_test_2500ex.txt from CBTest.tgz in DIR, DIR/cbt or
DIR/CBTest/data) and the hub is never asked (HF_DATASETS_OFFLINE=HF_HUB_OFFLINE=1,
also when it is unreachable). A task without data is reported; the others run
(a DIR with none of the asked tasks' files is refused at once).

Scoring as the harness's HF models: requests sorted by length and batched, cut
on the left to block_size, log-softmax in float32 over the 50257 GPT-2 tokens
(bf16 autocast on CUDA), <|endoftext|> before empty contexts and rolling windows.
Table: accuracy in % (HellaSwag/PIQA/ARC-E: acc_norm); --json: the harness's
full results per checkpoint (stderrs from 1000 bootstrap draws).
"""
import argparse
import contextlib
import logging
import os
import socket
import sys
from urllib.parse import urlparse

import torch
import torch.nn.functional as F

from model import CheckpointError, load_checkpoint, read_checkpoint
from prepare.common import (AT_LEAST_1, DEVICE_RULE, KERNEL_RULE, PrepareError, check_flags,
                            check_kernel, check_outputs, check_vocab, codec, die, resolve_device,
                            run_main, write_json)

ROOT = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(ROOT, "config", "lm_eval")
EOT = 50256  # GPT-2's <|endoftext|>
# our name: (table column, harness task/group, folder in lm_eval/tasks, metric, our group offline)
TASKS = {
    "lambada": ("LAMBADA", "lambada_openai", "lambada", "acc", False),
    "blimp": ("BLiMP", "blimp", "blimp", "acc", True),
    "cbt": ("CBT", "cbt", None, "acc", True),
    "hellaswag": ("HellaSwag", "hellaswag", "hellaswag", "acc_norm", False),
    "piqa": ("PIQA", "piqa", "piqa", "acc_norm", False),
    "arc_easy": ("ARC-E", "arc_easy", "arc", "acc_norm", False),
}
POS_NAMES = {"pope": "PoPE", "rope": "RoPE", "none": "NoPE"}
FLAGS = {"limit": AT_LEAST_1, "batch_size": AT_LEAST_1, "device": DEVICE_RULE,
         "attn_impl": KERNEL_RULE}  # as train.py's RULES
# what each task reads in --data_dir (config/lm_eval/local_data.py): none there is a wrong path
LOCAL_FILES = {"lambada": ["lambada_openai.jsonl"], "blimp": ["blimp"],
               "hellaswag": ["hellaswag_val.txt"], "piqa": ["piqa.jsonl"],
               "arc_easy": ["arc_easy.jsonl"],
               "cbt": [os.path.join(d, n) for d in ("", "cbt", "CBTest/data")
                       for sub in ("CN", "NE")
                       for n in (f"cbtest_{sub}_test_2500ex.txt", f"cbt_{sub}.jsonl")]}


def make_lm(model, encode, *, batch_size=8, device="cpu", vocab_size=50257):
    """An lm_eval LM (TemplateLM: the harness's own context/continuation encoding) over our GPT."""
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from tqdm import tqdm

    class GPTLM(TemplateLM):
        eot_token_id = EOT
        max_length = model.config.block_size

        def tok_encode(self, string, add_special_tokens=None, **kwargs):
            return encode(string)

        @torch.no_grad()
        def score(self, pairs, disable_tqdm=False):
            """(context ids, continuation ids) -> (sum log p(continuation), all greedy).
            The last max_length + 1 tokens are kept; a continuation longer than
            max_length (never in these tasks) is scored on its last max_length tokens."""
            T, out = self.max_length, [None] * len(pairs)
            order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
            cuda = str(device).startswith("cuda")
            amp = torch.autocast("cuda", torch.bfloat16) if cuda else contextlib.nullcontext()
            for s in tqdm(range(0, len(order), batch_size), disable=disable_tqdm, file=sys.stderr):
                idx = order[s:s + batch_size]
                seqs = [(list(pairs[i][0]) + list(pairs[i][1]))[-(T + 1):] for i in idx]
                x = torch.zeros(len(idx), max(len(q) for q in seqs) - 1, dtype=torch.long)
                for r, q in enumerate(seqs):  # right padding: a causal model never sees it
                    x[r, :len(q) - 1] = torch.tensor(q[:-1])
                x = x.to(device)
                with amp:
                    logits, _ = model(x, x)  # targets given: logits at every position
                for r, (i, q) in enumerate(zip(idx, seqs)):
                    n = min(len(pairs[i][1]), len(q) - 1)
                    lg = logits[r, len(q) - 1 - n:len(q) - 1, :vocab_size]
                    lp = F.log_softmax(lg.float(), dim=-1)
                    tgt = torch.tensor(q[len(q) - n:], device=lp.device)  # n == 0: (0.0, True)
                    out[i] = (lp.gather(1, tgt[:, None]).sum().item(),
                              bool((lp.argmax(-1) == tgt).all()))
            return out

        def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
            return self.score([(ctx, cont) for _, ctx, cont in requests], disable_tqdm)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            """Sum of log p over a whole text: the harness's disjoint rolling windows."""
            windows, owner = [], []
            for k, req in enumerate(requests):
                for w in get_rolling_token_windows(self.tok_encode(req.args[0]), EOT,
                                                   self.max_length, 1):
                    windows.append(make_disjoint_window(w))
                    owner.append(k)
            totals = [0.0] * len(requests)
            for k, (lp, _) in zip(owner, self.score(windows, disable_tqdm)):
                totals[k] += lp
            return totals

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError("eval_downstream.py scores log-likelihoods only")

    return GPTLM()


def check_checkpoint(path):
    """(meta, encode) of a checkpoint; a one-line error for anything but a GPT-2-tokenized model."""
    # every checkpoint before any task: else a damaged one stops the run after the others' tasks
    try:
        ckpt = read_checkpoint(path)
    except CheckpointError as e:
        die(str(e))
    meta = ckpt.get("meta") or {}
    if meta.get("tokenizer") != "gpt2":
        die(f"eval_downstream.py needs a GPT-2-tokenized language model; {path} was trained on "
            f"{(ckpt.get('config') or {}).get('dataset', 'a dataset')} "
            f"(vocab {meta.get('vocab_size', '?')})")
    check_vocab(meta, ckpt["model_args"].get("vocab_size"), path)
    try:
        return meta, codec(meta)[0]  # loads tiktoken's gpt2 files now
    except PrepareError as e:
        die(str(e))


def hub_reachable(timeout=3.0):
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname, url.port or 443)
    with contextlib.suppress(OSError), socket.create_connection(address, timeout):
        return True
    return False


def task_manager(tasks, data_dir=None, limit=None):
    """Only the harness's folders we need (indexing all of lm_eval/tasks takes ~20 s) and ours;
    the metadata reaches our loaders (config/lm_eval/local_data.py)."""
    import lm_eval.tasks
    base = os.path.dirname(lm_eval.tasks.__file__)
    paths = sorted({os.path.join(base, TASKS[t][2]) for t in tasks if TASKS[t][2]}) + [CONFIG_DIR]
    return lm_eval.tasks.TaskManager(include_defaults=False, include_path=paths,
                                     metadata={"data_dir": data_dir, "limit": limit})


def evaluate(lm, tasks, data_dir=None, limit=None, batch_size=None, device=None):
    """The harness on our tasks:
    (its results or None, {task: accuracy}, {task: why it did not run})."""
    import lm_eval
    logging.getLogger("lm_eval.api.task").addFilter(lambda r: "Custom kwargs" not in r.getMessage())
    tm = task_manager(tasks, data_dir, limit)
    objs, errors = [], {}
    for t in tasks:  # one at a time: a task without data must not stop the others
        spec = ("local_" if data_dir else "") + TASKS[t][1]
        try:
            loaded = tm.load([spec])
            objs.append(loaded["groups"].get(spec) or loaded["tasks"][spec])
        except Exception as e:  # no local file, hub unreachable, ...
            msg = (str(e).strip().splitlines() or [""])[0]
            if msg.startswith("no data"):
                errors[t] = msg
            else:
                errors[t] = (f"could not load its data: {type(e).__name__}: {msg}"
                             + ("" if data_dir else "; or pass --data_dir with local copies"))
            print(f"{t}: {errors[t]}", file=sys.stderr)
    if not objs:
        return None, {}, errors
    with contextlib.redirect_stdout(sys.stderr):  # the harness prints; stdout is for the table
        res = lm_eval.simple_evaluate(model=lm, tasks=objs, task_manager=tm, limit=limit,
                                      batch_size=batch_size, device=device, log_samples=False,
                                      bootstrap_iters=1000)
    keys = {t: ("local_" if data_dir and TASKS[t][4] else "") + TASKS[t][1]
            for t in tasks if t not in errors}
    return res, {t: res["results"][k][TASKS[t][3] + ",none"] for t, k in keys.items()}, errors


def format_table(rows, tasks):
    """rows: (label, {task: accuracy}, errors). Markdown in the paper's layout."""
    head = ["Model"] + [TASKS[t][0] for t in tasks] + ["Avg"]
    lines, notes = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)], []
    for label, table, errors in rows:
        avg = "-"
        if table:
            avg = f"{100 * sum(table.values()) / len(table):.1f}" + ("*" if errors else "")
        cells = [f"{100 * table[t]:.1f}" if t in table else "-" for t in tasks]
        lines.append("| " + " | ".join([label, *cells, avg]) + " |")
        notes += [f"* {label}: {t} did not run ({why})" for t, why in errors.items()]
    return "\n".join(lines + notes + ["(zero-shot accuracy in %; HellaSwag/PIQA/ARC-E: acc_norm; "
                                      "Avg over the tasks that ran)"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", nargs="+", required=True,
                   help="train.py checkpoint(s), one table row each")
    p.add_argument("--tasks", default="all",
                   help=f"comma-separated subset of {','.join(TASKS)}, or all")
    p.add_argument("--data_dir",
                   help="local copies of the data, e.g. $POPE_SHARED_DATA/evals (offline)")
    p.add_argument("--limit", type=int, help="first N documents per task (BLiMP: per paradigm)")
    p.add_argument("--batch_size", type=int,
                   help="sequences per forward pass (default 32 on CUDA, 8 on CPU)")
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--attn_impl", choices=["auto", "torch", "triton"],
                   help="attention code (default: the checkpoint's)")
    p.add_argument("--json", help="write the harness's full results per checkpoint here")
    p.add_argument("--trust_remote_code", action="store_true",
                   help="let a dataset's loading script run (never done without this flag)")
    args = p.parse_args(argv)
    names = list(TASKS) if args.tasks == "all" else [t.strip().replace("-", "_")
                                                     for t in args.tasks.split(",")]
    tasks = [t for t in TASKS if t in names]
    if set(names) - set(TASKS) or not tasks:
        p.error(f"--tasks {args.tasks!r}: choose from {','.join(TASKS)} or all")
    check_flags(args, FLAGS)  # (None: the default; 0 is no default but a mistake)
    # one line, not a line per task
    if args.data_dir and not any(os.path.exists(os.path.join(args.data_dir, n))
                                 for t in tasks for n in LOCAL_FILES[t]):
        die(f"--data_dir {args.data_dir} holds none of "
            f"{', '.join(LOCAL_FILES[t][0] for t in tasks)}; point it at local copies "
            "(e.g. $POPE_SHARED_DATA/evals) or leave it out for the Hugging Face datasets")
    checked = [check_checkpoint(c) for c in args.ckpt]  # refuse before running anything
    try:
        if args.json:
            check_outputs(json=args.json)
    except PrepareError as e:
        die(str(e))
    if not args.trust_remote_code:
        os.environ.pop("HF_DATASETS_TRUST_REMOTE_CODE", None)
    if args.data_dir or not hub_reachable():  # datasets and huggingface_hub read these at import
        if not args.data_dir:
            print("note: the Hugging Face hub is unreachable; only cached datasets load",
                  file=sys.stderr)
        os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("DISABLE_MULTIPROC", "1")  # the harness's bootstrap: no process pool
    try:
        import datasets
        # for --json: the harness's configs hold functions
        from lm_eval.utils import handle_non_serializable
    except ImportError as e:
        die('eval_downstream.py needs lm-evaluation-harness: pip install "lm-eval>=0.4,<0.5" '
            f"({e})")
    if args.trust_remote_code:  # as the harness's own --trust_remote_code does
        datasets.config.HF_DATASETS_TRUST_REMOTE_CODE = True

    device = resolve_device(args.device)
    batch_size = args.batch_size or (32 if device.startswith("cuda") else 8)
    rows = []
    report = {"tasks": tasks, "data_dir": args.data_dir, "limit": args.limit, "device": device,
              "batch_size": batch_size, "models": []}
    for path, (meta, encode) in zip(args.ckpt, checked):
        try:
            impl = {"attn_impl": args.attn_impl} if args.attn_impl else {}  # else the checkpoint's
            model, _ = load_checkpoint(path, device=device, **impl)
        except CheckpointError as e:
            die(str(e))
        check_kernel(model.config, device, path)
        cfg, n_params = model.config, model.get_num_params()
        label = f"{POS_NAMES.get(cfg.pos_emb, cfg.pos_emb)} {n_params / 1e6:.0f}M"
        label += f" ({path})" if any(r[0] == label for r in rows) else ""
        print(f"{label}: {path}, block_size {cfg.block_size}, device {device}", file=sys.stderr)
        print(f"attention: {model.attention_path()}", file=sys.stderr)
        lm = make_lm(model, encode, batch_size=batch_size, device=device,
                     vocab_size=meta.get("vocab_size", 50257))
        res, table, errors = evaluate(lm, tasks, args.data_dir, args.limit, batch_size, device)
        rows.append((label, table, errors))
        report["models"].append({"ckpt": path, "label": label, "pos_emb": cfg.pos_emb,
                                 "n_params": n_params, "block_size": cfg.block_size,
                                 "table": table, "errors": errors, "harness": res})
        del model, lm
    print(format_table(rows, tasks))
    if args.json:
        write_json(args.json, report, indent=2, default=handle_non_serializable)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(table for _, table, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(run_main(main))
