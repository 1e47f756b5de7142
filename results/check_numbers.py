"""
Which committed file backs each number of RESULTS.md and README.md? A markdown table on stdout: line, section,
number, context, and the files under results/ that hold it, or NO FILE.

Usage:
  python results/check_numbers.py                        # RESULTS.md and README.md against results/
  python results/check_numbers.py --missing RESULTS.md   # only the numbers that no file holds
  python results/check_numbers.py --strict               # exit 1 if any number has no file (for CI)

Where to look: the files that the number's section names (a path under results/ anywhere in it: a file, a folder,
a glob such as results/sample/bench-sample*.{log,json}); a section that names no path under results/ (the summary,
README.md's prose) is checked against all of them. Sources are the files git tracks in results/'s subfolders (raw
outputs; results/*.py, *.sh and *.md are scripts and pages written by hand), every file there without git.

Found: a file holds the same digits (thousands separators ignored), or a value that rounds to the number at its
decimals (0.87491 -> 0.8749; with %, also 0.8749 -> 87.49%; integers only from 100 up: 774.3 -> 774). A number
derived from others (a mean, a ratio, a difference) has NO FILE unless a file holds it.

What counts as a number (a simple rule; a person reads the rows):
  skipped: headings, code (fenced or indented blocks, `spans`), link targets, table header rows and first columns
  (labels), the clause that says "paper" (clauses end at ( ) ; and ". ") and table columns headed "paper";
  dates, commit hashes (7+ hex characters or digits), versions (1.2.3), arXiv ids, numbers inside names (H200, sm_90,
  GPT-2, 2π, 5e-3, 20-token); settings: sizes with k/M/B/G (124M, 100k), an integer followed by × (10×), products
  (32 × 512), assignments (s = 4), seed and section numbers (seeds 1337 / 1338, §7, sections 3, 4 and 7), a number
  after a setting's name (batch 64, lr, dropout 0.3, β2 0.99, clip, decay, dim, base, context 1024, vocab 50,257)
  or before a setting's noun (6 layers, 8 heads, 384 wide, 1,200 steps, 500 iterations, 2048 tokens), and integers
  below 10 without % or × (counts).
"""

import argparse
import bisect
import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NUM = re.compile(r"(?<![\w.,/^=#-])(?<![A-Za-z]-)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
                 r"(?P<unit>%|×|[kMBG](?![A-Za-z]))?(?![\w.]?\d|[\w^]|-[A-Za-z])")
BLANK = [r"`[^`\n]*`", r"\]\([^)\n]*\)", r"\b\d{4}-\d{2}-\d{2}\b", r"\b\d+\.\d+\.\d+[\w.+]*", r"arXiv:? ?\d{4}\.\d+",
         r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", r"\b\d{7,}\b",
         r"(?i)\b(?:seeds?|sections?|§)\s*\d+(?:\s*(?:,|/|and|or|–)\s*\d+)*", r"§\d+", r"=\s*\d[\d.]*",
         r"\d[\d,.]*\s*×\s*\d[\d,.]*(?:\s*×\s*\d[\d,.]*)*",
         r"(?i)\b(?:batch|lr|dropout|β[12]|clip|decay|dim|base|context)\s+\d[\d,.]*(?<!\.)",
         r"(?i)\bvocab(?:ular(?:y|ies))?\s+(?:of\s+|over\s+)?\d[\d,.]*(?<!\.)"]
SETTING = re.compile(r"\s*(?:layers?|heads?|wide|seeds?|GPUs?|H200s?|steps?|iterations?|iters|warmup|epochs?|"
                     r"chorales|examples|tokens?|rows?|passes|micro-steps|ranks?)\b")


def blank(text):
    """text with what is never a measurement (code, dates, hashes, versions, seeds, settings) replaced by spaces:
    the offsets of the rest stay."""
    for pattern in BLANK:
        text = re.sub(pattern, lambda m: " " * len(m.group()), text)
    return text


def numbers(text):
    """(offset, number as written, unit) of each number in text that the rule counts."""
    out = []
    for clause in re.finditer(r"(?:[^();.]|\.(?!\s))+", blank(text)):  # clauses end at ( ) ; and sentence ends
        if "paper" in clause.group().lower():
            continue
        for m in NUM.finditer(clause.group()):
            s, unit, after = m.group(1), m.group("unit") or "", clause.group()[m.end():]
            if unit in ("k", "M", "B", "G") or unit == "×" and "." not in s or SETTING.match(after):
                continue  # a size, a multiple of a setting (10×), a setting's noun (6 layers)
            if not unit and "." not in s and int(s.replace(",", "")) < 10:
                continue  # a count
            out.append((clause.start() + m.start(1), s, unit))
    return out


def snippet(line, at, width, pad=40):
    a, b = max(0, at - pad), min(len(line), at + width + pad)
    return ("…" if a else "") + line[a:b].strip().replace("|", "\\|") + ("…" if b < len(line) else "")


def table_numbers(line, header):
    """(column, number, unit, context) of a table row, but for its first cell (the row's label) and the columns
    headed "paper"; none if the label says "paper"."""
    cells = line.strip().strip("|").split("|")
    if "paper" in cells[0].lower():
        return []
    out, col = [], line.index("|") + 1 + len(cells[0]) + 1  # where cells[1] starts in line
    for head, cell in zip(header[1:], cells[1:]):
        if "paper" not in head.lower():
            out += [(s, unit, snippet(line, col + off, len(s))) for off, s, unit in numbers(cell)]
        col += len(cell) + 1
    return out


