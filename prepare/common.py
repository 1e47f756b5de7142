"""Shared helpers for the prepare/ scripts: output paths, .bin/meta.json
writing (byte-identical on re-runs), a dataset written as a set (staged in a
folder beside out_dir and swapped in whole: staged_dataset), the command that
rebuilds a dataset, the dataset check train.py runs (check_dataset) and the
batches it draws (Data), a tqdm progress bar, optional imports and a download
helper that fails fast offline; for the scripts at the top: their one error exit
(die) and the eval scripts' token reader (read_tokens).

Usage: a module, not a script: `from prepare import common` (the prepare/ scripts, train.py and the
eval scripts do); `python prepare/common.py --help` prints this.
"""

import argparse
import errno
import glob
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
SPLITS = ("train", "val", "test")


class PrepareError(Exception):
    """A user-facing error: bad or empty input, a missing optional package,
    no network. main() prints it as one line and exits with status 2."""


def default_out_dir(name):
    return REPO_ROOT / "data" / name


def script_parser(doc, name, **input_kwargs):
    """A prepare script's argparse parser: its docstring as the description, --input
    (with input_kwargs: its nargs and help) and --out_dir, by default data/<name>."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if input_kwargs:
        p.add_argument("--input", **input_kwargs)
    p.add_argument("--out_dir", default=str(default_out_dir(name)), help=f"output folder (default data/{name})")
    return p


def dtype_for_vocab(vocab_size):
    """np.uint16 when every id fits, else np.uint32 (the format's rule)."""
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def require(module, pip_name, purpose):
    """Import an optional dependency or raise a PrepareError naming it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PrepareError(
            f"{purpose} needs the Python package '{pip_name}' "
            f"(pip install {pip_name}); importing {module} failed: {e}") from e


# -----------------------------------------------------------------------------
# progress

def progress(iterable=None, total=None, desc="", unit="it"):
    """A tqdm bar on stderr (tqdm is a core requirement; imported here, on first
    use, so that importing a prepare module stays light)."""
    tqdm = require("tqdm", "tqdm", "the progress bars of prepare/*.py").tqdm
    return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit != "it",
                mininterval=1.0, file=sys.stderr)


# -----------------------------------------------------------------------------
# tokenizers: what sample.py and the eval scripts use to turn text into a
# checkpoint's token ids and back

def gpt2_encoding():
    """tiktoken's gpt2 encoding, or a PrepareError that says what to do offline."""
    try:
        import tiktoken
    except ImportError as e:
        raise PrepareError("GPT-2 tokenization needs the Python package 'tiktoken' (pip install tiktoken)") from e
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # offline with no cached BPE files
        raise PrepareError(
            f"tiktoken could not load the gpt2 encoding ({type(e).__name__}; offline?). Offline, point "
            "TIKTOKEN_CACHE_DIR at a folder that holds tiktoken's gpt2 files (e.g. a copy of ../shared/tiktoken_cache)") from e


def codec(meta):
    """(encode, decode) for a dataset's meta.json: GPT-2 BPE ("tokenizer": "gpt2")
    or a list of token strings ("itos"). encode raises ValueError for text the
    vocabulary cannot express."""
    if meta.get("tokenizer") == "gpt2":
        enc = gpt2_encoding()
        return (lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})), enc.decode
    if "itos" in meta:
        itos = meta["itos"]
        stoi = {s: i for i, s in enumerate(itos)}
        single = all(len(s) == 1 for s in itos)

        def encode(s):
            if not single:
                raise ValueError("this vocabulary has multi-character tokens; give the prompt as token ids")
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise ValueError(f"characters {bad} are not in the vocabulary ({''.join(itos)!r})")
            return [stoi[c] for c in s]
        return encode, lambda ids: "".join(itos[i] for i in ids)
    raise ValueError("meta.json needs either \"tokenizer\": \"gpt2\" or an \"itos\" list")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -----------------------------------------------------------------------------
# one-line errors shared by the scripts

