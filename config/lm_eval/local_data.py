"""Loaders for the offline copies of the eval data (eval_downstream.py --data_dir DIR).

The local_*.yaml groups in this folder take the harness's own tasks and replace
only their data source: the harness calls custom_dataset(**metadata,
**dataset_kwargs), metadata holding data_dir. Each loader returns a DatasetDict
with the fields of the task's Hugging Face dataset, so the harness's prompts
(doc_to_text, doc_to_choice, process_docs) and metrics apply unchanged. With
metadata limit=N only the first N rows are kept: the ones the harness's --limit
takes anyway (these tasks neither shuffle nor filter), without converting the rest.
File formats: $POPE_SHARED_DATA/README.md; a missing file raises "no data: ..."."""
import json
import os
import re

import datasets


def _path(data_dir, *names):
    for name in names:
        if data_dir and os.path.isfile(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    raise FileNotFoundError(f"no data: none of {', '.join(names)} in {data_dir}")


def _jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _dd(split, rows, limit=None):
    data = datasets.Dataset.from_list(rows[:limit] if limit else rows)
    return datasets.DatasetDict({split: data})


def lambada(data_dir=None, limit=None, **_):
    """llm-foundry rows {context, continuation} -> EleutherAI/lambada_openai {text}."""
    rows = _jsonl(_path(data_dir, "lambada_openai.jsonl"))
    rows = [r if "text" in r else {"text": r["context"] + " " + r["continuation"]} for r in rows]
    return _dd("test", rows, limit)


def blimp(data_dir=None, paradigm=None, limit=None, **_):
    """The original BLiMP files are the nyu-mll/blimp rows."""
    return _dd("train", _jsonl(_path(data_dir, f"blimp/{paradigm}.jsonl")), limit)


def piqa(data_dir=None, limit=None, **_):
    """llm-foundry {query: "Question: <goal>\\n", choices, gold} -> {goal, sol1, sol2, label}."""
    rows = _jsonl(_path(data_dir, "piqa.jsonl"))
    return _dd("validation", [{"goal": r["query"].removeprefix("Question: ").removesuffix("\n"),
                               "sol1": r["choices"][0], "sol2": r["choices"][1],
                               "label": int(r["gold"])}
                              for r in rows], limit)


def arc(data_dir=None, file="arc_easy.jsonl", limit=None, **_):
    """llm-foundry {query: "Question: <q>", choices, gold} -> allenai/ai2_arc
    {id, question, choices: {text, label}, answerKey} (labels A, B, C, ...)."""
    out = []
    for i, r in enumerate(_jsonl(_path(data_dir, file))):
        labels = [chr(65 + j) for j in range(len(r["choices"]))]
        out.append({"id": str(i), "question": r["query"].removeprefix("Question: "),
                    "choices": {"text": list(r["choices"]), "label": labels},
                    "answerKey": labels[int(r["gold"])]})
    return _dd("test", out, limit)


def hellaswag_rows(path):
    """hellaswag_val.txt (6 lines per item: "<activity_label>: <ctx>", label, 4
    endings) -> Rowan/hellaswag rows. The file joined ctx_a + " " + ctx_b (ctx_b
    lower-case; the harness capitalizes it): ctx_b is taken to be the text after
    the last sentence end if it neither starts with a capital nor holds one more
    sentence end (3,246 of 10,042 items), else "". The cleanup of [title] etc. is
    the harness's already. ind is the line's item number; source_id and
    split_type are not in the file (the harness uses neither)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{path}: {len(lines)} lines, not 6 per item")
    rows = []
    for i in range(0, len(lines), 6):
        label, _, ctx = lines[i].partition(": ")
        m = re.match(r"(.*[.!?][\"')]*) ([^A-Z][^.!?]*)$", ctx)
        ctx_a, ctx_b = (m.group(1), m.group(2)) if m else (ctx, "")
        rows.append({"ind": i // 6, "activity_label": label, "ctx_a": ctx_a, "ctx_b": ctx_b,
                     "ctx": ctx, "endings": lines[i + 2:i + 6], "label": lines[i + 1].strip(),
                     "split": "val"})
    return rows


def hellaswag(data_dir=None, limit=None, **_):
    return _dd("validation", hellaswag_rows(_path(data_dir, "hellaswag_val.txt")), limit)


def cbt_rows(path):
    """The official CBTest text (cbtest_XX_test_2500ex.txt: story lines "1 ..."
    to "20 ...", then "21 question<TAB>answer<TAB><TAB>c1|...|c10") -> cam-cst/cbt
    rows {sentences, question, answer, options}."""
    rows, sents = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            num, _, rest = line.rstrip("\n").partition(" ")
            if num == "21":
                q, answer, *_, options = rest.split("\t")
                rows.append({"sentences": sents, "question": q.strip(), "answer": answer.strip(),
                             "options": [o for o in options.strip().split("|") if o]})
                sents = []
            elif num.isdigit():
                sents.append(rest.strip())
    return rows


def cbt(data_dir=None, subset="CN", limit=None, **_):
    """cbtest_{CN,NE}_test_2500ex.txt (from CBTest.tgz, folder CBTest/data) or
    cbt_{CN,NE}.jsonl with the cam-cst/cbt rows, in DIR, DIR/cbt or DIR/CBTest/data."""
    names = [os.path.join(d, n) for d in ("", "cbt", "CBTest/data")
             for n in (f"cbtest_{subset}_test_2500ex.txt", f"cbt_{subset}.jsonl")]
    p = _path(data_dir, *names)
    return _dd("test", cbt_rows(p) if p.endswith(".txt") else _jsonl(p), limit)
