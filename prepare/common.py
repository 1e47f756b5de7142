"""Shared helpers for the prepare/ scripts: output paths, .bin/meta.json
writing (atomic, byte-identical on re-runs), a progress bar (tqdm when it is
installed, else a small periodic printer), optional imports and a download
helper that fails fast when offline.
"""

import importlib
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
SPLITS = ("train", "val", "test")


class PrepareError(Exception):
    """A user-facing error: bad or empty input, a missing optional package,
    no network. main() prints it as one line and exits with status 2."""


def default_out_dir(name):
    return REPO_ROOT / "data" / name


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

class _Printer:
    """Fallback progress reporter with tqdm's small subset of the API:
    iterate over it, or call update(n); prints a line at most every
    `every` seconds and once at the end."""

    def __init__(self, iterable=None, total=None, desc="", unit="it", every=2.0):
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)
        self.n, self.every = 0, every
        self.t0 = self.last = time.time()
        self.closed = False

    def _print(self):
        el = time.time() - self.t0
        if self.total:
            msg = f"{self.desc}: {self.n:,}/{self.total:,} {self.unit} ({100.0 * self.n / self.total:.0f}%)"
        else:
            msg = f"{self.desc}: {self.n:,} {self.unit}"
        print(f"{msg} [{el:.1f}s]", file=sys.stderr, flush=True)

    def update(self, n=1):
        self.n += n
        now = time.time()
        if now - self.last >= self.every:
            self.last = now
            self._print()

    def close(self):
        if not self.closed:
            self.closed = True
            self._print()

    def __iter__(self):
        try:
            for x in self.iterable:
                yield x
                self.update(1)
        finally:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def progress(iterable=None, total=None, desc="", unit="it"):
    """tqdm(iterable, total, desc, unit) if tqdm is importable (and
    POPE_NO_TQDM is unset), else the periodic printer above."""
    if not os.environ.get("POPE_NO_TQDM"):
        try:
            from tqdm import tqdm
            return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit != "it",
                        mininterval=1.0, file=sys.stderr)
        except ImportError:
            pass
    return _Printer(iterable, total=total, desc=desc, unit=unit)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -----------------------------------------------------------------------------
# writing

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
        a.tofile(self.f)
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
    them all, and each writer's .count holds its tokens."""
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
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, out_dir / "meta.json")


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


def run_main(main_fn, argv=None):
    """Call main_fn(argv); print a PrepareError as 'error: ...' and exit 2."""
    try:
        main_fn(argv)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
