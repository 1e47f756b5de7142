"""
Zero-shot downstream evaluation of trained checkpoints on the six tasks of the
PoPE paper's Table 5 (arXiv 2509.10534): LAMBADA, BLiMP, CBT, HellaSwag, PIQA
and ARC-Easy.

Usage:
    python eval_downstream.py --ckpt PATH [PATH ...] [--tasks lambada,blimp,cbt,hellaswag,piqa,arc_easy]
                              [--data_dir DIR] [--limit N] [--json out.json]
                              [--device auto|cpu|cuda|cuda:N] [--batch_size N]
                              [--mc_metric acc_norm|acc|acc_norm_token] [--no_progress]

    # e.g. PoPE vs RoPE in one table, on the offline copies of the data:
    python eval_downstream.py --ckpt out-pope/ckpt.pt out-rope/ckpt.pt --data_dir ../shared/data/evals

Several --ckpt paths give one table row each. --limit N keeps the first N items
of each task (BLiMP: of each of its 67 paradigms; CBT: of each of CN and NE),
which makes a CPU smoke test take seconds.

Data
----
Without --data_dir each task loads its Hugging Face `datasets` id:
    lambada    EleutherAI/lambada_openai (default, test)   OpenAI's detokenized LAMBADA, 5,153 items
    blimp      nyu-mll/blimp (67 configs, train)           67 paradigms x 1,000 minimal pairs
    cbt        cam-cst/cbt (CN and NE, test)                2 x 2,500 items
    hellaswag  Rowan/hellaswag (validation)                 10,042 items
    piqa       baber/piqa or ybisk/piqa (validation)        1,838 items
    arc_easy   allenai/ai2_arc (ARC-Easy, test)             2,376 items
With --data_dir DIR a task reads its local file(s) first, and only falls back
to the hub when they are missing:
    lambada    DIR/lambada_openai.jsonl   {"context", "continuation"} (llm-foundry) or {"text"} (HF;
               also read from OpenAI's original lambada_test.jsonl); the last word is the text
               after the last space
    blimp      DIR/blimp/<paradigm>.jsonl  the original BLiMP files (= the HF rows)
    cbt        DIR[/cbt | /CBTest/data]/cbtest_{CN,NE}_test_2500ex.txt, the official CBTest
               text format (story lines "1 ..." to "20 ...", then "21 <question with XXXXX>
               <TAB><answer><TAB><TAB><cand1|...|cand10>", a blank line); or cbt_{CN,NE}.jsonl
               / cbt/{CN,NE}.jsonl holding the HF rows {"sentences", "question", "answer", "options"}
               (e.g. written by `load_dataset("cam-cst/cbt", "CN", split="test").to_json(...)`)
    hellaswag  DIR/hellaswag_val.txt (6 lines per item: context, label, 4 endings) or
               DIR/hellaswag_val.jsonl (rowanz/hellaswag or HF rows)
    piqa       DIR/piqa.jsonl       {"query", "choices", "gold"} (llm-foundry)
                                    or the HF rows {"goal", "sol1", "sol2", "label"}
    arc_easy   DIR/arc_easy.jsonl   {"query", "choices", "gold"} (llm-foundry)
                                    or the HF rows {"question", "choices", "answerKey"}
If neither a local file nor the hub is usable (no `datasets` package, no
network and nothing cached), that task fails at once with a message saying
what to download or pass, and the other tasks still run. The hub is probed
with a 3 s connection timeout first; when it is unreachable the `datasets`
library is put in offline mode (HF_DATASETS_OFFLINE=1), so it never hangs.

Scoring
-------
All scores are log-likelihoods under the model: the forward pass gets
(input, shifted input) so it returns logits at every position, and the
log-softmax is taken in float32 (the model runs under bf16 autocast on CUDA).
A continuation is scored as the sum of log p(token | everything before it).
Text is encoded with the checkpoint's tokenizer (meta.json: tiktoken gpt2 for
BPE models). Whitespace at the end of a context is moved to the front of the
continuation (lm-eval-harness's rule), so " word" stays one BPE token. When
context + continuation is longer than the model's block_size, only the last
block_size tokens are fed (the start of the context is cut, as in
lm-eval-harness); PoPE/RoPE would run at any length, but the model was
trained at block_size. Requests are sorted by length and batched, padded on
the right to the longest in the batch; padding is never scored and, the model
being causal, never seen by a scored position.

  LAMBADA    context = passage minus its last word, target = " " + last word.
             acc: the greedy (argmax) prediction equals the target at every one
             of its tokens (a tie for the maximum counts as a hit). ppl: the
             perplexity of the last word, exp(-mean over items of log p(target)),
             as lm-eval-harness's lambada_openai "perplexity".
  BLiMP      log p(sentence) of the whole sentence, given <|endoftext|> as the
             start-of-document token (models without one: the first token is
             given, not scored); an item is right iff log p(good) > log p(bad)
             (strictly). acc = mean over paradigms of the per-paradigm accuracy.
  CBT        the 20 story sentences and the question are detokenized (the
             official text is PTB-tokenized: `` '' , n't ...). Each of the 10
             candidates is put in place of XXXXX and the candidate with the
             highest log-likelihood of the filled-in question sentence wins.
             Only the tokens from the blank to the end of the question are
             scored: the story and the question up to the blank are the same for
             every candidate, so this ranks exactly like the likelihood of the
             whole text. acc = mean of the CN and NE accuracies.
  HellaSwag, PIQA, ARC-Easy
             multiple choice by the log-likelihood of " " + choice after the
             context, lm-eval-harness's prompts:
               HellaSwag  "<activity_label>: <ctx>" with ctx = ctx_a + " " +
                          ctx_b.capitalize() and the [title]/[step] cleanup
                          (the local hellaswag_val.txt has the cleanup already
                          but keeps ctx_b's lower-case first letter)
               PIQA       "Question: <goal>\\nAnswer:"
               ARC-Easy   "Question: <question>\\nAnswer:"
             acc            argmax of the summed log-likelihood.
             acc_norm       argmax of log-likelihood / number of characters of
                            the choice (lm-eval-harness's acc_norm: per character).
             acc_norm_token argmax of log-likelihood / number of its tokens
                            (mean per-token log-likelihood).
             The table shows --mc_metric (default acc_norm); the JSON has all three.
             Ties go to the first choice.

Output
------
Per-task details, then a markdown table in the paper's layout: one row per
checkpoint, columns LAMBADA, BLiMP, CBT, HellaSwag, PIQA, ARC-E and their
average, in % (the average is over the tasks that ran; a footnote says when it
is not all six). --json writes every metric (per BLiMP paradigm, per CBT
subset), the data source of each task and the errors. Exit status: 0 when
every checkpoint got at least one task done, 1 otherwise.
"""