def die(msg):
    """Refuse: print 'error: msg' (one line) on stderr and exit with status 2, as
    argparse does for a bad option. Every script's error exit (run_main's too)."""
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def checkpoint_error(path, e):
    """One line saying why torch.load(path, weights_only=True) (or
    configurator.load_checkpoint) failed with e. torch's own text for a file that needs
    pickle spans lines and offers to load it with weights_only=False; here such a
    file is refused, and the line says why: loading it would run code."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    if type(e).__name__ == "CheckpointError":  # configurator.check_checkpoint_file's own line names the file
        return text
    if type(e).__name__ == "UnpicklingError":  # pickle's, re-raised by torch.load's weights-only unpickler
        glob = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        if glob:
            return (f"cannot load {path}: refused, because loading it would run code (it asks to call "
                    f"{glob.group(1)}); train.py writes checkpoints of tensors and plain types only, so this "
                    "file was made by another program")
        detail = (text.split("WeightsUnpickler error:")[-1].strip().splitlines() or [""])[0]
        return f"cannot load {path}: not a torch checkpoint, or a damaged one (unpickling stopped: {detail[:120]})"
    first = (text.strip().splitlines() or [""])[0]
    return f"cannot load {path} as a train.py checkpoint ({type(e).__name__}: {first[:200]})"


def check_writable(path, option):
    """Refuse (PrepareError), before any slow work, an output file that cannot be
    written: a folder, or one whose folder (or, when that does not exist yet, the
    nearest one above it that does) takes no new file: read-only, no permission.
    Probes with a temporary file; creates nothing that stays."""
    p = Path(os.path.abspath(path))
    if p.is_dir():
        raise PrepareError(f"{option} {path} is a folder; give a file name")
    folder = p.parent
    while not os.path.lexists(folder):
        folder = folder.parent
    if not folder.is_dir():
        raise PrepareError(f"{option} {path}: {folder} is a file, not a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-check-")
    except OSError as e:
        raise PrepareError(f"{option} {path}: cannot write into {folder} ({e.strerror or e}); "
                           "give a path in a writable folder") from None
    os.close(fd)
    os.unlink(tmp)


_WRITE_ERRNOS = {
    errno.ENOSPC: "Free some disk space, or give an --out_dir on another disk",
    errno.EDQUOT: "Free some space within your disk quota, or give an --out_dir on another disk",
    errno.EFBIG: "The file system limits file sizes: give an --out_dir on another file system",
    errno.EROFS: "Give an --out_dir on a writable file system",
}  # staged_dataset's one-line errors: only those a write alone raises (EACCES can also be an input file's)


# -----------------------------------------------------------------------------
# writing

def write_atomic(path, save):
    """save(tmp), then rename tmp to path: no reader ever sees a half-written
    file, and a crash leaves the old one (train.py's checkpoints, the eval
    scripts' outputs, meta.json)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    try:
        save(tmp)
        os.replace(tmp, path)
    except BaseException:  # e.g. a full disk: no half file stays behind (it would hold the space)
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_json(path, obj, indent=1, default=None):
    """obj as JSON, written atomically (write_atomic)."""
    write_atomic(path, lambda tmp: Path(tmp).write_text(json.dumps(obj, indent=indent, default=default)))


_LOCKS = {}  # lock file path -> (fd, pid): held until unlock_folder or the process's end


def lock_folder(folder, hint, path=None):
    """Hold an exclusive lock (fcntl.flock) on path, default folder/.lock, until
    unlock_folder or the end of the process: one writer per folder (train.py: one run
    per out_dir; staged_dataset: one prepare run per dataset, its lock beside it). The
    OS drops the lock when the process ends, however it ends; unlock_folder and a normal
    exit also delete the file. Raises PrepareError when another process holds it (naming
    the PID it wrote; then hint says what to do) or when the file cannot be created."""
    import atexit
    import fcntl
    import time
    path = str(path or os.path.join(folder, ".lock"))
    if path in _LOCKS:
        return
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise PrepareError(f"cannot create {path} ({e.strerror}): {os.path.dirname(path) or '.'} must be "
                               "writable") from None  # (hint: what to do about another holder, not this)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for _ in range(40):  # the holder writes its PID right after taking the lock
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
                if pid.isdigit():
                    break
                time.sleep(0.05)
            os.close(fd)
            who = f"pid {pid}" if pid.isdigit() else "a process whose PID it does not record"
            raise PrepareError(f"{folder} is in use by another run ({who} holds {path}); {hint}") from None
        try:  # a holder that ended deleted the file after we opened it: lock the path's current file
            if os.path.samestat(os.stat(path), os.fstat(fd)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    _LOCKS[path] = (fd, os.getpid())
    atexit.register(unlock_folder, folder, path)


def unlock_folder(folder, path=None):
    """Release lock_folder's lock and delete the file (it is still ours: the lock is held)."""
    path = str(path or os.path.join(folder, ".lock"))
    fd, pid = _LOCKS.get(path, (None, None))
    if fd is None or pid != os.getpid():  # not held, or a forked child's copy
        return
    del _LOCKS[path]
    try:
        if os.path.samestat(os.stat(path), os.fstat(fd)):
            os.remove(path)
    except OSError:
        pass
    os.close(fd)


class BinWriter:
    """Appends token arrays to <path> in one dtype; the file appears under its
    final name only on close(), so an interrupted run leaves no half file."""

    def __init__(self, path, dtype):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")
        self.count = 0

    def write(self, arr):
        a = np.asarray(arr)
        if a.size and (a.min() < 0 or a.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"values out of range for {self.dtype} in {self.path.name}")
        a = np.ascontiguousarray(a, dtype=self.dtype).ravel()
        self.f.write(memoryview(a).cast("B"))  # not a.tofile: its errors lose the errno (a full disk)
        self.count += a.size

    def close(self):
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.count

    def abort(self):
        self.f.close()
        if self.tmp.exists():
            self.tmp.unlink()


@contextmanager
def split_writers(out_dir, splits, dtype=np.uint16):
    """One BinWriter per split, {split: writer}. An error inside the block removes
    every temp file (no half-written split survives); leaving it normally closes
    them all, and each writer's .count holds its tokens. The scripts open them in
    the staging folder of staged_dataset, so that the whole set is swapped in."""
    writers = {s: BinWriter(Path(out_dir) / f"{s}.bin", dtype) for s in splits}
    try:
        yield writers
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    for w in writers.values():
        w.close()


def write_bin(path, arr, dtype):
    w = BinWriter(path, dtype)
    w.write(arr)
    return w.close()


def write_meta(out_dir, meta):
    """meta.json with sorted keys and a trailing newline (stable bytes)."""
    text = json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    write_atomic(Path(out_dir) / "meta.json", lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def load_meta(out_dir):
    return json.loads((Path(out_dir) / "meta.json").read_text(encoding="utf-8"))


def read_bin(out_dir, split, meta=None):
    """Token ids of one split as a read-only memmap (tests, samplers)."""
    meta = meta or load_meta(out_dir)
    path = Path(out_dir) / f"{split}.bin"
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=meta["dtype"])
    return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r")


def read_mask(out_dir, split):
    path = Path(out_dir) / f"{split}_mask.bin"
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def report(out_dir, counts, extra=None):
    """The closing lines every script prints: tokens per split."""
    print(f"wrote {out_dir}")
    for split, n in counts.items():
        line = f"  {split}: {n:,} tokens"
        if extra and split in extra:
            line += f" ({extra[split]})"
        print(line)


# -----------------------------------------------------------------------------
# out_dir: a dataset's own files only
#
# A re-run replaces the whole folder, so out_dir may hold only meta.json,
# {split}.bin, {split}_mask.bin (and their .tmp files) and the download cache raw/;
# anything else (a user's files) is refused, named, before any work: nothing of a
# user's is ever deleted.

DOWNLOADS = "raw"
DATASET_FILES = frozenset(["meta.json"] + [f"{s}{x}.bin" for s in SPLITS for x in ("", "_mask")])


def _alive(pid):
    """Whether a process pid exists (another user's counts too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except (ProcessLookupError, OverflowError):
        return False
    return True


def _names(names, limit=8):
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_target(target):
    """out_dir is absent or a folder of a dataset's own files (else PrepareError)."""
    if os.path.lexists(target) and not target.is_dir():
        raise PrepareError(f"--out_dir {target} exists and is not a folder")
    foreign = [p.name + "/" * p.is_dir() for p in sorted(target.iterdir()) if p.is_symlink() or not (
        p.is_dir() and p.name == DOWNLOADS or p.is_file() and p.name.removesuffix(".tmp") in DATASET_FILES)] \
        if target.is_dir() else []
    if foreign:
        raise PrepareError(f"--out_dir {target} holds files that are not part of a dataset: {_names(foreign)}; a "
                           "re-run replaces the whole folder, so move them away (or pick another --out_dir)")


def check_out_dir(out_dir):
    """Refuse (PrepareError) an out_dir that holds files of its own, or one beside
    which no staging folder can be made (read-only, no permission), early, before
    a long input phase (staged_dataset checks again)."""
    target = dataset_target(out_dir)
    _check_target(target)
    check_writable(target.with_name(f"{target.name}.tmp-{os.getpid()}"), "--out_dir")


def dataset_target(out_dir):
    """The folder a dataset goes to: out_dir made absolute, following a symlink
    (a linked data folder stays a link; the swap happens where it points)."""
    return Path(os.path.realpath(os.path.abspath(out_dir)))


# -----------------------------------------------------------------------------
# a dataset is written as a set
#
# Every file goes into a staging folder beside out_dir, <out_dir>.tmp-<pid>; once the set
# is complete and agrees with its meta.json, two renames swap it in: out_dir -> <out_dir>.old,
# staging folder -> out_dir; raw/ moves into the new set, <out_dir>.old is deleted. A run holds
# <out_dir>.lock throughout: one run per out_dir. The recovery rule, a run's first step: no
# out_dir but an <out_dir>.old is a kill between the renames, so the old set goes back; other
# .old/.tmp-* folders are deleted. A kill thus leaves the old or the new set, never a mix.

def _leftovers(target):
    """The .old and .tmp-<pid> folders beside target."""
    return sorted(p for p in target.parent.glob(glob.escape(target.name) + ".*") if p.is_dir() and not p.is_symlink()
                  and re.fullmatch(r"old|tmp-\d+", p.name[len(target.name) + 1:]))


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    with suppress(OSError):  # (some file systems do not sync folders)
        os.fsync(fd)
    os.close(fd)


def _discard(folder, target):
    """Delete a leftover folder, moving its raw/ into target when target has none."""
    if (folder / DOWNLOADS).is_dir() and target.is_dir() and not os.path.lexists(target / DOWNLOADS):
        os.rename(folder / DOWNLOADS, target / DOWNLOADS)
    shutil.rmtree(folder)


@contextmanager
def removing_new_folders(out_dir):
    """On an error, remove the folders this run made for out_dir (out_dir and any parent it lacked) where they
    are still empty: a failed download (offline, no --input) or a bad input leaves no empty folder behind."""
    made, p = [], dataset_target(out_dir)
    while not os.path.lexists(p):
        made.append(p)
        p = p.parent
    try:
        yield
    except BaseException:
        for p in made:  # innermost first
            try:
                p.rmdir()
            except OSError:  # not empty (e.g. a download kept in raw/ for the next run), or never made
                pass
        raise


@contextmanager
def staged_dataset(out_dir):
    """Write a dataset as a set: yields the staging folder for every .bin and meta.json;
    leaving the block normally checks the set and swaps it in, an error deletes it. Refuses
    (PrepareError), before any work, an out_dir with files of its own or in another run's use."""
    target = dataset_target(out_dir)
    _check_target(target)
    stage, backup, lock = (target.with_name(f"{target.name}.{x}") for x in (f"tmp-{os.getpid()}", "old", "lock"))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(stage, ignore_errors=True)  # (a killed run's, whose PID was the same)
        stage.mkdir()
    except OSError as e:
        raise PrepareError(f"--out_dir {out_dir}: cannot create {stage} ({e.strerror or e}); the new set is written "
                           "there, beside out_dir, and swapped in: give an --out_dir in a writable folder") from None
    try:
        lock_folder(target, "wait for it to finish", lock)
        if backup.is_dir() and not os.path.lexists(target):  # the recovery rule
            os.rename(backup, target)
            log(f"restored {target} from {backup.name}, left by an interrupted run")
        for p in _leftovers(target):
            if p != stage:
                _discard(p, target)
                log(f"removed {p}, left by an interrupted run")
        stage.mkdir(exist_ok=True)  # (gone if the run that held the lock before took it for a leftover)
        try:
            yield stage
        except OSError as e:  # disk full, read-only, ... while writing the set: one line; out_dir is untouched
            if e.errno not in _WRITE_ERRNOS:
                raise
            raise PrepareError(f"could not write {e.filename or stage} ({e.strerror or e}); {target} was left "
                               f"as it was. {_WRITE_ERRNOS[e.errno]}") from None
        _check_stage(stage)
        for path in [*stage.iterdir(), stage]:
            _fsync(path)  # the new set is on disk before it is named
        if os.path.lexists(target):
            _check_target(target)  # again: files may have been added while the script ran
            os.rename(target, backup)
        try:
            os.rename(stage, target)
        except BaseException:
            if os.path.lexists(backup):
                os.rename(backup, target)
            raise
        _fsync(target.parent)
        if backup.exists():
            _discard(backup, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        unlock_folder(target, lock)


# -----------------------------------------------------------------------------
# the command that rebuilds a dataset

def repo_path(path):
    """path as the commands write it: relative to the repo root when it lies in
    the repo or next to it (data/english, ../shared/data/...), else absolute."""
    a = os.path.abspath(path)
    rel = os.path.relpath(a, REPO_ROOT)
    ups = 0
    for part in Path(rel).parts:
        if part != os.pardir:
            break
        ups += 1
    return rel if ups <= 1 else a


def command_line(script, parser, args, defaults=None, skip=("num_proc",), paths=("input", "val_input", "out_dir")):
    """The command, run from the repo root, that rebuilds a dataset:
    `python prepare/<script>.py` and every option of args whose value differs from
    its default (defaults overrides parser defaults), in the parser's order but
    --out_dir last, paths
    as repo_path writes them, quoted for a POSIX shell. Options in skip (the number
    of worker processes) do not change the output and are left out."""
    defaults = defaults or {}
    parts = ["python", f"prepare/{script}.py"]
    actions = sorted(parser._actions, key=lambda a: a.dest == "out_dir")  # --out_dir last
    for a in actions:
        if not a.option_strings or a.dest in skip or isinstance(a, argparse._HelpAction):
            continue
        value, default = getattr(args, a.dest), defaults.get(a.dest, a.default)
        if value is None:
            continue
        if a.dest in paths:
            norm = lambda v: [repo_path(x) for x in v] if isinstance(v, (list, tuple)) else (  # noqa: E731
                None if v is None else repo_path(v))
            value, default = norm(value), norm(default)
        if value == default:
            continue
        opt = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            parts.append(opt)
        elif isinstance(value, (list, tuple)):
            parts += [opt] + [str(v) for v in value]
        else:
            parts += [opt, str(value)]
    return shlex.join(parts)


_ENGLISH = ("python prepare/openwebtext.py --out_dir data/english --input $POPE_SHARED_DATA/text/owt_sample.jsonl "
            "$POPE_SHARED_DATA/text/english/{abc,brown,inaugural,movie_reviews,tinyshakespeare,webtext}.txt "
            "--val_input $POPE_SHARED_DATA/text/english/state_union.txt")
# (without --input the scripts download their source; README, Data, gives the offline samples' --input)
PREPARE_COMMANDS = {
    "openwebtext": "python prepare/openwebtext.py",
    "indirect_indexing": "python prepare/indirect_indexing.py",
    "indirect_indexing_quick": "python prepare/indirect_indexing.py --quick",
    "jsb": "python prepare/jsb.py",
    "maestro": "python prepare/maestro.py",
    "genome": "python prepare/genome.py",
    "english": _ENGLISH,  # as in config/english_small.py's header
}


def prepare_scripts():
    """The names of the prepare scripts (a checkpoint's meta["format"] is one)."""
    return sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem not in ("__init__", "common"))


def prepare_command(name):
    """The command that makes the dataset data/<name> (for a dataset without a
    readable meta.json; one that has it records its own in meta["prepare"]).
    For an unknown name: a sentence listing the prepare scripts."""
    if name in PREPARE_COMMANDS:
        return PREPARE_COMMANDS[name]
    scripts = prepare_scripts()
    return (f"no prepare command is known for a dataset named {name!r}; the prepare scripts are "
            + ", ".join(f"python prepare/{s}.py" for s in scripts)
            + " (see README.md, Data; each takes --out_dir)")


# -----------------------------------------------------------------------------
# checking a dataset

CHECK_CHUNK = 1 << 26  # tokens read at a time by check_dataset's scans


def _rebuild_hint(data_dir, meta):
    """'rebuild it with: <command>' (meta["prepare"], else prepare_command of the
    folder's name, with --out_dir when the folder is not data/<name>)."""
    if isinstance(meta, dict) and isinstance(meta.get("prepare"), str) and meta["prepare"].strip():
        return f"rebuild it with: {meta['prepare']}"
    name = Path(os.path.abspath(data_dir)).name
    cmd = prepare_command(name)
    if name not in PREPARE_COMMANDS:
        return cmd
    if os.path.abspath(data_dir) != os.path.abspath(default_out_dir(name)):  # the folder asked for, not data/<name>
        out = "--out_dir " + shlex.quote(repo_path(data_dir))
        cmd = re.sub(r"--out_dir \S+", lambda _: out, cmd) if "--out_dir" in cmd else f"{cmd} {out}"
    return f"rebuild it with: {cmd}"


def _one_line(s):
    return " ".join(str(s).split())


def _scan(mm, chunk, fn):
    """fn(piece) over chunks of a 1-D memmap, so that memory stays small."""
    for i in range(0, len(mm), chunk):
        yield i, fn(np.asarray(mm[i:i + chunk]))


def _check(data_dir, splits, scan=True, hint=None):
    data_dir = Path(data_dir)
    meta = None

    def fail(path, what):
        h = hint if hint is not None else _rebuild_hint(data_dir, meta)
        raise PrepareError(_one_line(f"{path}: {what}; {h}"))

    if not data_dir.is_dir():
        left = _leftovers(dataset_target(data_dir))  # (<name>.old and <name>.tmp-<pid> only)
        live = [(p, pid) for p in left if not p.name.endswith(".old") and _alive(pid := int(p.name.rsplit("-", 1)[1]))]
        if live:  # (not a leftover: its run is on; the rebuild command would only wait for its lock)
            raise PrepareError(f"{data_dir}: no such dataset folder yet: a prepare run (pid {live[0][1]}) is still "
                               f"writing it, into {live[0][0].name} beside it; wait for that run to finish, then "
                               "start this one again")
        fail(data_dir, "no such dataset folder" + (
            f" (an interrupted prepare run left {_names([p.name for p in left])} beside it; re-running the command "
            "restores or replaces the dataset)" if left else ""))
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        fail(meta_path, "missing")
    try:
        loaded = json.loads(meta_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        fail(meta_path, f"not valid JSON ({e})")
    except OSError as e:
        fail(meta_path, f"cannot be read ({e.strerror or e})")
    if not isinstance(loaded, dict):
        fail(meta_path, f"holds a JSON {type(loaded).__name__}, not an object")
    meta = loaded
    V = meta.get("vocab_size")
    if not (isinstance(V, int) and not isinstance(V, bool) and V >= 1):
        fail(meta_path, f"vocab_size is {V!r}, expected an integer >= 1")
    try:
        dtype = np.dtype(meta.get("dtype", "uint16"))
        ok = dtype.kind == "u" and dtype.isnative and isinstance(meta.get("dtype", "uint16"), str)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        fail(meta_path, f"dtype is {meta.get('dtype')!r}, expected an unsigned integer type such as uint16 or uint32")
    if V - 1 > np.iinfo(dtype).max:
        fail(meta_path, f"dtype {dtype.name} cannot hold the token ids 0..{V - 1} of vocab_size {V}")
    meta.setdefault("dtype", "uint16")
    row_len = meta.get("row_len")
    if row_len is not None and not (isinstance(row_len, int) and not isinstance(row_len, bool) and row_len >= 1):
        fail(meta_path, f"row_len is {row_len!r}, expected an integer >= 1")
    tokens = meta.get("tokens")
    if tokens is not None and not isinstance(tokens, dict):
        fail(meta_path, f"tokens is {tokens!r}, expected {{split: token count}}")
    for split in splits:
        path = data_dir / f"{split}.bin"
        if not path.is_file():
            fail(path, "missing")
        size = path.stat().st_size
        if size % dtype.itemsize:
            fail(path, f"{size:,} bytes, not a multiple of {dtype.itemsize} (the size of a {dtype.name} token): truncated?")
        n = size // dtype.itemsize
        if n == 0:
            fail(path, "empty (0 tokens)")
        if tokens is not None and split in tokens:
            want = tokens[split]
            if not (isinstance(want, int) and not isinstance(want, bool)):
                fail(meta_path, f"tokens[{split!r}] is {want!r}, expected an integer")
            if n != want:
                fail(path, f"holds {n:,} tokens but meta.json records {want:,} (files from different runs?)")
        if row_len and n % row_len:
            fail(path, f"holds {n:,} tokens, not a multiple of row_len {row_len}")
        mpath = data_dir / f"{split}_mask.bin"
        if mpath.exists():
            m = mpath.stat().st_size
            if m != n:
                fail(mpath, f"holds {m:,} entries but {path.name} holds {n:,} tokens")
        if not scan:
            continue
        mm = np.memmap(path, dtype=dtype, mode="r")
        for i, mx in _scan(mm, CHECK_CHUNK, np.max):
            if mx >= V:
                bad = int(np.argmax(np.asarray(mm[i:i + CHECK_CHUNK]) >= V))
                fail(path, f"token id {int(mx)} (first out of range at token {i + bad:,}) is >= vocab_size {V}")
        del mm
        if mpath.exists():
            mask = np.memmap(mpath, dtype=np.uint8, mode="r")
            if not any(hit for _, hit in _scan(mask, CHECK_CHUNK, np.any)):
                fail(mpath, "scores no token (all zeros)")
            del mask
    return meta


def check_dataset(data_dir, splits=("train", "val")):
    """Check the dataset in data_dir for training and return its meta.json as a dict.

    Raises PrepareError with one line that names the wrong file, says what is
    wrong and gives the command that rebuilds the dataset (meta["prepare"] when
    meta.json is readable, else prepare_command(<folder name>)), for: a missing
    folder or meta.json; meta.json that is not valid JSON, or lacks an integer
    vocab_size >= 1, or has a dtype that is not an unsigned integer type wide
    enough for the vocabulary (a missing dtype means uint16, and the returned meta
    then says so), or a
    bad row_len/tokens entry; for each split in splits: a missing {split}.bin, one
    whose size is not a multiple of the dtype's size, an empty one, a token count
    other than meta["tokens"][split] (when recorded), with row_len a count that is
    not a multiple of it, a {split}_mask.bin whose length differs from the .bin's,
    a token id >= vocab_size, a mask that scores no token. The scans read
    CHECK_CHUNK tokens at a time, so memory stays small."""
    return _check(data_dir, tuple(splits))


def _check_stage(stage):
    """A staged set must be complete and agree with its meta.json (staged_dataset)."""
    have = sorted(p.name[:-4] for p in stage.glob("*.bin") if not p.name.endswith("_mask.bin"))
    meta = _check(stage, have, scan=False, hint="a bug in the prepare script")
    tokens = meta.get("tokens")
    if not isinstance(meta.get("prepare"), str) or not isinstance(tokens, dict) or sorted(tokens) != have:
        raise PrepareError(f"{stage / 'meta.json'}: no \"prepare\" command, or \"tokens\" does not list the splits "
                           f"{have} (a bug in the prepare script)")


# -----------------------------------------------------------------------------
# reading a dataset: the batches train.py draws (torch is imported on first use,
# so that the prepare scripts never load it)

def make_gen(*key):
    """A torch.Generator seeded from a tuple of ints, e.g. (seed, iter, micro)."""
    import torch
    g = torch.Generator()
    g.manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1, np.uint64)[0] >> 1))
    return g


