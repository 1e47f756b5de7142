"""OpenWebText (or any English text) as GPT-2 BPE tokens, nanoGPT style.

Usage:
    python prepare/openwebtext.py --input $POPE_SHARED_DATA/text/owt_sample.jsonl
    python prepare/openwebtext.py --input $POPE_SHARED_DATA/text/english --out_dir data/english
    python prepare/openwebtext.py  # HF dataset Skylion007/openwebtext (needs `datasets` + network)
    python prepare/openwebtext.py --input A.jsonl B.txt --val_input C.txt --out_dir data/mine

Source: the HF dataset "Skylion007/openwebtext" (the one nanoGPT loads as
"openwebtext"), 8,013,769 documents, read from the Hub's parquet conversion
(--hf_revision refs/convert/parquet: its loading script runs on `datasets` < 4 only).
tiktoken downloads its gpt2 files once; offline, point TIKTOKEN_CACHE_DIR at a
copy. Offline, pass the documents with --input:
  - .jsonl / .json files with one {"text": ...} object per line (--text_field),
  - .txt files, cut into documents at --txt_doc_sep (default "\\n\\n\\n",
    two blank lines, the separator of $POPE_SHARED_DATA/text/english; pass ""
    for one document per file),
  - or a folder: every .jsonl/.json/.txt file under it, in sorted path order.

Tokenization: tiktoken "gpt2" (vocab 50257), encode_ordinary of each
document followed by <|endoftext|> (50256), on --num_proc worker processes
(multiprocessing Pool, ordered results, so the output does not depend on the
number of workers). Written as uint16, meta {"tokenizer": "gpt2"}.

Split (nanoGPT's val fraction 0.0005 and seed 2357): with n documents,
numpy default_rng(2357).permutation(n) is drawn and its first
ceil(0.0005 * n) documents form val, the rest train. The ceiling keeps val
non-empty for any input of at least 2 documents (the 1,000-document sample
gets exactly 1 val document); fewer than 2 documents is an error. Within
each split the documents keep their input order. There is no test split.
With --val_input the split is by source instead: every --input document goes
to train and every --val_input document to val (a held-out corpus, e.g. long
documents for eval_extrapolation.py).
"""

import itertools
import json
import math
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "openwebtext"
HF_ID = "Skylion007/openwebtext"
HF_DOCS = 8_013_769
VAL_FRACTION = 0.0005
SEED = 2357
EOT = 50256
TEXT_SUFFIXES = (".jsonl", ".json", ".txt")
BATCH_DOCS = 4096  # documents in flight at once

_ENC = None


def get_encoding():
    return common.gpt2_encoding()


def _init_worker():
    global _ENC
    _ENC = get_encoding()


def _encode(text):
    ids = _ENC.encode_ordinary(text)
    ids.append(EOT)
    return np.array(ids, dtype=np.uint16)


def encode(text, meta=None):
    return get_encoding().encode_ordinary(text)


def decode(ids, meta=None):
    return get_encoding().decode([int(i) for i in ids])


# -----------------------------------------------------------------------------
# documents

def input_files(path):
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*")
                       if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise common.PrepareError(f"no .jsonl/.json/.txt file under {path}")
        return files
    if not path.exists():
        raise common.PrepareError(f"--input {path} does not exist")
    if path.suffix.lower() not in TEXT_SUFFIXES:
        raise common.PrepareError(f"--input {path}: expected .jsonl, .json or .txt")
    return [path]


def iter_documents(files, text_field="text", txt_doc_sep="\n\n\n"):
    """Yield every document's text, in file order."""
    for path in files:
        if path.suffix.lower() == ".txt":
            text = common.utf8(path.read_bytes(), path)
            if txt_doc_sep:
                text = text.rstrip("\n")
                docs = text.split(txt_doc_sep) if text else []
            else:
                docs = [text] if text else []
            yield from (d for d in docs if d.strip())
        else:
            with open(path, "rb") as f:
                offset = 0
                for lineno, raw in enumerate(f, 1):
                    line = common.utf8(raw, path, offset)
                    offset += len(raw)
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise common.PrepareError(f"{path}:{lineno}: not a JSON line ({e})") from e
                    if not isinstance(obj, dict) or text_field not in obj:
                        raise common.PrepareError(f"{path}:{lineno}: no '{text_field}' field")
                    yield obj[text_field]


def count_documents(files, text_field, txt_doc_sep):
    return sum(1 for _ in iter_documents(files, text_field, txt_doc_sep))


def val_documents(n, fraction=VAL_FRACTION, seed=SEED):
    """Boolean array: True for the documents that go to val."""
    if n < 2:
        raise common.PrepareError(f"need at least 2 documents to split train/val, found {n}")
    n_val = min(n - 1, math.ceil(fraction * n))
    is_val = np.zeros(n, dtype=bool)
    is_val[np.random.default_rng(seed).permutation(n)[:n_val]] = True
    return is_val


