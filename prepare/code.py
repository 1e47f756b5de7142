"""Python source code as GPT-2 BPE tokens: one document per .py file, split by package.

Usage:
    python prepare/code.py               # the pinned wheels (below), fetched into data/code/raw/
    python prepare/code.py --wheels DIR  # the pinned wheels from DIR (the missing fetched into it)
    python prepare/code.py --input DIR --val_packages a --test_packages b,c --out_dir data/mycode

Source: the pure-Python wheels (py3-none-any) of PACKAGES, from PyPI, listed below with each
package's license as its METADATA states it. Missing ones are fetched with `pip download --no-deps
--only-binary=:all: NAME==VERSION` (pure wheels only). Every wheel's sha256 is checked against its
pin before any is read; a mismatch is refused (exit 2, nothing written). Offline (a GPU machine),
pass the folder of pinned wheels with --wheels. With --input DIR instead, code of your own: every
entry of DIR is a package: a wheel (named by its METADATA), a folder (the .py files under it; a
site-packages works) or one .py file; entries without a .py file are skipped.

Split by package: train, val and test hold disjoint packages, so the held-out files are code of
projects the model has not seen. PACKAGES fixes the assignment of the pinned wheels; with --input,
--val_packages and --test_packages name the held-out ones (the rest is train).

Documents: the .py files of a package in sorted path order, the packages of a split in sorted name
order, the splits in the order train, val, test. A document is the file's text, decoded strictly as
UTF-8 and otherwise unchanged; a file that is not valid UTF-8 is skipped and counted (meta.json's
"not_utf8" names it). Also dropped: files of whitespace alone, and exact duplicates (the same bytes,
by sha256) of a file read before, so a held-out file that repeats a train file leaves its split.
Each document is tiktoken gpt2's encode_ordinary of the text, then <|endoftext|> (50256), as uint16;
the files are the same on a re-run. Nothing is cut: every file is one whole document, so the test
split's long files (meta.json's "long_test_files": at least 10,240 tokens, 10x the 1,024 context of
config/code_124m.py) are read whole by eval_extrapolation.py.
"""

import email.parser
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from prepare import common

NAME = "code"
EOT = 50256
LONG = 10240  # tokens: a test file that fills eval_extrapolation.py's longest window (10 x 1024)
BATCH_FILES = 256  # files tokenized at once
PIP = ["download", "--no-deps", "--only-binary=:all:", "--platform", "any", "--implementation",
       "py", "--abi", "none", "--ignore-requires-python"]  # (the source is read, never run)

# wheel, split, bytes, tokens it adds (the files dropped left out), license as its METADATA
# states it; its sha256
PACKAGES = [
    ("dask-2026.11.0-py3-none-any.whl", "train", 1_497_453, 2_719_373, "BSD-3-Clause",
     "3d826d9448c6834ccd1e0a9c932caa249e5a138aee254db791a0153c0a357f6d"),
    ("jax-0.12.1-py3-none-any.whl", "train", 3_660_228, 6_197_870, "Apache-2.0",
     "617d896256e0e3781f5e6b0e5bcdbe49b038d63f69d37dd8de1edf0f1c9f0573"),
    ("keras-3.15.1-py3-none-any.whl", "train", 2_398_595, 5_223_932, "Apache License 2.0",
     "836460e480930acbd19bb7a17e62f9ecad40e8a9af9a651fc8d0586a96d27e20"),
    ("mpmath-1.4.1-py3-none-any.whl", "train", 567_787, 1_081_179, "BSD-3-Clause",
     "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f"),
    ("pennylane-0.45.1-py3-none-any.whl", "train", 5_414_360, 11_457_823, "Apache-2.0",
     "b8cc7f590c43281b6e35b3a35707e9583c6b7babeb31dcf6f1cbde32a754ab93"),
    ("pygments-2.21.0-py3-none-any.whl", "train", 1_250_147, 2_425_852, "BSD-2-Clause",
     "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"),
    ("sympy-1.14.0-py3-none-any.whl", "train", 6_299_353, 12_717_939, "BSD",
     "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5"),
    ("textual-8.2.8-py3-none-any.whl", "train", 731_418, 1_239_456, "MIT",
     "267375fd402dc8d981457212efa71f0e3365fd17bba144ba9bb3ed7563cb374a"),
    ("twisted-26.10.0-py3-none-any.whl", "train", 3_251_703, 5_536_324, "MIT",
     "3732f42af218925a0fe78d6668db55853f7fb532245a89a2669babe7d3000fa8"),
    ("networkx-3.7-py3-none-any.whl", "val", 2_142_205, 3_056_193, "BSD-3-Clause",
     "e3fd2c13a7814cee3746340d8d7f8598a67f16a58bf47fb7f8793fab6efca1b0"),
    ("sqlalchemy-2.1.9-py3-none-any.whl", "test", 2_071_860, 3_778_405, "MIT",
     "449fed5c2caa3b278cc57499d09db001fb3f28dc7f18affc48142aee4dcc0cdf"),
    ("xarray-2026.9.0-py3-none-any.whl", "test", 1_445_445, 3_217_499, "Apache-2.0",
     "fe349fa871628b1a0a5217af3fe1283a2862d5485156e6eda354fffb81c3bb7c"),
]