class Data:
    """Token memmaps of one dataset, with optional loss masks and fixed rows.

    Training batches are drawn from a generator seeded by (seed, iter, global
    micro-step), so the sampler's whole state is the iteration number: a resumed
    run draws exactly the batches the uninterrupted run would have, and N DDP
    ranks together draw exactly the global batch of one process. Raises
    PrepareError (one line) for a dataset that cannot be trained on.

    Every file is opened once, here, and read through those handles: a prepare run
    that swaps a new set in (renames) and deletes this one cannot change the data
    under a run, which keeps reading the set it checked. identity (meta.json's
    SHA-256 and every split file's size) is what a checkpoint records, so that a
    resume can tell whether it continues on the same data (data_changes)."""

    def __init__(self, data_dir, block_size, splits):
        self.meta = check_dataset(data_dir, splits)  # every split's size, dtype, rows, mask and largest id, once
        self.dir = data_dir
        self.dtype = np.dtype(self.meta["dtype"])
        self.files, sizes = {}, {}
        folder = os.open(data_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:  # every file from the same folder (a swap renames whole folders)
            with os.fdopen(os.open("meta.json", os.O_RDONLY, dir_fd=folder), "rb") as f:
                meta_bytes = f.read()
            for name in sorted(DATASET_FILES - {"meta.json"}):
                try:
                    fd = os.open(name, os.O_RDONLY, dir_fd=folder)
                except FileNotFoundError:
                    continue
                sizes[name] = os.fstat(fd).st_size
                if name.removesuffix(".bin").removesuffix("_mask") in splits:
                    self.files[name] = os.fdopen(fd, "rb")
                else:
                    os.close(fd)
        finally:
            os.close(folder)
        try:
            same = {"dtype": "uint16", **json.loads(meta_bytes)} == self.meta
        except ValueError:
            same = False
        if not same or any(f"{s}.bin" not in self.files for s in splits):
            raise PrepareError(f"{data_dir} changed while train.py read it (a prepare run?); run train.py again")
        self.identity = {"meta_sha256": hashlib.sha256(meta_bytes).hexdigest(), "bytes": sizes}
        self.row_len = self.meta.get("row_len")
        if self.row_len and block_size < self.row_len - 1:
            raise PrepareError(f"dataset rows hold {self.row_len} tokens, so block_size must be at least "
                               f"{self.row_len - 1}; got block_size={block_size}")
        self.T = self.row_len - 1 if self.row_len else block_size
        for split in splits:
            n, need = len(self.arrays(split)[0]), self.row_len or self.T + 1
            if n < need:
                raise PrepareError(f"{data_dir}/{split}.bin holds {n} tokens, fewer than one sequence "
                                   f"({need}); use a smaller block_size or a larger split")

    def arrays(self, split, masked=True):
        """(tokens, mask) memmaps of a split; mask None without {split}_mask.bin or
        with masked=False (then every token is a target: train.py's train_mask=False)."""
        # a fresh memmap per batch, as nanoGPT does, avoids a memory leak (of the handles opened at the start)
        data = np.memmap(self.files[f"{split}.bin"], dtype=self.dtype, mode="r")
        mfile = self.files.get(f"{split}_mask.bin") if masked else None
        return data, (np.memmap(mfile, dtype=np.uint8, mode="r") if mfile is not None else None)

    def starts(self, split, n, gen):
        """n random sequence starts."""
        import torch
        data, _ = self.arrays(split)
        if self.row_len:
            return torch.randint(len(data) // self.row_len, (n,), generator=gen) * self.row_len
        return torch.randint(len(data) - self.T, (n,), generator=gen)

    def eval_starts(self, split, n, iters, seed, full=False):
        """The eval's batches of n starts: iters fixed random batches (the same at
        every eval), or, with full, every row / non-overlapping window of the split."""
        import torch
        if full:
            data, _ = self.arrays(split)
            count = len(data) // self.row_len if self.row_len else (len(data) - 1) // self.T
            return list((torch.arange(count) * (self.row_len or self.T)).split(n))
        split_id = {"train": 0, "val": 1, "test": 2}.get(split, 3)
        return [self.starts(split, n, make_gen(seed, split_id, k)) for k in range(iters)]

    def batch(self, split, starts, device, masked=True):
        import torch
        data, mask = self.arrays(split, masked)
        # one fancy-indexed gather for all rows: a Python loop over rows costs milliseconds per
        # step, which is most of a step for the small task models
        ix = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.T + 1)
        w = torch.from_numpy(data[ix].astype(np.int64))
        x, y = w[:, :-1].contiguous(), w[:, 1:].contiguous()
        m = torch.from_numpy(mask[ix[:, 1:]].astype(np.float32)) if mask is not None else None
        if "cuda" in str(device):
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
            m = m.pin_memory().to(device, non_blocking=True) if m is not None else None
        else:
            x, y, m = x.to(device), y.to(device), (m.to(device) if m is not None else None)
        return x, y, m


def data_changes(old, new):
    """What differs between two Data.identity records, one phrase each (empty: the
    same data, as far as meta.json and the file sizes tell)."""
    out = [] if old.get("meta_sha256") == new["meta_sha256"] else ["meta.json differs"]
    for name in sorted(set(old.get("bytes", {})) | set(new["bytes"])):
        a, b = (d.get("bytes", {}).get(name) for d in (old, new))
        if a != b:
            out.append(f"{name}: " + " -> ".join("absent" if n is None else f"{n:,} bytes" for n in (a, b)))
    return out


# -----------------------------------------------------------------------------
# the tokens an eval script scores (eval_extrapolation.py, eval_frequencies.py)

def vocab_key(meta):
    """Which tokenizer a meta.json describes: "gpt2", its character list (as JSON), or None."""
    return "gpt2" if meta.get("tokenizer") == "gpt2" else json.dumps(meta["itos"]) if "itos" in meta else None


def _text_chunks(path, chunk_chars):
    """A text file in pieces cut just after a "\\n" with non-whitespace on both sides: no gpt2 pre-token
    spans such a point (and a character codec never cares), so the pieces tokenize to exactly the tokens
    of the whole file, without a book-sized string in memory."""
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
        for lineno, line in filter(lambda x: x[1].strip(), enumerate(f, 1)):  # blank lines hold no document
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
                raise PrepareError(f'{path}:{lineno}: expected an object with a "text" string')
            yield doc["text"]


def _split_tokens(path, meta, ckpt):
    """A prepared split X.bin as a read-only memmap, checked as check_dataset checks it (without the scan of
    every id: the scripts check the ids they read against their model)."""
    folder, name = Path(os.path.abspath(path)).parent, os.path.basename(path)
    if not (folder / "meta.json").is_file():
        raise PrepareError(f"{path}: no meta.json beside it ({folder / 'meta.json'}); prepare/ writes each X.bin "
                           "with a meta.json")
    if not name.endswith(".bin"):
        raise PrepareError(f"{path}: a prepared split's name ends in .bin; rename it")
    data_meta = _check(folder, (name[:-4],), scan=False)
    a, b = vocab_key(data_meta), vocab_key(meta)
    if a and b and a != b:
        raise PrepareError(f"{path} was tokenized with a different vocabulary than {ckpt}'s training data "
                           f"({'gpt2' if a == 'gpt2' else 'characters'} vs {'gpt2' if b == 'gpt2' else 'characters'}"
                           "); give data of its dataset")
    if (folder / f"{name[:-4]}_mask.bin").is_file():
        log(f"note: the loss mask of {path} is ignored: every token is scored")
    return np.memmap(path, dtype=np.dtype(data_meta["dtype"]), mode="r")


def read_tokens(path, meta, need, ckpt="the checkpoint", docs=None, chunk_chars=1 << 20, dataset=None):
    """The token ids at path for a checkpoint whose training data had the meta.json meta (ckpt names it in
    errors). X.bin, a prepared split: the whole file as a read-only memmap (only what is used is read), checked
    against the meta.json beside it as check_dataset checks a split, and refused when that dataset's tokenizer is
    not meta's. Text, tokenized with meta's tokenizer up to `need` ids (int64): X.txt as one text, or the
    documents of X.jsonl ({"text": ...} a line) or, when given, of the iterable docs (strings), each ending as in
    the training data (<|endoftext|> for gpt2, "\\n\\n" for characters that include "\\n"); a vocabulary of token
    names (JSB's) takes no text. Raises PrepareError (one line naming the problem and the fix; dataset, the
    checkpoint's, names the .bin to pass instead)."""
    kind = "docs" if docs is not None else os.path.splitext(path)[1].lower()
    if kind not in ("docs", ".bin", ".txt", ".jsonl"):
        raise PrepareError(f"{path}: give a prepared split X.bin, a text X.txt or documents X.jsonl")
    if kind != "docs" and not os.path.isfile(path):
        raise PrepareError(f"data file {path} not found")
    if kind == ".bin":
        return _split_tokens(path, meta, ckpt)
    if vocab_key(meta) != "gpt2" and any(len(s) != 1 for s in meta.get("itos", ())):  # (codec's says "a prompt")
        raise PrepareError(f"{path}: cannot tokenize text with {ckpt}'s vocabulary (it has multi-character tokens, "
                           f"e.g. JSB's); pass a prepared .bin of that model's dataset, e.g. --data data/"
                           f"{dataset or '<dataset>'}/val.bin")
    try:
        encode, _ = codec(meta)
    except ValueError:
        raise PrepareError(f'{ckpt} has no tokenizer in its meta ("tokenizer": "gpt2" or "itos"); give token ids '
                           "as a .bin") from None
    gpt2 = vocab_key(meta) == "gpt2"
    sep = encode("<|endoftext|>" if gpt2 else "\n\n") if kind != ".txt" and (gpt2 or "\n" in meta["itos"]) else []
    docs = _text_chunks(path, chunk_chars) if kind == ".txt" else _jsonl_docs(path) if kind == ".jsonl" else docs
    out, n = [np.zeros(0, dtype=np.int64)], 0
    try:
        for text in docs:
            out.append(np.asarray(encode(text) + sep, dtype=np.int64))
            if (n := n + len(out[-1])) >= need:
                break
    except UnicodeDecodeError as e:  # (a ValueError: first)
        raise PrepareError(f"{path} is not UTF-8 text (byte 0x{e.object[e.start]:02x}); give a UTF-8 file") from None
    except ValueError as e:
        raise PrepareError(f"{path}: cannot tokenize with {ckpt}'s vocabulary: {e}") from None
    return np.concatenate(out)[:need]


# -----------------------------------------------------------------------------
# network

def download(url, dest, hint, timeout=15.0):
    """Fetch url to dest (skipped when dest exists). Any network failure
    raises PrepareError at once with `hint` (what to download, what to pass
    as --input); the socket timeout bounds every wait."""
    import urllib.error
    import urllib.request
    dest = Path(dest)
    if dest.exists():
        return dest
    created = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    log(f"downloading {url} -> {dest}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r, open(part, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0) or None
            with progress(total=total, desc=dest.name, unit="B") as bar:
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        if part.exists():
            part.unlink()
        if created:
            try:
                dest.parent.rmdir()  # the folder made for the download, if still empty
            except OSError:
                pass
        raise PrepareError(f"could not download {url} ({e}). {hint}") from e
    os.replace(part, dest)
    return dest


def input_or_download(path, url, out_dir, hint):
    """--input's path when given; else url's file, downloaded once (download) into the
    dataset's download cache, out_dir/raw/, which a re-run keeps."""
    if path is not None:
        return path
    return download(url, dataset_target(out_dir) / DOWNLOADS / url.rsplit("/", 1)[-1], hint)


def run_main(main_fn, argv=None):
    """Call main_fn(argv); print a PrepareError (or an OSError) as one line
    'error: ...' and exit 2."""
    try:
        main_fn(argv)
    except PrepareError as e:
        die(e)
    except OSError as e:  # a file error outside the staged writes (which say more): still one line
        die(f"{f'{e.filename}: ' if e.filename else ''}{e.strerror or e}")


if __name__ == "__main__":  # (a module: run, it only says what it is)
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print("prepare/common.py is a module imported by the prepare/ scripts, train.py and the eval scripts; "
          "see --help", file=sys.stderr)