def hf_documents(revision):
    """(count, iterator) over HF_ID at revision, by default the Hub's parquet conversion (the
    dataset's loading script runs on `datasets` < 4 only; parquet files load on 3 and 4). Offline:
    a PrepareError."""
    hint = (f"Offline, pass a local copy of {HF_ID} (.jsonl with a 'text' field) or any "
            ".txt/.jsonl text with --input FILE_OR_DIR "
            "(e.g. --input $POPE_SHARED_DATA/text/owt_sample.jsonl)")
    datasets = common.require("datasets", "datasets", f"downloading {HF_ID}")
    import socket
    try:  # the Hub unreachable: only HF's local cache, instead of a minute of retries
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        ds = datasets.load_dataset(HF_ID, revision=revision, split="train")
    except Exception as e:  # (no network: ConnectionError, or datasets' own errors)
        raise common.PrepareError(
            f"could not load {HF_ID} ({type(e).__name__}: {e}). {hint}") from e
    if len(ds) != HF_DOCS:  # (the Hub converts only the first GBs of some large datasets)
        common.log(
            f"warning: {HF_ID}@{revision} holds {len(ds):,} documents, not OpenWebText's "
            f"{HF_DOCS:,} (a partial conversion?); another --hf_revision, or --input, gives the "
            "whole set")
    return len(ds), (row["text"] for row in ds)


# -----------------------------------------------------------------------------
# main

def build_parser():
    p = common.script_parser(
        __doc__,
        NAME,
        nargs="+",
        help=f".jsonl/.json/.txt files or folders of them (without it: HF {HF_ID})",
    )
    p.add_argument("--val_input", nargs="+",
                   help="files or folders whose documents form val "
                        "(all of --input then goes to train)")
    p.add_argument("--hf_revision", default="refs/convert/parquet",
                   help=f"the revision of {HF_ID} read without --input "
                        "(default: the Hub's parquet conversion)")
    p.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                   help="tokenizer workers")
    p.add_argument("--text_field", default="text",
                   help="JSON field holding the text (default text)")
    p.add_argument("--txt_doc_sep", default="\n\n\n",
                   help="document separator in .txt files ('' = a file)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    get_encoding()  # fail before any work if the BPE files are missing

    def local(paths):
        """(files, document count, source names) of local input paths."""
        found = [(path, f) for path in paths for f in input_files(path)]
        files = [f for _, f in found]
        names = [str(f.relative_to(path)) if Path(path).is_dir() else f.name for path, f in found]
        return files, count_documents(files, args.text_field, args.txt_doc_sep), names

    # (a bad out_dir: refused before reading the input)
    with common.staged_dataset(args.out_dir) as stage:
        if args.input is None:
            n_docs, docs = hf_documents(args.hf_revision)
            source = f"{HF_ID}@{args.hf_revision}"
        else:
            files, n_docs, source = local(args.input)
            if n_docs == 0:
                raise common.PrepareError(f"no documents in {' '.join(args.input)} (empty input)")
            docs = iter_documents(files, args.text_field, args.txt_doc_sep)
        if args.val_input is None:
            is_val = val_documents(n_docs)
            val_source = None
        else:
            vfiles, n_val, val_source = local(args.val_input)
            if n_val == 0:
                raise common.PrepareError(f"no documents in --val_input {' '.join(args.val_input)}")
            docs = itertools.chain(docs, iter_documents(vfiles, args.text_field, args.txt_doc_sep))
            is_val = np.concatenate([np.zeros(n_docs, dtype=bool), np.ones(n_val, dtype=bool)])
            n_docs += n_val
        counts, ndoc = write_splits(stage, docs, is_val, args.num_proc)
        meta = {
            "format": NAME,
            "prepare": common.command_line(NAME, build_parser(), args),
            "tokenizer": "gpt2",
            "vocab_size": 50257,
            "dtype": "uint16",
            "eot_id": EOT,
            "documents": ndoc,
            "tokens": counts,
            "source": source,
        }
        if val_source is None:
            meta.update(val_fraction=VAL_FRACTION, seed=SEED)
        else:
            meta["val_source"] = val_source
        common.write_meta(stage, meta)
    common.report(args.out_dir, counts,
                  {s: f"{ndoc[s]:,} document{'s' * (ndoc[s] != 1)}" for s in counts})
    return counts


def write_splits(stage, docs, is_val, num_proc):
    """Tokenize docs on num_proc workers (in input order) into stage/{train,val}.bin."""
    import multiprocessing as mp
    ndoc, n_docs = {"train": 0, "val": 0}, len(is_val)
    with common.split_writers(stage, ("train", "val")) as writers, \
            mp.get_context("spawn").Pool(max(1, num_proc), initializer=_init_worker) as pool, \
            common.progress(total=n_docs, desc="tokenizing", unit="doc") as bar:
        # bounded batches: Pool.imap would read the whole input ahead into memory
        i = 0
        for batch in iter(lambda: list(itertools.islice(docs, BATCH_DOCS)), []):
            for ids in pool.imap(_encode, batch, chunksize=16):
                split = "val" if i < n_docs and is_val[i] else "train"
                writers[split].write(ids)
                ndoc[split] += 1
                i += 1
            bar.update(len(batch))
    if sum(ndoc.values()) != n_docs:  # (the input changed while it was read)
        raise common.PrepareError(f"read {sum(ndoc.values())} documents, expected {n_docs}")
    return {s: w.count for s, w in writers.items()}, ndoc


if __name__ == "__main__":
    common.run_main(main)
