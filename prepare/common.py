"""Shared helpers of prepare/, train.py and the evals: a dataset written as a set (staged_dataset),
the command that rebuilds it, the check train.py runs on it (check_dataset), token readers, one-line
errors."""

import argparse
import glob
import importlib
import io
import json
import os
import re
import shlex
import shutil
import stat
import sys
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
SPLITS = ("train", "val", "test")
DOWNLOADS = "raw"  # out_dir/raw/: a script's download cache, kept across runs
DATASET_FILES = frozenset(["meta.json"] + [f"{s}{x}.bin" for s in SPLITS for x in ("", "_mask")])


class PrepareError(Exception):
    """A user's mistake (bad input, a missing package, no network): 'error: ...', exit 2."""


def log(msg):
    """msg on stderr, flushed (stdout is a script's output)."""
    print(msg, file=sys.stderr, flush=True)


def die(msg):
    """'error: msg' on stderr; exit 2."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def run_main(main_fn, argv=None):
    """main_fn(argv), its value; a PrepareError or a file error (OSError) is one line and exit 2."""
    try:
        return main_fn(argv)
    except (PrepareError, OSError) as e:
        die(f"{e.filename}: {e.strerror}" if isinstance(e, OSError) and e.filename else e)


AT_LEAST_1 = (lambda v, c: v >= 1, ">= 1")
SEED_RULE = (lambda v, c: 0 <= v < 2**63, "in [0, 2**63)")  # torch.manual_seed's range


def broken_rules(values, rules, prefix=""):
    """'name=value (must be ...)' for each value that breaks its rule. rules: {name: (ok(value,
    values), what it must be)}: train.py's settings, the scripts' flags (None: not given)."""
    return [f"{prefix}{k}={values[k]!r} (must be {want})" for k, (ok, want) in rules.items()
            if values[k] is not None and not ok(values[k], values)]


def check_flags(args, rules):
    """A script's flags (argparse's args) against rules (broken_rules): die() at a broken one."""
    broken = broken_rules(vars(args), rules, "--")
    if broken:
        die(broken[0])


def devices():
    """The devices of this machine: cpu, and cuda, cuda:0 .. cuda:N-1 where it has N GPUs."""
    import torch  # (here: a prepare import stays light)
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ["cpu"]
    if n:
        names += ["cuda"] + [f"cuda:{k}" for k in range(n)]
    return names


def resolve_device(name):
    """--device auto: cuda where this machine has a GPU, else cpu; any other name as it is."""
    if name != "auto":
        return name
    return "cuda" if "cuda" in devices() else "cpu"


def physical_memory():
    """This machine's RAM in bytes, or None where the system does not say. Scripts compare what they
    would allocate with it first: a host that overcommits grants more and is then OOM-killed."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # (no sysconf: Windows)
        return None


DEVICE_RULE = (lambda v, c: v == "auto" or v in devices(), "auto, cpu, or cuda[:N] of a GPU here")
KERNEL_RULE = (lambda v, c: v != "triton" or resolve_device(c["device"]).startswith("cuda")
               or os.environ.get("TRITON_INTERPRET") == "1",
               "auto or torch off CUDA: the Triton kernels run on GPUs (or TRITON_INTERPRET=1)")


def check_kernel(cfg, device, path):
    """die() where a checkpoint's model (cfg, from path) asks for kernels that cannot run on device
    (KERNEL_RULE): its attn_impl='triton' off CUDA, unless the eval's --attn_impl overrides it."""
    bad = broken_rules({"attn_impl": cfg.attn_impl, "device": device}, {"attn_impl": KERNEL_RULE})
    if bad:
        die(f"{path}: {bad[0]}; give --attn_impl=torch")


def require(module, pip_name, purpose):
    """module, or a PrepareError naming pip_name."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PrepareError(f"{purpose} needs the Python package '{pip_name}' "
                           f"(pip install {pip_name})") from e


def progress(iterable=None, **kw):
    """A tqdm bar on stderr, redrawn at most once a second."""
    from tqdm import tqdm  # (here: a prepare import stays light)
    scale = kw.get("unit", "it") != "it"
    return tqdm(iterable, mininterval=1.0, file=sys.stderr, unit_scale=scale, **kw)


def script_parser(doc, name, **input_kwargs):
    """A prepare script's parser: doc as its description, --input (input_kwargs), --out_dir."""
    p = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", **input_kwargs)
    p.add_argument(
        "--out_dir",
        default=str(REPO_ROOT / "data" / name),
        help=f"(default data/{name})",
    )
    return p