def norm(name):
    """A package name as PyPI compares them (PEP 503): lower case, a run of - _ . as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        chunk = f.read(1 << 20)
        while chunk:
            h.update(chunk)
            chunk = f.read(1 << 20)
    return h.hexdigest()


# -----------------------------------------------------------------------------
# packages: a wheel, a folder or a .py file

def wheel_metadata(path):
    """(name, version, license) from a wheel's METADATA; the license: its License-Expression, else
    the first line of its License, else its License classifiers."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            text = z.read(names[0]).decode("utf-8", "replace") if names else ""
    except zipfile.BadZipFile as e:
        raise common.PrepareError(f"{path}: not a wheel (zip) file ({e})") from None
    msg = email.parser.HeaderParser().parsestr(text)
    classifiers = [c.split(" :: ")[-1] for c in msg.get_all("Classifier", [])
                   if c.startswith("License ::")]
    license = msg.get("License-Expression") or (msg.get("License") or "").strip().split("\n")[0]
    name = msg.get("Name") or path.name.split("-")[0]
    return name, msg.get("Version", ""), license or ", ".join(classifiers) or "not stated"


def python_files(path):
    """(relative path, bytes) of each .py file of a package, sorted by path: a wheel's members, the
    files under a folder, or a .py file itself."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            return [(n, z.read(n)) for n in sorted(z.namelist()) if n.endswith(".py")]
    if path.is_dir():
        files = sorted((p.relative_to(path).as_posix(), p) for p in path.rglob("*.py"))
        return [(rel, p.read_bytes()) for rel, p in files if p.is_file()]
    return [(path.name, path.read_bytes())]


def pinned_packages(folder):
    """PACKAGES as package dicts, their wheels in folder (those missing fetched with pip), every one
    checked against its sha256 before any is read."""
    folder.mkdir(parents=True, exist_ok=True)
    missing = [row[0] for row in PACKAGES if not (folder / row[0]).is_file()]
    if missing:
        specs = ["==".join(w.split("-")[:2]) for w in missing]
        common.log(f"fetching {len(specs)} wheels with pip into {folder}")
        r = subprocess.run([sys.executable, "-m", "pip", *PIP, "--dest", str(folder), *specs])
        still = [w for w in missing if not (folder / w).is_file()]
        if still:
            raise common.PrepareError(f"pip could not fetch {', '.join(still)} (exit "
                                      f"{r.returncode}); offline, pass a folder of the pinned "
                                      "wheels (--help) as --wheels")
    for wheel, *_, pin in PACKAGES:
        digest = sha256(folder / wheel)
        if digest != pin:
            raise common.PrepareError(f"{folder / wheel}: sha256 {digest} is not the pinned {pin}; "
                                      "delete the file (a re-run fetches the pinned one)")
    packages = []
    for wheel, split, _, tokens, _, pin in PACKAGES:
        name, version, license = wheel_metadata(folder / wheel)
        packages.append({"name": name, "version": version, "license": license, "split": split,
                         "source": wheel, "sha256": pin, "path": folder / wheel, "pinned": tokens})
    return packages


def input_packages(folder, val, test):
    """The packages of an --input folder as package dicts; val, test: comma lists of names."""
    folder = Path(folder)
    if not folder.is_dir():
        raise common.PrepareError(f"--input {folder} is not a folder")
    found = {}
    for path in sorted(folder.iterdir()):
        if path.suffix == ".whl":
            name, version, license = wheel_metadata(path)
        elif path.suffix == ".py" and path.is_file():
            name, version, license = path.stem, "", "not stated"
        elif path.is_dir() and any(path.rglob("*.py")):
            name, version, license = path.name, "", "not stated"
        else:
            continue  # (a .dist-info folder, data files)
        if norm(name) in found:
            raise common.PrepareError(f"{folder}: two entries are package {name}: "
                                      f"{found[norm(name)]['source']} and {path.name}")
        found[norm(name)] = {"name": name, "version": version, "license": license, "split": "train",
                             "source": path.name, "path": path}
    names = ", ".join(p["name"] for p in list(found.values())[:12])
    if len(found) > 12:  # (a site-packages: hundreds)
        names += f" ... ({len(found)} in all)"
    if not found:
        raise common.PrepareError(f"--input {folder} holds no package (a .whl, .py files)")
    if not (val and test):
        raise common.PrepareError(f"name the held-out packages of {folder} with --val_packages A,B "
                                  f"and --test_packages C,D (it holds: {names})")
    for split, given in (("val", val), ("test", test)):
        for name in given.split(","):
            if norm(name) not in found:
                raise common.PrepareError(f"--{split}_packages: {folder} holds no package {name!r} "
                                          f"(it holds: {names})")
            if found[norm(name)]["split"] != "train":
                raise common.PrepareError(f"{name} is in both --val_packages and --test_packages")
            found[norm(name)]["split"] = split
    return list(found.values())


# -----------------------------------------------------------------------------
# documents

def package_texts(package, seen, dropped):
    """The documents of a package: its .py files but those dropped (a file whose bytes are in seen,
    one not UTF-8, one of whitespace alone), counted in dropped; seen gets each file's sha256."""
    texts = []
    for rel, data in python_files(package["path"]):
        digest = hashlib.sha256(data).digest()
        if digest in seen:
            dropped["duplicate"] += 1
            continue
        seen.add(digest)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            dropped["not_utf8"].append(f"{package['source']}/{rel}")
            continue
        if not text.strip():
            dropped["empty"] += 1
            continue
        texts.append(text)
    return texts