import argparse
import glob
import importlib.util
import json
import math
import os
import re
import socket
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from urllib.parse import urlparse

import torch

TASKS = ("lambada", "blimp", "cbt", "hellaswag", "piqa", "arc_easy")
TABLE_NAMES = {"lambada": "LAMBADA", "blimp": "BLiMP", "cbt": "CBT",
               "hellaswag": "HellaSwag", "piqa": "PIQA", "arc_easy": "ARC-E"}
MC_TASKS = ("hellaswag", "piqa", "arc_easy")
MC_METRICS = ("acc", "acc_norm", "acc_norm_token")
CBT_SUBSETS = ("CN", "NE")
GPT2_EOT = 50256
POS_NAMES = {"pope": "PoPE", "rope": "RoPE", "none": "NoPE"}

BLIMP_PARADIGMS = (
    "adjunct_island anaphor_gender_agreement anaphor_number_agreement animate_subject_passive "
    "animate_subject_trans causative complex_NP_island coordinate_structure_constraint_complex_left_branch "
    "coordinate_structure_constraint_object_extraction determiner_noun_agreement_1 determiner_noun_agreement_2 "
    "determiner_noun_agreement_irregular_1 determiner_noun_agreement_irregular_2 determiner_noun_agreement_with_adj_2 "
    "determiner_noun_agreement_with_adj_irregular_1 determiner_noun_agreement_with_adj_irregular_2 "
    "determiner_noun_agreement_with_adjective_1 distractor_agreement_relational_noun "
    "distractor_agreement_relative_clause drop_argument ellipsis_n_bar_1 ellipsis_n_bar_2 "
    "existential_there_object_raising existential_there_quantifiers_1 existential_there_quantifiers_2 "
    "existential_there_subject_raising expletive_it_object_raising inchoative intransitive "
    "irregular_past_participle_adjectives irregular_past_participle_verbs irregular_plural_subject_verb_agreement_1 "
    "irregular_plural_subject_verb_agreement_2 left_branch_island_echo_question left_branch_island_simple_question "
    "matrix_question_npi_licensor_present npi_present_1 npi_present_2 only_npi_licensor_present only_npi_scope "
    "passive_1 passive_2 principle_A_c_command principle_A_case_1 principle_A_case_2 principle_A_domain_1 "
    "principle_A_domain_2 principle_A_domain_3 principle_A_reconstruction regular_plural_subject_verb_agreement_1 "
    "regular_plural_subject_verb_agreement_2 sentential_negation_npi_licensor_present sentential_negation_npi_scope "
    "sentential_subject_island superlative_quantifiers_1 superlative_quantifiers_2 tough_vs_raising_1 "
    "tough_vs_raising_2 transitive wh_island wh_questions_object_gap wh_questions_subject_gap "
    "wh_questions_subject_gap_long_distance wh_vs_that_no_gap wh_vs_that_no_gap_long_distance wh_vs_that_with_gap "
    "wh_vs_that_with_gap_long_distance"
).split()
assert len(BLIMP_PARADIGMS) == 67


