"""Shared helpers of the prepare/ scripts, train.py and the eval scripts: a dataset's
{split}.bin + meta.json written as a set (staged_dataset), the command that rebuilds it,
the check train.py runs on it (check_dataset), token readers and one-line errors."""

import argparse
import importlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
SPLITS = ("train", "val", "test")
DOWNLOADS = "raw"  # out_dir/raw/: a script's download cache, kept across runs
DATASET_FILES = frozenset(["meta.json"] + [f"{s}{x}.bin" for s in SPLITS for x in ("", "_mask")])


class PrepareError(Exception):
    """A user's mistake (bad input, a missing package, no network): one line 'error: ...', exit 2."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def run_main(main_fn, argv=None):
    """main_fn(argv), with a PrepareError or a file error (OSError) as one line and exit 2."""
    try:
        main_fn(argv)
    except PrepareError as e:
        die(e)
    except OSError as e:
        die(f"{f'{e.filename}: ' if e.filename else ''}{e.strerror or e}")


def require(module, pip_name, purpose):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PrepareError(f"{purpose} needs the Python package '{pip_name}' (pip install {pip_name})") from e


def progress(iterable=None, total=None, desc="", unit="it"):
    from tqdm import tqdm  # (here: importing a prepare module stays light)
    return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit != "it", mininterval=1.0,
                file=sys.stderr)


def default_out_dir(name):
    return REPO_ROOT / "data" / name


def script_parser(doc, name, **input_kwargs):
    """A prepare script's parser: doc as its description, --input (input_kwargs) and --out_dir."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if input_kwargs:
        p.add_argument("--input", **input_kwargs)
    p.add_argument("--out_dir", default=str(default_out_dir(name)), help=f"(default data/{name})")
    return p


def gpt2_encoding():
    tiktoken = require("tiktoken", "tiktoken", "GPT-2 tokenization")
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline without the cached BPE files
        raise PrepareError(f"tiktoken could not load the gpt2 encoding ({type(e).__name__}; offline?): point "
                           "TIKTOKEN_CACHE_DIR at a folder holding its files") from e


def codec(meta):
    """(encode, decode) for a meta.json: GPT-2 BPE ("tokenizer": "gpt2") or a list of token strings
    ("itos"). encode raises ValueError for text the vocabulary cannot express."""
    if meta.get("tokenizer") == "gpt2":
        enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    if "itos" not in meta:
        raise ValueError("meta.json needs either \"tokenizer\": \"gpt2\" or an \"itos\" list")
    itos = meta["itos"]
    stoi = {s: i for i, s in enumerate(itos)}

    def encode(s):
        if any(len(t) != 1 for t in itos):
            raise ValueError("this vocabulary has multi-character tokens; give the prompt as token ids")
        if bad := sorted(set(s) - set(stoi)):
            raise ValueError(f"characters {bad} are not in the vocabulary ({''.join(itos)!r})")
        return [stoi[c] for c in s]
    return encode, lambda ids: "".join(itos[i] for i in ids)


def check_writable(path, option):
    """Refuse (PrepareError), before any slow work, a path that is a folder or cannot be written."""
    p = Path(os.path.abspath(path))
    if p.is_dir():
        raise PrepareError(f"{option} {path} is a folder; give a file name")
    folder = next(f for f in p.parents if os.path.lexists(f))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-check-")
    except OSError as e:
        raise PrepareError(f"{option} {path}: cannot write into {folder} ({e.strerror or e}); "
                           "give a path in a writable folder") from None
    os.close(fd)
    os.unlink(tmp)