def write_splits(stage, packages, enc, num_proc):
    """Every package's documents into stage/{split}.bin, the train packages first (a file that
    comes again later is a duplicate); sets each package's files and tokens. Returns the tokens and
    files of each split, the files dropped and the long test files."""
    seen = set()
    dropped = {"duplicate": 0, "empty": 0, "not_utf8": []}
    files = dict.fromkeys(common.SPLITS, 0)
    long = []
    with common.split_writers(stage, common.SPLITS) as writers:
        for split in common.SPLITS:
            ours = [p for p in packages if p["split"] == split]
            for p in sorted(ours, key=lambda p: norm(p["name"])):
                texts = package_texts(p, seen, dropped)
                start = writers[split].count
                for i in range(0, len(texts), BATCH_FILES):
                    ids = enc.encode_ordinary_batch(texts[i:i + BATCH_FILES], num_threads=num_proc)
                    writers[split].write(np.concatenate([np.array(d + [EOT], np.uint16)
                                                         for d in ids]))
                    long += [len(d) for d in ids if split == "test" and len(d) >= LONG]
                p.update(files=len(texts), tokens=writers[split].count - start)
                files[split] += len(texts)
            if files[split] == 0:
                raise common.PrepareError(f"split '{split}' has no file left: its packages hold no "
                                          "new, non-empty UTF-8 .py file")
    long_files = {"min_tokens": LONG, "files": len(long), "tokens": sum(long)}
    return {s: w.count for s, w in writers.items()}, files, dropped, long_files