def doc_numbers(path):
    """The sections of a markdown file, each {"title", "text", "rows": [(line, number, unit, context)]}."""
    sections, header, fenced, para = [{"title": "", "text": "", "rows": []}], None, False, []

    def flush():  # the prose paragraph read so far, as one text: a sentence may span lines
        starts = [0]
        for _, text in para:
            starts.append(starts[-1] + len(text) + 1)
        for off, s, unit in numbers("\n".join(text for _, text in para)):
            i = bisect.bisect_right(starts, off) - 1
            sections[-1]["rows"].append((para[i][0], s, unit, snippet(para[i][1], off - starts[i], len(s))))
        para.clear()
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        stripped, table = line.strip(), line.strip().startswith("|")
        code = fenced or stripped.startswith("```") or (line.startswith("    ") and not para)
        fenced ^= stripped.startswith("```")
        if code or not stripped or stripped.startswith("#") or table:
            flush()
        if not table:
            header = None
        if stripped.startswith("#") and not code:
            sections.append({"title": stripped.lstrip("#").strip(), "text": "", "rows": []})
            continue
        sections[-1]["text"] += line + "\n"
        if code or not stripped:
            continue
        if table and header is None:
            header = stripped.strip("|").split("|")  # labels
        elif table and not set(stripped) <= set("|-: "):
            sections[-1]["rows"] += [(n, *row) for row in table_numbers(line, header)]
        elif not table:
            para.append((n, line))
    flush()
    return sections


def source_files(results):
    """The raw outputs: tracked files in results/'s subfolders (all files there outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(results), "ls-files", "-z", "."], capture_output=True, text=True,
                             check=True).stdout
        files = [results / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in results.rglob("*") if p.is_file()]
    return sorted(p for p in files if p.parent != results and p.suffix.lower() not in (".png", ".jpg", ".pdf", ".pt"))


def read_numbers(files):
    """Per file: (path relative to results/'s parent, the numbers as written without separators, sorted values)."""
    out = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        found = re.findall(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text)
        found += [x.replace(",", "") for x in re.findall(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", text)]
        out.append((p, set(found), sorted(float(x) for x in found)))
    return out


def braces(spec):
    """a{b,c}d -> [abd, acd]"""
    m = re.search(r"\{([^{}]*)\}", spec)
    return [x for alt in m.group(1).split(",") for x in braces(spec[:m.start()] + alt + spec[m.end():])] if m \
        else [spec]


def cited(text, results, files):
    """The files of `files` that a section's text names (paths under results/); None if it names none."""
    specs = [x for s in re.findall(rf"\b{re.escape(results.name)}/[\w.\-/*{{}},]*", text)
             for x in braces(s.rstrip(".,"))]
    if not specs:
        return None
    rel = {p: p.relative_to(results.parent).as_posix() for p in files}
    return {p for p in files for s in specs
            if rel[p] == s or rel[p].startswith(s.rstrip("/") + "/") or fnmatch.fnmatchcase(rel[p], s)}


def find(s, unit, idx):
    """[(file, how)]: the files that hold the number, the same digits first, then a value that rounds to it."""
    digits = s.replace(",", "")
    dec = len(digits.partition(".")[2])
    v, tol = float(digits), 0.5 * 10 ** -dec + 1e-12
    exact = [(p, "") for p, written, _ in idx if digits in written]
    rounded = []
    for p, _, values in idx if (dec or v >= 100) else []:
        for scale in ((1, 100) if unit == "%" else (1,)):
            i = bisect.bisect_left(values, (v - tol) / scale)
            if i < len(values) and values[i] <= (v + tol) / scale and (p, "") not in exact:
                rounded.append((p, f" (≈ {values[i]:g}{' × 100' if scale == 100 else ''})"))
                break
    return exact + rounded


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("docs", nargs="*", default=[str(ROOT / "RESULTS.md"), str(ROOT / "README.md")],
                   help="markdown files to read (default: RESULTS.md and README.md)")
    p.add_argument("--results", default=str(ROOT / "results"), help="the folder of raw outputs (default: results/)")
    p.add_argument("--missing", action="store_true", help="list only the numbers that no file holds")
    p.add_argument("--strict", action="store_true", help="exit with status 1 if any number has no file")
    args = p.parse_args(argv)
    for path in [*args.docs, args.results]:
        if not os.path.exists(path):
            raise SystemExit(f"error: {path} not found")
    results = Path(args.results).resolve()
    idx = read_numbers(files := source_files(results))
    missing = 0
    print("| file:line | section | number | context | source |\n|---|---|---:|---|---|")
    for doc in args.docs:
        for sec in doc_numbers(doc):
            names = cited(sec["text"], results, files)
            here = idx if names is None else [x for x in idx if x[0] in names]
            for line, s, unit, context in sec["rows"]:
                hits = find(s, unit, here)
                missing += not hits
                if hits and args.missing:
                    continue
                src = "; ".join(f"{p.relative_to(results.parent).as_posix()}{how}" for p, how in hits[:2]) + \
                    (f" +{len(hits) - 2} more" if len(hits) > 2 else "") if hits else "NO FILE"
                print(f"| {os.path.basename(doc)}:{line} | {sec['title']} | {s}{unit} | {context} | {src} |")
    print(f"{missing} number(s) that no file holds", file=sys.stderr)
    return 1 if args.strict and missing else 0


if __name__ == "__main__":
    sys.exit(main())