class TaskDataError(RuntimeError):
    """A task's data could not be found or parsed; the message says what to do."""


@dataclass
class LambadaItem:
    context: str
    target: str  # " " + last word


@dataclass
class MCItem:
    context: str  # "" = start of document
    continuations: list  # the strings scored after the context
    choices: list  # the bare choices (their lengths normalise acc_norm)
    gold: int
    group: str = ""  # BLiMP paradigm or CBT subset


# -----------------------------------------------------------------------------
# progress bar: tqdm when installed, else a line every few seconds on stderr

class _Progress:
    def __init__(self, total, desc, enabled=True):
        self.total, self.desc, self.enabled = total, desc, enabled
        self.n, self.t0, self.last = 0, time.time(), 0.0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, unit="seq", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def update(self, k):
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
        elif self.enabled:
            now = time.time()
            if now - self.last >= 5.0 or self.n >= self.total:
                self.last = now
                print(f"  {self.desc}: {self.n}/{self.total} ({100.0 * self.n / max(self.total, 1):.0f}%, "
                      f"{now - self.t0:.0f}s)", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# -----------------------------------------------------------------------------
# scoring: batched log-likelihoods of continuations

def make_request(encode, context, continuation, bos=None):
    """(context ids, continuation ids). Trailing whitespace of the context moves
    to the continuation. An empty context becomes [bos]; without a bos token the
    first continuation token becomes the (unscored) context."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = list(encode(context)) if context else []
    cont = list(encode(continuation))
    if not ctx:
        if bos is not None:
            ctx = [bos]
        else:
            ctx, cont = cont[:1], cont[1:]
    return ctx, cont


def autocast_for(device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if str(device).startswith("cuda") else nullcontext()


@torch.no_grad()
def score_requests(model, requests, *, block_size, device="cpu", batch_size=16, desc="score", progress=True):
    """Score (context ids, continuation ids) pairs. Returns one
    (sum of log p of the continuation tokens, greedy hit on all of them,
    number of tokens scored) per request.

    The fed sequence is (context + continuation)[:-1], cut to its last
    block_size tokens; the continuation tokens are the last len(continuation)
    targets (all of them unless the continuation alone is longer than
    block_size)."""
    out = [None] * len(requests)
    prepared = {}
    for i, (ctx, cont) in enumerate(requests):
        if len(cont) == 0:
            out[i] = (0.0, True, 0)
            continue
        if len(ctx) == 0:
            raise ValueError("a request needs at least one context token (pass bos)")
        full = list(ctx) + list(cont)
        inp, tgt = full[:-1][-block_size:], full[1:][-block_size:]
        prepared[i] = (inp, tgt, min(len(cont), len(tgt)))
    order = sorted(prepared, key=lambda i: -len(prepared[i][0]))
    bar = _Progress(len(order), desc, progress)
    for s in range(0, len(order), batch_size):
        idxs = order[s:s + batch_size]
        B, T = len(idxs), max(len(prepared[i][0]) for i in idxs)
        x = torch.zeros(B, T, dtype=torch.long)
        y = torch.zeros(B, T, dtype=torch.long)
        rows, cols = [], []
        for r, i in enumerate(idxs):
            inp, tgt, n = prepared[i]
            L = len(inp)
            x[r, :L] = torch.tensor(inp)
            y[r, :L] = torch.tensor(tgt)
            rows += [r] * n
            cols += range(L - n, L)
        x, y = x.to(device), y.to(device)
        rows_t = torch.tensor(rows, device=device)
        cols_t = torch.tensor(cols, device=device)
        with autocast_for(device):
            logits, _ = model(x, y)
        sel = logits[rows_t, cols_t].float()  # (N, V): only the scored positions
        tgt = y[rows_t, cols_t]
        tok_logit = sel.gather(1, tgt[:, None]).squeeze(1)
        tok_lp = tok_logit - torch.logsumexp(sel, dim=-1)
        miss = (tok_logit < sel.max(dim=-1).values).double()
        lp_sum = torch.zeros(B, dtype=torch.float64, device=device).index_add_(0, rows_t, tok_lp.double())
        n_miss = torch.zeros(B, dtype=torch.float64, device=device).index_add_(0, rows_t, miss)
        lp_sum, n_miss = lp_sum.tolist(), n_miss.tolist()
        for r, i in enumerate(idxs):
            out[i] = (lp_sum[r], n_miss[r] == 0, prepared[i][2])
        bar.update(B)
        del logits, sel
    bar.close()
    return out


# -----------------------------------------------------------------------------
# data: records (local files or HF rows) -> items

_HUB_OK = None


def _hub_reachable(timeout=3.0):
    global _HUB_OK
    if _HUB_OK is None:
        url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            _HUB_OK = True
        except OSError:
            _HUB_OK = False
    return _HUB_OK


def hf_rows(paths, name, split, limit, task, local_hint):
    """Rows of a HF dataset as dicts (the first of the candidate ids that loads),
    or a TaskDataError at once when `datasets` is missing or the hub is offline."""
    paths = (paths,) if isinstance(paths, str) else tuple(paths)
    how = (f"pass --data_dir DIR with {local_hint}, or install `datasets` (pip install datasets) with network "
           f"access to download {' or '.join(paths)}" + (f" ({name}, {split})" if name else f" ({split})"))
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
                  for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))
    if "datasets" not in sys.modules and importlib.util.find_spec("datasets") is None:
        raise TaskDataError(f"{task}: no local data and the `datasets` package is not installed; {how}")
    if "datasets" not in sys.modules and not offline and not _hub_reachable():
        # datasets reads these at import: offline mode makes an uncached dataset fail at once
        os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
        offline = True
    import datasets
    errors = []
    for path in paths:
        try:
            try:
                ds = datasets.load_dataset(path, name, split=split)
            except Exception as e:
                if "trust_remote_code" not in str(e):
                    raise
                ds = datasets.load_dataset(path, name, split=split, trust_remote_code=True)  # script datasets
        except Exception as e:  # offline and not cached, renamed ids, ...
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            errors.append(f"{path}: {type(e).__name__}: {msg}")
            continue
        if limit is not None:
            ds = ds.select(range(min(limit, len(ds))))
        return [dict(r) for r in ds]
    state = " (offline: only the HF cache was looked at)" if offline else ""
    raise TaskDataError(f"{task}: loading from the hub failed{state}: {'; '.join(errors)}; {how}")


def read_jsonl(path, limit=None):
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and len(rows) >= limit:
                break
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TaskDataError(f"{path}:{lineno}: not JSON ({e})") from None
    return rows


def _local(data_dir, *names):
    if data_dir is None:
        return None
    for n in names:
        p = os.path.join(data_dir, n)
        if os.path.isfile(p):
            return p
    return None


def lambada_item(r):
    if "context" in r and "continuation" in r:
        context, word = r["context"], r["continuation"]
    elif "text" in r:
        context, _, word = r["text"].rpartition(" ")
    else:
        raise TaskDataError(f"lambada: a row needs context/continuation or text, got keys {sorted(r)}")
    return LambadaItem(context, " " + word)


def qa_item(r):
    """PIQA / ARC: llm-foundry rows {query, choices, gold} or the HF rows."""
    if "query" in r:
        query, choices, gold = r["query"], list(r["choices"]), int(r["gold"])
    elif "goal" in r:  # ybisk/piqa
        query, choices, gold = "Question: " + r["goal"] + "\n", [r["sol1"], r["sol2"]], int(r["label"])
    elif "question" in r and isinstance(r.get("choices"), dict):  # allenai/ai2_arc
        query, choices = "Question: " + r["question"], list(r["choices"]["text"])
        labels = list(r["choices"]["label"])
        if r["answerKey"] not in labels:
            raise TaskDataError(f"arc: answerKey {r['answerKey']!r} not among labels {labels}")
        gold = labels.index(r["answerKey"])
    else:
        raise TaskDataError(f"a multiple-choice row needs query/choices/gold or the HF fields, got keys {sorted(r)}")
    if not 0 <= gold < len(choices):
        raise TaskDataError(f"gold {gold} out of range for {len(choices)} choices")
    context = query + ("Answer:" if query.endswith("\n") else "\nAnswer:")
    return MCItem(context, [" " + c for c in choices], choices, gold)


def hellaswag_clean(text):
    """lm-eval-harness's HellaSwag preprocessing (WikiHow bracket markers)."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag_item(r):
    if "ctx_a" in r:  # rowanz/hellaswag or HF rows
        context = r["activity_label"] + ": " + r["ctx_a"] + " " + r["ctx_b"].capitalize()
    elif "context" in r:  # a block of hellaswag_val.txt
        context = r["context"]
    else:
        raise TaskDataError(f"hellaswag: a row needs ctx_a/ctx_b or context, got keys {sorted(r)}")
    endings = [hellaswag_clean(e) for e in r["endings"]]
    gold = int(r["label"])
    if not 0 <= gold < len(endings):
        raise TaskDataError(f"hellaswag: label {gold} out of range")
    return MCItem(hellaswag_clean(context), [" " + e for e in endings], endings, gold)


def read_hellaswag_txt(path, limit=None):
    """hellaswag_val.txt: 6 lines per item (context, label, 4 endings)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise TaskDataError(f"{path}: {len(lines)} lines, not a multiple of 6 (context, label, 4 endings)")
    rows = []
    for i in range(0, len(lines), 6):
        if limit is not None and len(rows) >= limit:
            break
        if not lines[i + 1].strip().isdigit():
            raise TaskDataError(f"{path}:{i + 2}: expected the label 0-3, got {lines[i + 1]!r}")
        rows.append({"context": lines[i], "label": int(lines[i + 1]), "endings": lines[i + 2:i + 6]})
    return rows


def detokenize_ptb(text):
    """Undo the PTB-style tokenization of CBT: `` '' quotes, spaces before
    punctuation and clitics."""
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'m|'d)\b", r"\1", text, flags=re.IGNORECASE)
    text = re.sub(r" ([,.;:!?%)\]}])", r"\1", text)
    text = re.sub(r"([(\[{]) ", r"\1", text)
    return re.sub(r" {2,}", " ", text).strip()


def read_cbt_txt(path, limit=None):
    """The official CBTest format: 20 numbered story lines, the 21st
    '21 question<TAB>answer<TAB><TAB>c1|c2|...|c10', a blank line between items.
    Returns HF-shaped rows {sentences, question, answer, options}."""
    rows, sents = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            num, _, rest = line.partition(" ")
            if not num.isdigit():
                raise TaskDataError(f"{path}:{lineno}: expected a line starting with its number 1-21, "
                                    f"got {line[:40]!r}")
            if int(num) == 21:
                parts = rest.split("\t")
                if len(parts) < 3:
                    raise TaskDataError(f"{path}:{lineno}: the question line needs "
                                        "question<TAB>answer<TAB><TAB>candidates")
                rows.append({"sentences": sents, "question": parts[0].strip(), "answer": parts[1].strip(),
                             "options": [o for o in parts[-1].strip().split("|") if o]})
                sents = []
                if limit is not None and len(rows) >= limit:
                    break
            elif int(num) == len(sents) + 1:
                sents.append(rest.strip())
            else:
                raise TaskDataError(f"{path}:{lineno}: story line {num} after {len(sents)} lines")
    return rows


def cbt_item(r, group=""):
    story = " ".join(detokenize_ptb(s) for s in r["sentences"])
    question = detokenize_ptb(r["question"])
    if question.count("XXXXX") != 1:
        raise TaskDataError(f"cbt: the question must hold XXXXX once: {r['question']!r}")
    options, answer = list(r["options"]), r["answer"]
    if answer not in options:
        raise TaskDataError(f"cbt: answer {answer!r} not among the candidates {options}")
    pre, post = question.split("XXXXX")
    context = story + " " + pre if story else pre
    return MCItem(context, [o + post for o in options], options, options.index(answer), group)


def _read_rows(path, limit):
    if path.endswith(".txt"):
        return read_cbt_txt(path, limit)
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise TaskDataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from None
        rows = pq.read_table(path).to_pylist()
        return rows if limit is None else rows[:limit]
    return read_jsonl(path, limit)


def load_items(task, data_dir=None, limit=None):
    """Items of one task and a description of where they came from."""
    if limit is not None and limit < 1:
        raise ValueError("limit must be >= 1")
    if task == "lambada":
        p = _local(data_dir, "lambada_openai.jsonl", "lambada_test.jsonl")
        rows = read_jsonl(p, limit) if p else hf_rows(
            "EleutherAI/lambada_openai", "default", "test", limit, task, "lambada_openai.jsonl")
        return [lambada_item(r) for r in rows], p or "hf:EleutherAI/lambada_openai"
    if task in ("piqa", "arc_easy"):
        p = _local(data_dir, f"{task}.jsonl")
        if p:
            rows = read_jsonl(p, limit)
        elif task == "piqa":
            rows = hf_rows(("baber/piqa", "ybisk/piqa"), None, "validation", limit, task, "piqa.jsonl")
        else:
            rows = hf_rows("allenai/ai2_arc", "ARC-Easy", "test", limit, task, "arc_easy.jsonl")
        src = p or ("hf:piqa" if task == "piqa" else "hf:allenai/ai2_arc/ARC-Easy")
        return [qa_item(r) for r in rows], src
    if task == "hellaswag":
        p = _local(data_dir, "hellaswag_val.txt", "hellaswag_val.jsonl")
        if p and p.endswith(".txt"):
            rows = read_hellaswag_txt(p, limit)
        elif p:
            rows = read_jsonl(p, limit)
        else:
            rows = hf_rows("Rowan/hellaswag", None, "validation", limit, task, "hellaswag_val.txt")
        return [hellaswag_item(r) for r in rows], p or "hf:Rowan/hellaswag"
    if task == "blimp":
        files = sorted(glob.glob(os.path.join(data_dir, "blimp", "*.jsonl"))) if data_dir else []
        items = []
        if files:
            for f in files:
                name = os.path.splitext(os.path.basename(f))[0]
                items += [MCItem("", [r["sentence_good"], r["sentence_bad"]],
                                 [r["sentence_good"], r["sentence_bad"]], 0, name) for r in read_jsonl(f, limit)]
            return items, os.path.join(data_dir, "blimp")
        for name in BLIMP_PARADIGMS:
            items += [MCItem("", [r["sentence_good"], r["sentence_bad"]], [r["sentence_good"], r["sentence_bad"]],
                             0, name) for r in hf_rows("nyu-mll/blimp", name, "train", limit, task,
                                                       "blimp/<paradigm>.jsonl (the 67 files of alexwarstadt/blimp)")]
        return items, "hf:nyu-mll/blimp"
    if task == "cbt":
        items, srcs = [], []
        for sub in CBT_SUBSETS:
            cands = []
            for d in ("", "cbt", os.path.join("CBTest", "data")):
                cands += [os.path.join(d, f"cbtest_{sub}_test_2500ex.txt"), os.path.join(d, f"cbt_{sub}.jsonl"),
                          os.path.join(d, f"{sub}.jsonl") if d == "cbt" else os.path.join(d, f"cbt_{sub}_test.jsonl")]
            p = _local(data_dir, *cands)
            if p is None and data_dir is not None:  # the hub's parquet layout: cbt/CN/test-00000-of-00001.parquet
                pq = sorted(glob.glob(os.path.join(data_dir, "cbt", sub, "test-*.parquet")))
                p = pq[0] if pq else None
            if p:
                rows = _read_rows(p, limit)
            else:
                rows = hf_rows("cam-cst/cbt", sub, "test", limit, task,
                               f"cbtest_{sub}_test_2500ex.txt (from CBTest.tgz, "
                               "http://www.thespermwhale.com/jaseweston/babi/CBTest.tgz, folder CBTest/data) "
                               f"or cbt_{sub}.jsonl with the HF rows")
            items += [cbt_item(r, sub) for r in rows]
            srcs.append(p or f"hf:cam-cst/cbt/{sub}")
        return items, ", ".join(srcs)
    raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")


# -----------------------------------------------------------------------------
# tasks: items -> metrics

def _argmax(xs):
    return max(range(len(xs)), key=lambda i: (xs[i], -i))  # first of the maxima


def score_mc(items, model, encode, *, bos, block_size, device, batch_size, desc, progress=True):
    """Per item: the list of (log-likelihood, n tokens) of its continuations."""
    reqs, spans = [], []
    for it in items:
        spans.append((len(reqs), len(it.continuations)))
        reqs += [make_request(encode, it.context, c, bos) for c in it.continuations]
    res = score_requests(model, reqs, block_size=block_size, device=device, batch_size=batch_size,
                         desc=desc, progress=progress)
    return [[(res[s + j][0], res[s + j][2]) for j in range(n)] for s, n in spans]


def mc_predictions(items, scores):
    """The chosen index of every item under each rule: acc (summed log-likelihood),
    acc_norm (divided by the choice's characters), acc_norm_token (by its tokens)."""
    picks = {m: [] for m in MC_METRICS}
    for it, sc in zip(items, scores):
        ll = [s for s, _ in sc]
        picks["acc"].append(_argmax(ll))
        picks["acc_norm"].append(_argmax([s / max(len(c), 1) for s, c in zip(ll, it.choices)]))
        picks["acc_norm_token"].append(_argmax([s / max(n, 1) for s, n in sc]))
    return picks


def mc_metrics(items, scores):
    """acc, acc_norm (per character) and acc_norm_token (per token) of multiple-choice items."""
    picks = mc_predictions(items, scores)
    n = len(items)
    return {**{m: sum(p == it.gold for p, it in zip(picks[m], items)) / n for m in MC_METRICS}, "n": n}


def run_task(task, items, model, encode, *, bos=None, block_size, device="cpu", batch_size=16, progress=True):
    """Metrics of one task on its items (see the docstring for the rules)."""
    if not items:
        raise TaskDataError(f"{task}: no items")
    kw = dict(block_size=block_size, device=device, batch_size=batch_size, progress=progress)
    if task == "lambada":
        res = score_requests(model, [make_request(encode, it.context, it.target, bos) for it in items],
                             desc=task, **kw)
        lls = [r[0] for r in res]
        return {"acc": sum(r[1] for r in res) / len(res), "ppl": math.exp(-sum(lls) / len(lls)), "n": len(res)}
    scores = score_mc(items, model, encode, bos=bos, desc=task, **kw)
    if task == "blimp":
        per = {}
        for it, sc in zip(items, scores):
            per.setdefault(it.group, []).append(sc[0][0] > sc[1][0])  # log p(good) > log p(bad)
        paradigms = {k: sum(v) / len(v) for k, v in sorted(per.items())}
        return {"acc": sum(paradigms.values()) / len(paradigms), "n": len(items),
                "n_paradigms": len(paradigms), "paradigms": paradigms}
    if task == "cbt":
        per = {}
        for it, sc in zip(items, scores):
            per.setdefault(it.group, []).append(_argmax([s for s, _ in sc]) == it.gold)
        subsets = {k: sum(v) / len(v) for k, v in per.items()}
        return {"acc": sum(subsets.values()) / len(subsets), "n": len(items),
                **{f"acc_{k}": v for k, v in subsets.items()}, **{f"n_{k}": len(per[k]) for k in per}}
    if task in MC_TASKS:
        return mc_metrics(items, scores)
    raise ValueError(f"unknown task {task!r}")


def table_value(task, metrics, mc_metric="acc_norm"):
    return metrics[mc_metric] if task in MC_TASKS else metrics["acc"]


def evaluate(model, encode, tasks, *, bos=None, block_size, data_dir=None, limit=None, device="cpu",
             batch_size=16, mc_metric="acc_norm", progress=True, log=print):
    """Run the tasks; a task whose data is missing is recorded in errors and skipped."""
    results, errors = {}, {}
    for task in tasks:
        t0 = time.time()
        try:
            items, source = load_items(task, data_dir, limit)
        except TaskDataError as e:
            errors[task] = str(e)
            log(f"  {task:<10} FAILED: {e}")
            continue
        m = run_task(task, items, model, encode, bos=bos, block_size=block_size, device=device,
                     batch_size=batch_size, progress=progress)
        m["source"], m["seconds"] = source, round(time.time() - t0, 2)
        results[task] = m
        log(f"  {task:<10} {_details(task, m)}  [{time.time() - t0:.1f}s, {source}]")
    table = {t: table_value(t, results[t], mc_metric) for t in tasks if t in results}
    avg = sum(table.values()) / len(table) if table else None
    return {"results": results, "errors": errors, "table": table, "average": avg, "n_avg": len(table)}


def _details(task, m):
    if task == "lambada":
        return f"acc {100 * m['acc']:.2f}  ppl {m['ppl']:.2f}  n={m['n']}"
    if task == "blimp":
        return f"acc {100 * m['acc']:.2f}  ({m['n_paradigms']} paradigms)  n={m['n']}"
    if task == "cbt":
        subs = "  ".join(f"{k} {100 * m['acc_' + k]:.2f}" for k in CBT_SUBSETS if "acc_" + k in m)
        return f"acc {100 * m['acc']:.2f}  ({subs})  n={m['n']}"
    return "  ".join(f"{k} {100 * m[k]:.2f}" for k in MC_METRICS) + f"  n={m['n']}"


def format_table(rows, tasks, mc_metric):
    """rows: (label, evaluate() output). A markdown table in the paper's layout."""
    head = ["Model"] + [TABLE_NAMES[t] for t in tasks] + ["Avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    notes = []
    for label, r in rows:
        cells = [f"{100 * r['table'][t]:.1f}" if t in r["table"] else "-" for t in tasks]
        avg = "-" if r["average"] is None else f"{100 * r['average']:.1f}"
        if r["average"] is not None and r["n_avg"] < len(TASKS):
            avg += "*"
            notes.append(f"* {label}: average over {r['n_avg']} of the {len(TASKS)} tasks")
        lines.append("| " + " | ".join([label] + cells + [avg]) + " |")
    metric = f"HellaSwag/PIQA/ARC-E: {mc_metric}"
    return "\n".join(lines + notes + [f"(zero-shot accuracy in %; {metric})"])


# -----------------------------------------------------------------------------
# CLI

def _tasks_arg(s):
    if s.strip() == "all":
        return list(TASKS)
    names = [t.strip().lower().replace("-", "_") for t in s.split(",") if t.strip()]
    bad = [t for t in names if t not in TASKS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {bad or s!r}; choose from {','.join(TASKS)} or all")
    return list(dict.fromkeys(names))


def _positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", nargs="+", required=True,
                   help="checkpoint path(s) written by train.py; one table row each")
    p.add_argument("--tasks", type=_tasks_arg, default=list(TASKS), help="comma-separated subset of "
                   f"{','.join(TASKS)}, or all (default)")
    p.add_argument("--data_dir", default=None, help="folder with local copies of the data (see Data above)")
    p.add_argument("--limit", type=_positive, default=None,
                   help="first N items per task (BLiMP: per paradigm, CBT: per subset)")
    p.add_argument("--json", default=None, help="write all metrics to this JSON file")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--batch_size", type=_positive, default=None, help="sequences per forward pass "
                   "(default 32 on CUDA, 8 on CPU)")
    p.add_argument("--mc_metric", choices=MC_METRICS, default="acc_norm",
                   help="HellaSwag/PIQA/ARC-E metric in the table (default acc_norm, per character)")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)

    from model import load_checkpoint
    from sample import load_codec

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    batch_size = args.batch_size or (32 if device.startswith("cuda") else 8)
    rows, report = [], {"tasks": args.tasks, "limit": args.limit, "data_dir": args.data_dir, "device": device,
                        "batch_size": batch_size, "mc_metric": args.mc_metric, "models": []}
    for path in args.ckpt:
        if not os.path.isfile(path):
            print(f"error: checkpoint {path} not found", file=sys.stderr)
            report["models"].append({"ckpt": path, "error": "not found"})
            continue
        model, ckpt = load_checkpoint(path, device=device)
        meta = ckpt.get("meta") or {}
        encode, _ = load_codec(meta)
        bos = GPT2_EOT if meta.get("tokenizer") == "gpt2" else None
        cfg = model.config
        n_params = model.get_num_params()
        label = f"{POS_NAMES.get(cfg.pos_emb, cfg.pos_emb)} {n_params / 1e6:.0f}M"
        if any(a == label for a, _ in rows):
            label += f" ({path})"
        print(f"{label}: {path}, block_size {cfg.block_size}, device {device}")
        r = evaluate(model, encode, args.tasks, bos=bos, block_size=cfg.block_size, data_dir=args.data_dir,
                     limit=args.limit, device=device, batch_size=batch_size, mc_metric=args.mc_metric,
                     progress=not args.no_progress)
        rows.append((label, r))
        report["models"].append({"ckpt": path, "label": label, "pos_emb": cfg.pos_emb, "n_params": n_params,
                                 "block_size": cfg.block_size, **r})
        del model, ckpt
    if rows:
        print()
        print(format_table(rows, args.tasks, args.mc_metric))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    ok = bool(rows) and len(rows) == len(args.ckpt) and all(r["results"] for _, r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