# -----------------------------------------------------------------------------
# main

def packages_table():
    """--help's list of the pinned packages: split, name, version, wheel size, tokens, license."""
    rows = []
    size = 0
    tokens = dict.fromkeys(common.SPLITS, 0)
    for wheel, split, n, t, license, _ in PACKAGES:
        name, version = wheel.split("-")[:2]
        rows.append(f"  {split:5} {name:10} {version:10} {n / 2**20:5.2f} MiB {t:>11,}  {license}")
        size += n
        tokens[split] += t
    totals = ", ".join(f"{s} {n:,}" for s, n in tokens.items())
    return ("pinned packages (https://pypi.org/project/NAME/VERSION/):\n"
            "  split name       version    wheel          tokens  license\n" + "\n".join(rows)
            + f"\n  {len(PACKAGES)} wheels, {size / 2**20:.2f} MiB; tokens {totals}")


def build_parser():
    p = common.script_parser(__doc__, NAME, help="a folder of packages (.whl files, folders, .py "
                             "files) instead of the pinned wheels")
    p.epilog = packages_table()
    p.add_argument("--wheels", help="the folder of the pinned wheels; those missing are fetched "
                   "into it (default: <out_dir>/raw)")
    p.add_argument("--val_packages", help="with --input: comma list of the packages of val")
    p.add_argument("--test_packages", help="with --input: comma list of the packages of test")
    p.add_argument("--num_proc", type=int, default=min(8, os.cpu_count() or 1),
                   help="tokenizer threads")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.input and args.wheels:
        raise common.PrepareError("give --input (your packages) or --wheels (the pinned), not both")
    if not args.input and (args.val_packages or args.test_packages):
        raise common.PrepareError("the pinned packages' split is fixed (code.py's PACKAGES); "
                                  "--val_packages and --test_packages go with --input")
    enc = common.gpt2_encoding()  # fail before any work if the BPE files are missing
    with common.staged_dataset(args.out_dir) as stage:
        if args.input:
            packages = input_packages(args.input, args.val_packages, args.test_packages)
        else:
            wheels = args.wheels or os.path.join(os.path.realpath(args.out_dir), common.DOWNLOADS)
            packages = pinned_packages(Path(wheels))
        threads = max(1, args.num_proc)
        counts, files, dropped, long_files = write_splits(stage, packages, enc, threads)
        for p in packages:
            del p["path"]
            pinned = p.pop("pinned", None)
            if pinned is not None and pinned != p["tokens"]:
                common.log(f"warning: {p['name']} gave {p['tokens']:,} tokens, not the {pinned:,} "
                           "of PACKAGES (another tiktoken?)")
        meta = {
            "format": NAME,
            "prepare": common.command_line(NAME, parser, args),
            "tokenizer": "gpt2",
            "vocab_size": 50257,
            "dtype": "uint16",
            "eot_id": EOT,
            "documents": files,
            "tokens": counts,
            "packages": packages,
            "dropped": dropped,
            "long_test_files": long_files,
            "source": common.repo_path(args.input) if args.input else "PyPI: PACKAGES' wheels",
        }
        common.write_meta(stage, meta)
    if dropped["not_utf8"]:
        common.log(f"skipped {len(dropped['not_utf8'])} files not UTF-8 (meta.json: not_utf8)")
    shown = {}
    for split, n in files.items():
        shown[split] = f"{n:,} file" if n == 1 else f"{n:,} files"
    common.report(args.out_dir, counts, shown)
    return counts


if __name__ == "__main__":
    common.run_main(main)