def gpt2_encoding():
    """tiktoken's gpt2; offline without its cache, a PrepareError."""
    tiktoken = require("tiktoken", "tiktoken", "GPT-2 tokenization")
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:
        raise PrepareError(f"cannot load tiktoken's gpt2 ({type(e).__name__}): "
                           "set TIKTOKEN_CACHE_DIR") from e


def codec(meta):
    """(encode, decode) for meta.json's gpt2 or itos tokenizer; encode: ValueError for
    what it lacks."""
    if meta.get("tokenizer") == "gpt2":
        enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    if "itos" not in meta:
        raise ValueError("meta.json needs either \"tokenizer\": \"gpt2\" or an \"itos\" list")
    itos = meta["itos"]
    stoi = {s: i for i, s in enumerate(itos)}

    def encode(s):
        if any(len(t) != 1 for t in itos):
            raise ValueError("this vocabulary has multi-character tokens; "
                             "give the prompt as token ids")
        bad = sorted(set(s) - set(stoi))
        if bad:
            raise ValueError(f"characters {bad} are not in the vocabulary ({''.join(itos)!r})")
        return [stoi[c] for c in s]
    return encode, lambda ids: "".join(itos[i] for i in ids)


def utf8(data, path, offset=0):
    """data (bytes read from path at offset) as text; a byte that is not UTF-8 is a PrepareError
    naming the file and the byte's offset (Python's decoding puts U+FFFD there or fails mid-run)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not UTF-8 at byte {offset + e.start} (0x{data[e.start]:02x}); "
                           "convert it to UTF-8 (e.g. iconv -t UTF-8)") from None


def model_vocab(meta):
    """The vocab_size of train.py's model for data with this meta.json: gpt2's 50257 padded to 50304
    (a multiple of 64, as nanoGPT: faster matmuls), else meta's own."""
    V = meta["vocab_size"]
    return (V + 63) // 64 * 64 if meta.get("tokenizer") == "gpt2" else V


def check_vocab(meta, vocab_size, path):
    """die() where a checkpoint's model (vocab_size) and its meta's tokenizer (model_vocab)
    disagree: sampling would draw, and scoring index, the wrong ids."""
    if "vocab_size" in meta and vocab_size is not None and model_vocab(meta) != vocab_size:
        die(f"{path}: its model has vocab_size {vocab_size}, its meta's tokenizer "
            f"{model_vocab(meta)}: save it with the meta.json of the data it was trained on")


def format_module(meta):
    """The prepare/ module meta.json's "format" names (decode, encode, save_sample), or None."""
    if not meta.get("format"):
        return None
    if meta["format"] not in _scripts():
        raise PrepareError(f"meta.json's format {meta['format']!r} is none of prepare/'s "
                           f"({', '.join(_scripts())}): data of another version of this repo?")
    return importlib.import_module(f"prepare.{meta['format']}")


# -----------------------------------------------------------------------------
# outputs: every script's files (checkpoints, eval.json, --json, --plot, samples): output_file

class _Output(io.RawIOBase):
    """output_file's file: every byte through os.write (where a test fills the disk), counted; the
    first OSError is kept (torch.save reports it as a RuntimeError)."""

    def __init__(self, fd):
        super().__init__()
        self.fd = fd
        self.count = 0
        self.error = None

    def writable(self):
        return True

    def write(self, b):
        view = memoryview(b).cast("B")
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done:])
        except OSError as e:
            self.error = self.error or e
            raise
        self.count += done
        return done