def write_atomic(path, save):
    """save(tmp), then rename tmp to path: no half-written file, a crash leaves the old one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    try:
        save(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path, obj, indent=1, default=None):
    write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=indent, default=default)))


_LOCKS = {}  # lock file -> (fd, pid), held until unlock_folder or the process's end


def lock_folder(folder, hint, path=None):
    """One writer per folder: an exclusive flock on path (default folder/.lock) that the OS drops however
    the process ends; unlock_folder or a normal exit deletes the file. PrepareError when another holds it."""
    import atexit
    import fcntl
    path = str(path or os.path.join(folder, ".lock"))
    while path not in _LOCKS:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 16, 0).decode(errors="replace").strip() or "?"  # (the PID its holder wrote)
            os.close(fd)
            raise PrepareError(f"{folder} is in use by another run (pid {pid} holds {path}); {hint}") \
                from None
        except OSError as e:
            raise PrepareError(f"cannot create {path} ({e.strerror}): its folder must be writable") from None
        if os.path.exists(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            _LOCKS[path] = (fd, os.getpid())
            atexit.register(unlock_folder, folder, path)
        else:  # its holder ended and deleted the file we opened: lock the file at path now
            os.close(fd)


def unlock_folder(folder, path=None):
    path = str(path or os.path.join(folder, ".lock"))
    fd, pid = _LOCKS.get(path, (None, None))
    if pid == os.getpid():
        del _LOCKS[path]
        if os.path.exists(path):  # (ours while we hold the lock)
            os.remove(path)
        os.close(fd)


class BinWriter:
    """Appends token ids to a file of one dtype (in the staging folder); .count: the ids written."""

    def __init__(self, path, dtype):
        self.f, self.dtype, self.count = open(path, "wb"), np.dtype(dtype), 0

    def write(self, arr):
        a = np.asarray(arr)
        if a.size and (a.min() < 0 or a.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token ids out of range for {self.dtype} in {self.f.name}")
        self.f.write(a.astype(self.dtype).tobytes())
        self.count += a.size


@contextmanager
def split_writers(out_dir, splits, dtype=np.uint16):
    """{split: BinWriter} for out_dir/{split}.bin, closed on leaving the block."""
    writers = {s: BinWriter(Path(out_dir) / f"{s}.bin", dtype) for s in splits}
    try:
        yield writers
    finally:
        for w in writers.values():
            w.f.close()


def write_bin(path, arr, dtype):
    w = BinWriter(path, dtype)
    w.write(arr)
    w.f.close()
    return w.count


def write_meta(out_dir, meta):
    """meta.json with sorted keys and a trailing newline: the same bytes on a re-run."""
    text = json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_atomic(Path(out_dir) / "meta.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def load_meta(out_dir):
    return json.loads((Path(out_dir) / "meta.json").read_text(encoding="utf-8"))


def report(out_dir, counts, extra=None):
    print(f"wrote {out_dir}")
    for split, n in counts.items():
        print(f"  {split}: {n:,} tokens" + (f" ({extra[split]})" if extra and split in extra else ""))


# A dataset is written as a set: into <out_dir>.tmp beside it, then swapped in by two renames
# (out_dir -> <out_dir>.old, <out_dir>.tmp -> out_dir), so that out_dir holds the old set or the
# new one, never a mix. A run killed between the renames leaves <out_dir>.old: the next run puts
# it back first. A re-run replaces the whole folder, so a user's own files in it are refused.

def _check_target(target):
    if os.path.lexists(target) and not target.is_dir():
        raise PrepareError(f"--out_dir {target} exists and is not a folder")
    foreign = [p.name for p in sorted(target.iterdir()) if p.is_symlink() or not (p.name == DOWNLOADS or (
        p.is_file() and p.name.removesuffix(".tmp") in DATASET_FILES))] if target.is_dir() else []
    if foreign:
        raise PrepareError(f"--out_dir {target} holds files that are not part of a dataset: "
                           f"{', '.join(foreign)}; move them away or pick another --out_dir")


@contextmanager
def staged_dataset(out_dir):
    """Yields the staging folder for every .bin and meta.json; leaving the block normally swaps it in
    (with out_dir/raw/), an error deletes it. One run per out_dir: a lock beside it."""
    target = Path(os.path.realpath(out_dir))  # (a symlinked data folder stays a link)
    _check_target(target)
    stage, old, lock = (target.with_name(f"{target.name}.{x}") for x in ("tmp", "old", "lock"))
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_folder(target, "wait for it to finish", lock)
    made = False
    try:
        for p in (old, stage):
            _check_target(p)  # (not a folder of a user's that bears the name)
        if old.is_dir() and not os.path.lexists(target):
            os.rename(old, target)  # (a run killed between the renames)
        for p in (old, stage):
            shutil.rmtree(p, ignore_errors=True)
        stage.mkdir()
        made = True
        yield stage
        if os.path.lexists(target):
            _check_target(target)  # (again: files may have come while the script ran)
            if (target / DOWNLOADS).is_dir():
                os.rename(target / DOWNLOADS, stage / DOWNLOADS)
            os.rename(target, old)
        os.rename(stage, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if made:
            shutil.rmtree(stage, ignore_errors=True)
        unlock_folder(target, lock)


def repo_path(path):
    """path as a command run from the repo root takes it: relative in or beside the repo."""
    rel = os.path.relpath(os.path.abspath(path), REPO_ROOT)
    return os.path.abspath(path) if Path(rel).parts[:2] == (os.pardir, os.pardir) else rel


def command_line(script, parser, args, defaults=None, skip=("num_proc",),
                 paths=("input", "val_input", "out_dir")):
    """`python prepare/<script>.py` and each option of args that differs from its default (defaults
    overrides the parser's), --out_dir last, paths as repo_path gives them, quoted for a POSIX shell.
    The options in skip do not change the output (worker counts)."""
    parts = ["python", f"prepare/{script}.py"]
    norm = lambda v: [repo_path(x) for x in v] if isinstance(v, list) else v and repo_path(v)  # noqa: E731
    for dest, value in sorted(vars(args).items(), key=lambda kv: kv[0] == "out_dir"):
        default = (defaults or {}).get(dest, parser.get_default(dest))
        if dest in paths:
            value, default = norm(value), norm(default)
        if dest not in skip and value is not None and value != default:
            parts += [f"--{dest}"] + ([] if value is True else list(map(str, value if isinstance(value, list)
                                                                         else [value])))
    return shlex.join(parts)


PREPARE_COMMANDS = {  # beyond `python prepare/<name>.py`, for a folder without a readable meta.json
    "indirect_indexing_quick": "python prepare/indirect_indexing.py --quick",
    "english": ("python prepare/openwebtext.py --out_dir data/english --input $POPE_SHARED_DATA/text/"
                "owt_sample.jsonl $POPE_SHARED_DATA/text/english/{abc,brown,inaugural,movie_reviews,"
                "tinyshakespeare,webtext}.txt --val_input $POPE_SHARED_DATA/text/english/state_union.txt"),
}


def prepare_scripts():
    return sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in ("__init__", "common"))


def _rebuild_hint(d, meta):
    if isinstance(meta, dict) and isinstance(meta.get("prepare"), str):
        return f"rebuild it with: {meta['prepare']}"
    cmd = PREPARE_COMMANDS.get(d.name) or d.name in prepare_scripts() and f"python prepare/{d.name}.py"
    if not cmd:
        return (f"no prepare command is known for a dataset named {d.name!r}; the prepare scripts are "
                + ", ".join(f"python prepare/{s}.py" for s in prepare_scripts()))
    if d.absolute() != default_out_dir(d.name):
        out = "--out_dir " + shlex.quote(repo_path(d))
        cmd = re.sub(r"--out_dir \S+", lambda _: out, cmd) if "--out_dir" in cmd else f"{cmd} {out}"
    return f"rebuild it with: {cmd}"


CHECK_CHUNK = 1 << 26  # tokens read at a time by the scans (memory stays small)


def check_dataset(data_dir, splits=("train", "val"), scan=True):
    """The dataset's meta.json as a dict, once what training relies on holds: an integer vocab_size and an
    unsigned dtype that holds its ids (none means uint16); for each split a {split}.bin of whole tokens,
    not empty, meta["tokens"][split] of them when recorded, whole rows of row_len, a {split}_mask.bin (if
    any) as long; with scan, every id < vocab_size and some token scored. Else a one-line PrepareError
    naming the file and the command that rebuilds the dataset."""
    d, meta = Path(os.path.abspath(data_dir)), None
    mp = d / "meta.json"

    def fail(path, what):
        raise PrepareError(f"{path}: {what}; {_rebuild_hint(d, meta)}".replace("\n", " "))

    if not mp.is_file():
        fail(mp if d.is_dir() else d, "missing" if d.is_dir() else "no such dataset folder")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except ValueError as e:  # (UnicodeDecodeError too)
        fail(mp, f"not valid JSON ({e})")
    if not isinstance(meta, dict):
        fail(mp, f"holds a JSON {type(meta).__name__}, not an object")
    V, name = meta.get("vocab_size"), meta.setdefault("dtype", "uint16")
    row_len, tokens = meta.get("row_len"), meta.get("tokens") or {}
    try:
        dtype = np.dtype(name) if isinstance(name, str) else None
    except TypeError:
        dtype = None
    if type(V) is not int or V < 1:
        fail(mp, f"vocab_size is {V!r}, expected an integer >= 1")
    if dtype is None or dtype.kind != "u" or V - 1 > np.iinfo(dtype).max:
        fail(mp, f"dtype is {name!r}, expected an unsigned integer type such as uint16 or uint32 (one that "
             f"holds the ids 0..{V - 1})")
    for split in splits:
        path, mpath = d / f"{split}.bin", d / f"{split}_mask.bin"
        if not path.is_file():
            fail(path, "missing")
        size = path.stat().st_size
        n = size // dtype.itemsize
        if size % dtype.itemsize or n == 0:
            fail(path, "empty (0 tokens)" if size == 0 else
                 f"{size:,} bytes, not a multiple of {dtype.itemsize} (the size of a {dtype.name} token)")
        if split in tokens and n != tokens[split]:
            fail(path, f"holds {n:,} tokens but meta.json records {tokens[split]!r} (files from different "
                 "runs?)")
        if row_len and n % row_len:
            fail(path, f"holds {n:,} tokens, not a multiple of row_len {row_len}")
        if mpath.exists() and mpath.stat().st_size != n:
            fail(mpath, f"holds {mpath.stat().st_size:,} entries but {path.name} holds {n:,} tokens")
        if scan:
            mm = np.memmap(path, dtype=dtype, mode="r")
            if (top := max(int(mm[i:i + CHECK_CHUNK].max()) for i in range(0, n, CHECK_CHUNK))) >= V:
                fail(path, f"token id {top} is >= vocab_size {V}")
            mask = np.memmap(mpath, dtype=np.uint8, mode="r") if mpath.exists() else None
            if mask is not None and not any(mask[i:i + CHECK_CHUNK].any() for i in range(0, n, CHECK_CHUNK)):
                fail(mpath, "scores no token (all zeros)")
    return meta


# -----------------------------------------------------------------------------
# the tokens an eval script scores (eval_extrapolation.py, eval_frequencies.py)

def vocab_key(meta):
    """Which tokenizer a meta.json describes: "gpt2", its character list (as JSON), or None."""
    return "gpt2" if meta.get("tokenizer") == "gpt2" else json.dumps(meta["itos"]) if "itos" in meta else None


def _text_chunks(path, chunk_chars):
    """A text file in pieces cut after a "\\n" between non-spaces: the pieces tokenize as the whole file."""
    buf = ""
    with open(path, encoding="utf-8") as f:
        while piece := f.read(chunk_chars):
            buf += piece
            if cut := max((m.end() for m in re.finditer(r"\S\n(?=\S)", buf)), default=0):
                yield buf[:cut]
                buf = buf[cut:]
    if buf:
        yield buf


def _jsonl_docs(path):
    with open(path, encoding="utf-8") as f:
        for lineno, line in filter(lambda x: x[1].strip(), enumerate(f, 1)):
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise PrepareError(f'{path}:{lineno}: expected an object with a "text" string')
            yield doc["text"]


def read_tokens(path, meta, need, ckpt="the checkpoint", docs=None, chunk_chars=1 << 20, dataset=None):
    """The token ids at path for a checkpoint whose training data had the meta.json meta: X.bin, a prepared
    split, as a memmap (checked as check_dataset checks it, and refused for another tokenizer), or up to
    `need` ids (int64) of text tokenized with meta's tokenizer: X.txt as one text, the documents of X.jsonl
    or of the iterable docs each ending as in the training data. Else a one-line PrepareError."""
    kind = "docs" if docs is not None else os.path.splitext(path)[1].lower()
    if kind not in ("docs", ".bin", ".txt", ".jsonl"):
        raise PrepareError(f"{path}: give a prepared split X.bin, a text X.txt or documents X.jsonl")
    if kind != "docs" and not os.path.isfile(path):
        raise PrepareError(f"data file {path} not found")
    if kind == ".bin":
        folder = Path(os.path.abspath(path)).parent
        if not (folder / "meta.json").is_file():
            raise PrepareError(f"{path}: no meta.json beside it ({folder / 'meta.json'}); prepare/ writes "
                               "each X.bin with a meta.json")
        data_meta = check_dataset(folder, (os.path.basename(path)[:-4],), scan=False)
        a, b = vocab_key(data_meta), vocab_key(meta)
        if a and b and a != b:
            name = lambda k: "gpt2" if k == "gpt2" else "characters"  # noqa: E731
            raise PrepareError(f"{path} was tokenized with a different vocabulary than {ckpt}'s training "
                               f"data ({name(a)} vs {name(b)}); give data of its dataset")
        if os.path.isfile(path[:-4] + "_mask.bin"):
            log(f"note: the loss mask of {path} is ignored: every token is scored")
        return np.memmap(path, dtype=np.dtype(data_meta["dtype"]), mode="r")
    if vocab_key(meta) != "gpt2" and any(len(s) != 1 for s in meta.get("itos", ())):
        raise PrepareError(f"{path}: cannot tokenize text with {ckpt}'s vocabulary (it has multi-character "
                           f"tokens, e.g. JSB's); pass a prepared .bin of that model's dataset, e.g. --data "
                           f"data/{dataset or '<dataset>'}/val.bin")
    try:
        encode, _ = codec(meta)
    except ValueError:
        raise PrepareError(f'{ckpt} has no tokenizer in its meta ("tokenizer": "gpt2" or "itos"); give '
                           "token ids as a .bin") from None
    gpt2 = vocab_key(meta) == "gpt2"
    sep = []
    if kind != ".txt" and (gpt2 or "\n" in meta["itos"]):  # each document ends as in the training data
        sep = encode("<|endoftext|>" if gpt2 else "\n\n")
    if kind in (".txt", ".jsonl"):
        docs = _text_chunks(path, chunk_chars) if kind == ".txt" else _jsonl_docs(path)
    out, n = [np.zeros(0, dtype=np.int64)], 0
    try:
        for text in docs:
            out.append(np.asarray(encode(text) + sep, dtype=np.int64))
            if (n := n + len(out[-1])) >= need:
                break
    except UnicodeDecodeError as e:  # (a ValueError: first)
        raise PrepareError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x}); give a UTF-8 file") \
            from None
    except ValueError as e:
        raise PrepareError(f"{path}: cannot tokenize with {ckpt}'s vocabulary: {e}") from None
    return np.concatenate(out)[:need]


def download(url, dest, hint, timeout=15.0):
    """url's file at dest, fetched once; a network fault: a PrepareError with hint (what --input takes)."""
    import urllib.request
    dest = Path(dest)
    if dest.exists():
        return dest
    log(f"downloading {url} -> {dest}")
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            dest.parent.mkdir(parents=True, exist_ok=True)
            total = int(r.headers.get("Content-Length") or 0) or None
            with open(part, "wb") as f, progress(total=total, desc=dest.name, unit="B") as bar:
                while chunk := r.read(1 << 20):
                    bar.update(f.write(chunk))
    except OSError as e:  # (URLError and timeouts are OSErrors)
        part.unlink(missing_ok=True)
        raise PrepareError(f"could not download {url} ({e}). {hint}") from e
    os.replace(part, dest)
    return dest


def input_or_download(path, url, out_dir, hint):
    """--input's path when given; else url's file, downloaded once into out_dir/raw/ (kept by re-runs)."""
    return path or download(url, Path(os.path.realpath(out_dir), DOWNLOADS, url.rsplit("/", 1)[-1]), hint)