@contextmanager
def output_file(path):
    """`with output_file(path) as f: f.write(data)` (or torch.save(obj, f), fig.savefig(f)): a
    file whole or not at all. It goes to path.tmp, is synced, checked to hold every byte written and
    renamed to path as the block ends; an error leaves the old file (or none) and no .tmp. An
    OSError (a read-only folder, a full disk) is a PrepareError naming path and what errno means."""
    path = os.fspath(path)
    tmp = f"{path}.tmp"
    out = None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        out = _Output(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        yield out
        os.fsync(out.fd)
        if os.fstat(out.fd).st_size != out.count:
            raise OSError(f"{os.fstat(out.fd).st_size} bytes on disk of the {out.count} written")
        os.replace(tmp, path)
    except BaseException as e:
        if out is not None:
            with suppress(OSError):
                os.remove(tmp)
        error = e if out is None or out.error is None else out.error
        if isinstance(error, OSError):
            raise PrepareError(f"cannot write {path}: {error.strerror or error}") from None
        raise
    finally:
        if out is not None:
            os.close(out.fd)


def write_json(path, obj, indent=1, default=None):
    """obj as JSON at path, whole or not at all (output_file)."""
    with output_file(path) as f:
        f.write(json.dumps(obj, indent=indent, default=default).encode())


PROBE_BYTES = 1 << 16  # check_outputs writes this much: a full disk fails there, before the work


def check_outputs(**paths):
    """Refuse early an output path that is a folder or cannot be written (read-only, a full disk:
    a probe of PROBE_BYTES is written and removed where it would go); --plot without matplotlib."""
    for option, path in paths.items():
        if not path:
            continue
        folder = next(f for f in Path(os.path.abspath(path)).parents if os.path.lexists(f))
        if os.path.isdir(path):
            raise PrepareError(f"--{option} {path} is a folder; give a file name")
        if option == "save" and glob.glob(glob.escape(path) + ".*"):  # (sample.py's prefix_0)
            raise PrepareError(f"--save: {path}.* exists; pick another prefix, or remove it")
        if not folder.is_dir():
            raise PrepareError(f"--{option} {path}: {folder} is a file, not a folder")
        probe = folder / f".write-check-{os.getpid()}"
        try:
            with output_file(probe) as f:
                f.write(bytes(PROBE_BYTES))
            os.remove(probe)
        except PrepareError as e:
            raise PrepareError(f"--{option} {path}: {e}") from None
        if option == "plot":
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise PrepareError(f"--plot {path} needs matplotlib: "
                                   "pip install matplotlib") from None


def save_sample(ids, meta, prefix, decode):
    """sample.py --save: ids to prefix + the format's own extension (its save_sample, e.g. JSB's
    .mid) or to prefix.txt (decode(ids)), through output_file; returns the path written."""
    fmt = format_module(meta)
    if fmt is not None and hasattr(fmt, "save_sample"):
        return fmt.save_sample(ids, meta, prefix)
    with output_file(f"{prefix}.txt") as f:
        f.write(decode(ids).encode("utf-8"))
    return f"{prefix}.txt"


_LOCKS = {}  # lock file -> its fd, held until unlock_folder or the process's end


def lock_folder(folder, hint, path=None):
    """One run per folder: an exclusive flock on path (default folder/.lock), which the OS drops
    however the process ends; unlock_folder or a normal exit deletes the file. PrepareError while
    another run holds it, or where path is not a regular file (a folder, a link) or cannot be
    made."""
    import atexit
    import fcntl
    path = str(path or os.path.join(folder, ".lock"))
    while path not in _LOCKS:
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            raise PrepareError(f"{path} is not a regular file (a folder or a link): remove it")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise PrepareError(f"cannot make the lock file {path}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PrepareError(f"{folder} is in use by another run ({path} is locked); "
                               f"{hint}") from None
        if os.path.exists(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
            _LOCKS[path] = fd
            atexit.register(unlock_folder, folder, path)
        else:  # its holder ended and deleted the file we opened: lock the file at path now
            os.close(fd)


def unlock_folder(folder, path=None):
    """Undo lock_folder: delete the lock file, drop the lock."""
    path = str(path or os.path.join(folder, ".lock"))
    if path in _LOCKS:
        Path(path).unlink(missing_ok=True)  # (ours while we hold the lock)
        os.close(_LOCKS.pop(path))


class BinWriter:
    """Appends token ids to a file of one dtype (in the staging folder); .count: the ids written."""

    def __init__(self, path, dtype):
        self.f = open(path, "wb")
        self.dtype = np.dtype(dtype)
        self.count = 0

    def write(self, arr):
        a = np.asarray(arr)
        top = np.iinfo(self.dtype).max
        if a.size and (a.min() < 0 or a.max() > top):  # (astype would wrap them)
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
    """arr as dtype ids at path (range-checked); returns the count."""
    w = BinWriter(path, dtype)
    w.write(arr)
    w.f.close()
    return w.count


def write_meta(stage, meta):
    """meta.json with sorted keys and a trailing newline: the same bytes on a re-run."""
    (Path(stage) / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def load_meta(out_dir):
    """out_dir's meta.json, unchecked (see check_dataset)."""
    return json.loads((Path(out_dir) / "meta.json").read_text(encoding="utf-8"))


def report(out_dir, counts, extra):
    """A script's last lines: out_dir, each split's tokens and extra[split]."""
    lines = [f"  {s}: {n:,} tokens ({extra[s]})" for s, n in counts.items()]
    print(f"wrote {out_dir}", *lines, sep="\n")


def _check_target(target):
    if os.path.lexists(target) and not target.is_dir():
        raise PrepareError(f"--out_dir {target} exists and is not a folder")
    if not target.is_dir():
        return
    foreign = []
    for p in sorted(target.iterdir()):
        in_set = p.is_file() and p.name.removesuffix(".tmp") in DATASET_FILES
        if p.is_symlink() or not (p.name == DOWNLOADS or in_set):
            foreign.append(p.name)
    if foreign:
        raise PrepareError(f"--out_dir {target} holds files that are not part of a dataset: "
                           f"{', '.join(foreign)}; move them away or pick another --out_dir")


@contextmanager
def staged_dataset(out_dir):
    """Yields <out_dir>.tmp, the staging folder for the set; leaving the block normally swaps it in
    by two renames (out_dir -> <out_dir>.old, stage -> out_dir, with out_dir/raw/), an error deletes
    it: out_dir holds the old set or the new one, never a mix (a kill between the renames leaves
    <out_dir>.old, which the next run puts back). A user's own files in out_dir are refused. One run
    per out_dir: a lock."""
    target = Path(os.path.realpath(out_dir))  # (a symlinked data folder stays a link)
    stage, old, lock = (target.with_name(f"{target.name}.{x}") for x in ("tmp", "old", "lock"))
    for p in (target, old, stage):
        _check_target(p)  # (old, stage: not a folder of a user's that bears the name)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_folder(target, "wait for it to finish", lock)
    try:
        if old.is_dir() and not os.path.lexists(target):
            os.rename(old, target)  # (a run killed between the renames)
        for p in (old, stage):
            shutil.rmtree(p, ignore_errors=True)
        stage.mkdir()
        yield stage
        if os.path.lexists(target):
            _check_target(target)  # (again: files may have come while the script ran)
            if (target / DOWNLOADS).is_dir():
                os.rename(target / DOWNLOADS, stage / DOWNLOADS)
            os.rename(target, old)
        os.rename(stage, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        unlock_folder(target, lock)


def repo_path(path):
    """path as a command run from the repo root takes it: relative in or beside the repo."""
    rel = os.path.relpath(os.path.abspath(path), REPO_ROOT)
    return os.path.abspath(path) if Path(rel).parts[:2] == (os.pardir, os.pardir) else rel


def _repo_paths(v):
    if isinstance(v, list):
        return [repo_path(x) for x in v]
    return repo_path(v) if v else v


def command_line(script, parser, args, defaults=None):
    """`python prepare/<script>.py` and each option of args (but --num_proc) that differs from its
    default, --out_dir last, paths as repo_path gives them, quoted for a POSIX shell."""
    parts = ["python", f"prepare/{script}.py"]
    for dest, value in sorted(vars(args).items(), key=lambda kv: kv[0] == "out_dir"):
        default = (defaults or {}).get(dest, parser.get_default(dest))
        if dest in ("input", "val_input", "wheels", "out_dir"):
            value = _repo_paths(value)
            default = _repo_paths(default)
        if dest == "num_proc" or value is None or value == default:
            continue
        values = value if isinstance(value, list) else [value]
        if value is True:
            values = []
        parts += [f"--{dest}"] + [str(v) for v in values]
    return shlex.join(parts)


def _scripts():
    return sorted({p.stem for p in Path(__file__).parent.glob("*.py")} - {"__init__", "common"})


def _rebuild_hint(d, meta):
    if isinstance(meta, dict) and isinstance(meta.get("prepare"), str):
        return f"rebuild it with: {meta['prepare']}"
    scripts = _scripts()
    script = f"{d.name}.py"
    if d.name == "indirect_indexing_quick":
        script = "indirect_indexing.py --quick"
    if script.split(".")[0] not in scripts:
        return "make it with one of: " + ", ".join(f"python prepare/{s}.py" for s in scripts)
    out = ""
    if d.absolute() != REPO_ROOT / "data" / d.name:
        out = " --out_dir " + shlex.quote(repo_path(d))
    return f"make it with: python prepare/{script}{out}"


def check_dataset(data_dir, splits=("train", "val"), scan=True):
    """meta.json as a dict once what training relies on holds (vocab_size, dtype, whole tokens and
    rows, as many as recorded, masks as long; scan: ids < vocab_size, some token scored), else a
    one-line error."""
    d = Path(os.path.abspath(data_dir))
    meta = None
    mp = d / "meta.json"

    def fail(path, what):
        raise PrepareError(f"{path}: {what}; {_rebuild_hint(d, meta)}".replace("\n", " "))

    if not d.is_dir() and d.with_name(f"{d.name}.old").is_dir():  # (prepare killed between renames)
        fail(d, f"no such dataset folder, but {d.name}.old beside it holds the last set: the next "
             f"prepare run puts it back (or mv {d.name}.old {d.name})")
    if not mp.is_file():
        fail(mp if d.is_dir() else d, "missing" if d.is_dir() else "no such dataset folder")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except ValueError as e:  # (UnicodeDecodeError too)
        fail(mp, f"not valid JSON ({e})")
    if not isinstance(meta, dict):
        fail(mp, "not a JSON object")
    V = meta.get("vocab_size")
    name = meta.setdefault("dtype", "uint16")
    tokens = meta.get("tokens") or {}
    if type(V) is not int or V < 1:
        fail(mp, f"vocab_size is {V!r}, expected an integer >= 1")
    dtype = np.dtype(name) if name in ("uint8", "uint16", "uint32", "uint64") else None
    if dtype is None or V - 1 > np.iinfo(dtype).max:
        fail(mp, f"dtype is {name!r}, expected an unsigned integer type holding the ids 0..{V - 1}")
    masked = "mask" in meta or "scored_tokens" in meta  # (indirect_indexing's, jsb's)
    for split in splits:
        path, mpath = d / f"{split}.bin", d / f"{split}_mask.bin"
        n, rest = divmod(path.stat().st_size if path.is_file() else 0, dtype.itemsize)
        if n == rest == 0 and tokens and split not in tokens:  # (no rebuild would add it)
            raise PrepareError(f"{d}: no {split} split, only {', '.join(tokens)}; "
                               "drop it from eval_splits")
        if n == rest == 0:
            fail(path, "missing or empty")
        if rest:
            fail(path, f"not a whole number of {name} tokens")
        if n != tokens.get(split, n):
            fail(path, f"holds {n:,} tokens but meta.json records {tokens[split]!r} "
                       "(from different runs?)")
        if n % (meta.get("row_len") or 1):
            fail(path, f"holds {n:,} tokens, not a multiple of row_len {meta['row_len']}")
        if masked and not mpath.exists():  # (else every token would be scored)
            fail(mpath, "missing, though meta.json records masks")
        if mpath.exists() and mpath.stat().st_size != n:
            fail(mpath, f"holds {mpath.stat().st_size:,} entries "
                        f"but {path.name} holds {n:,} tokens")
        if not scan:
            continue
        top = int(np.memmap(path, dtype=dtype, mode="r").max())  # (pages, not RAM)
        if top >= V:
            fail(path, f"token id {top} is >= vocab_size {V}")
        if mpath.exists():
            top = int(np.memmap(mpath, np.uint8, mode="r").max())
            if top == 0:
                fail(mpath, "scores no token (all zeros)")
            if top > 1:  # (a 7 would weigh its token 7 times in the loss)
                fail(mpath, f"holds {top}: a mask is 0 or 1")
    return meta


# -----------------------------------------------------------------------------
# the tokens an eval script scores (eval_extrapolation.py, eval_frequencies.py)

def vocab_key(meta):
    """Which tokenizer a meta.json describes: "gpt2", its character list (as JSON), or None."""
    if meta.get("tokenizer") == "gpt2":
        return "gpt2"
    if "itos" in meta:
        return json.dumps(meta["itos"])
    return None


def _text_chunks(path, chunk_chars):
    """A text file in pieces cut after a "\\n" between non-spaces: they tokenize as the file."""
    buf = ""
    with open(path, encoding="utf-8") as f:
        while True:
            piece = f.read(chunk_chars)
            if not piece:
                break
            buf += piece
            cut = max((m.end() for m in re.finditer(r"\S\n(?=\S)", buf)), default=0)
            if cut:
                yield buf[:cut]
                buf = buf[cut:]
    if buf:
        yield buf


def _jsonl_docs(path):
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise PrepareError(f'{path}:{lineno}: expected an object with a "text" string')
            yield doc["text"]


def read_tokens(
    path,
    meta,
    need,
    ckpt="the checkpoint",
    docs=None,
    chunk_chars=1 << 20,
    dataset=None,
):
    """The ids at path for a model trained on data with the meta.json meta: X.bin, a prepared split,
    as a memmap (checked, and refused for another tokenizer), or up to `need` ids (int64) of X.txt
    (one text), X.jsonl or the iterable docs (documents, each ending as in training). Else a
    one-line PrepareError."""
    kind = "docs" if docs is not None else os.path.splitext(path)[1].lower()
    if kind not in ("docs", ".bin", ".txt", ".jsonl"):
        raise PrepareError(f"{path}: give a prepared split X.bin, a text X.txt "
                           "or documents X.jsonl")
    if kind != "docs" and not os.path.isfile(path):
        raise PrepareError(f"data file {path} not found")
    if kind == ".bin":
        split = os.path.basename(path)[:-4]
        if split.endswith("_mask"):
            raise PrepareError(f"{path} is a split's loss mask, not tokens: give {split[:-5]}.bin")
        data_meta = check_dataset(Path(os.path.abspath(path)).parent, (split,), False)
        if vocab_key(data_meta) and vocab_key(meta) and vocab_key(data_meta) != vocab_key(meta):
            raise PrepareError(f"{path} was tokenized with another vocabulary than "
                               f"{ckpt}'s training data")
        return np.memmap(path, dtype=np.dtype(data_meta["dtype"]), mode="r")  # (its mask: unused)
    if vocab_key(meta) != "gpt2" and any(len(s) != 1 for s in meta.get("itos", ())):
        raise PrepareError(f"{path}: text cannot be tokenized with {ckpt}'s multi-character "
                           "tokens; pass a prepared .bin of its dataset, e.g. "
                           f"--data data/{dataset or '<dataset>'}/val.bin")
    out = [np.zeros(0, dtype=np.int64)]
    n = 0
    try:
        gpt2 = vocab_key(meta) == "gpt2"
        if gpt2:  # as prepare/*.py tokenize: a "<|endoftext|>" in the text is text
            enc = gpt2_encoding()
            encode = enc.encode_ordinary
        else:
            encode = codec(meta)[0]
        ends = kind != ".txt" and (gpt2 or "\n" in meta["itos"])  # documents end as in training
        sep = []
        if ends:
            sep = [enc.eot_token] if gpt2 else encode("\n\n")
        if kind == ".txt":
            docs = _text_chunks(path, chunk_chars)
        if kind == ".jsonl":
            docs = _jsonl_docs(path)
        for text in docs:
            out.append(np.asarray(encode(text) + sep, dtype=np.int64))
            n += len(out[-1])
            if n >= need:
                break
    except UnicodeDecodeError as e:  # (a ValueError: first)
        raise PrepareError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x})") from None
    except ValueError as e:
        raise PrepareError(f"{path}: cannot tokenize with {ckpt}'s vocabulary: {e}") from None
    return np.concatenate(out)[:need]


def download(url, out_dir, hint, timeout=15.0):
    """url's file, fetched once into out_dir/raw/ (kept by re-runs); no network: a PrepareError
    with hint."""
    import urllib.request
    dest = Path(os.path.realpath(out_dir), DOWNLOADS, url.rsplit("/", 1)[-1])
    part = Path(f"{dest}.part")
    if dest.exists():
        return dest
    log(f"downloading {url} -> {dest}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            dest.parent.mkdir(parents=True, exist_ok=True)
            size = int(r.headers.get("Content-Length") or 0) or None
            with open(part, "wb") as f:
                with progress(total=size, desc=dest.name, unit="B") as bar:
                    while True:
                        chunk = r.read(1 << 20)
                        if not chunk:
                            break
                        bar.update(f.write(chunk))
    except OSError as e:  # (URLError and timeouts are OSErrors)
        part.unlink(missing_ok=True)
        raise PrepareError(f"could not download {url} ({e}). {hint}") from e
    return part.replace(dest)

