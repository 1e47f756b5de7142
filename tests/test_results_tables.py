"""RESULTS.md, README.md's results list and results/*/README.md are what results/summarize.py makes
from the committed raw files; their hand-written prose carries no numbers; every file under results/
is read by summarize.py or named in a README; an edit of a sentence or of a raw value is caught."""
import dataclasses
import importlib.util
import itertools
import json
import math
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import eval_extrapolation
import eval_frequencies
from model import GPT, GPTConfig

REPO = Path(__file__).resolve().parent.parent


def summarize(results=REPO / "results"):
    """A fresh results/summarize.py (its own caches and READ) reading the tree at results."""
    spec = importlib.util.spec_from_file_location("summarize", REPO / "results" / "summarize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.R = str(results)
    return module


S = summarize()
# a number in hand-written prose: a decimal (not a version, 2.11.0, nor the paper's arXiv id), a
# percentage, a count "k of n"
NUMBER = re.compile(r"(?<![\w.])(?<!arXiv )\d[\d,]*\.\d+(?![\d.A-Za-z])|\d\s*%|\b\d+ of \d+\b")


def docs(results):
    """{path: text} of the documents summarize.py writes, in the tree of results/ results."""
    paths = [results.parent / "RESULTS.md", results.parent / "README.md", results / "README.md"]
    return {p: p.read_text() for p in paths + sorted(results.glob("*/README.md"))}


def prose_numbers(path, text):
    """The numbers of a document's hand-written prose: outside marked blocks, code spans and links;
    of the top-level README.md, its Results section alone."""
    if (path.parent / "results").is_dir() and path.name == "README.md":
        text = text[text.index("## Results"):text.index("## Benchmarks")]
    return NUMBER.findall(re.sub(r"`[^`]*`|\]\([^)]*\)", "", S.MARKER.sub("", text)))


def unaccounted(results):
    """The files under results (git's, else all) that summarize.py does not read in regenerating
    every document and that no README there names (by a path from its folder, results/, root)."""
    s = summarize(results)
    for path, text in docs(results).items():
        s.READ.add(str(path))
        s.fill(text)
    git = subprocess.run(["git", "ls-files", "-z", "."], cwd=results, capture_output=True,
                         text=True)
    files = [results / f for f in git.stdout.split("\0") if f] if git.returncode == 0 else \
        [p for p in results.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    named = {base / m for readme in results.rglob("README.md")
             for m in re.findall(r"[\w./-]+", readme.read_text())
             for base in (readme.parent, results, results.parent)}
    return sorted(str(f.relative_to(results)) for f in files
                  if str(f) not in s.READ and f not in named)


def copy_tree(tmp_path):
    """A scratch copy of what summarize.py reads and writes: results/, prepare/, the documents."""
    tree = tmp_path / "repo"
    for folder in ("results", "prepare"):
        shutil.copytree(REPO / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("RESULTS.md", "README.md"):
        shutil.copy(REPO / name, tree / name)
    return tree


def test_every_block_is_what_the_raw_files_give():
    names = []
    for path, text in docs(REPO / "results").items():
        assert S.fill(text) == text, f"{path} is not what its files give: summarize.py --write"
        names += [m[3] for m in S.MARKER.finditer(text)]
    assert sorted(names) == sorted([*S.TABLES, *S.VERDICTS])  # each block once, none unused


def test_hand_written_prose_carries_no_numbers():
    assert {str(p): prose_numbers(p, t) for p, t in docs(REPO / "results").items()
            if prose_numbers(p, t)} == {}
    prose = "PoPE led on 7 of 8 seeds by 20.5 points (p 0.05, `0.1`, 9%), [a](b/1.5.png)"
    assert prose_numbers(REPO / "RESULTS.md", prose) == ["7 of 8", "20.5", "0.05", "9%"]


def test_every_file_under_results_is_read_or_named(tmp_path):
    assert unaccounted(REPO / "results") == []
    tree = copy_tree(tmp_path)  # a copy with a file nothing reads or names: listed
    (tree / "results" / "tasks" / "jsb-pope-1337-short" / "stray.json").write_text("{}")
    assert unaccounted(tree / "results") == ["tasks/jsb-pope-1337-short/stray.json"]


# each edit of issue 82's list whose sentence still stands, and edits of the same kinds
EDITS = [("RESULTS.md", "+20.5 points", "+25.5 points"), ("RESULTS.md", "t p 0.05;", "t p 0.03;"),
         ("RESULTS.md", "higher on 7 of 8", "higher on 8 of 8"),
         ("RESULTS.md", "first on 7 of 8 seeds, RoPE on 0", "first on 8 of 8 seeds, RoPE on 0"),
         ("RESULTS.md", "| 21.2 | 1.128 |", "| 21.2 | 1.28 |"),
         ("RESULTS.md", "degrades steadily, not a blow-up at this scale", "blows up"),
         ("RESULTS.md", "**reproduced**", "**not reproduced**"),
         ("RESULTS.md", "t p 0.0071;", "t p 0.71;"),
         ("RESULTS.md", "| 1342 | 97.42% (66k)", "| 1342 | 97.43% (66k)"),
         ("RESULTS.md", "final accuracy largely",
          "PoPE leads on 10 of 11 seed pairs; the final accuracy"),
         ("RESULTS.md", "follows the kernel's course.", "follows the kernel's course (p 0.03)."),
         ("README.md", "**too few seeds for a test**", "**not significant**"),
         ("README.md", "(§3): **reproduced**", "(§3): **reproduced**, RoPE's blows up"),
         ("README.md", "the raw files:", "the raw files (PoPE ahead by 20.5 points):")]


@pytest.mark.parametrize("doc, old, new", EDITS)
def test_one_edit_is_caught(doc, old, new):
    text = (REPO / doc).read_text()
    assert old in text
    changed = text.replace(old, new, 1)
    assert S.fill(changed) != changed or \
        prose_numbers(REPO / doc, changed) != prose_numbers(REPO / doc, text)


def test_a_changed_raw_value_is_caught(tmp_path):
    tree = copy_tree(tmp_path)
    path = tree / "results" / "indirect_indexing" / "target" / "seed1342-pope" / "eval.json"
    r = json.loads(path.read_text())
    r["test"]["acc"] += 0.0001
    path.write_text(json.dumps(r))
    s = summarize(tree / "results")
    assert any(s.fill(text) != text for text in docs(tree / "results").values())


def run_files(folder, name, test_acc, val_accs):
    """A run as the driver leaves it: its log (an eval every 2,000 steps), metrics and eval.json."""
    (folder / name).mkdir(parents=True)
    steps = [2000 * i for i in range(len(val_accs))]
    (folder / f"{name}.log").write_text("".join(
        f"step {s}: train loss 1.0 acc {a:.4f}, val loss 1.1 acc {a:.4f}\niter {s}: loss 1.0\n"
        for s, a in zip(steps, val_accs)))
    (folder / name / "metrics.jsonl").write_text("".join(
        json.dumps({"iter": s, "eval": {"val": {"loss": 1.1, "acc": a}}}) + "\n"
        for s, a in zip(steps, val_accs)))
    split = {"loss": 1.0, "acc": test_acc}
    (folder / name / "eval.json").write_text(json.dumps(
        {"iter": steps[-1], "full": True, "val": split, "test": split}))


def test_a_new_weight_decay_arm_joins_section_1(tmp_path):
    """target-wd0.01/ laid out as target/ is: its endpoints, its pairs by seed and pos_emb against
    target/'s weight-decay-0.1 runs, its longer runs against its own, its provenance and shares."""
    tree = copy_tree(tmp_path)
    shutil.rmtree(tree / "results" / "indirect_indexing" / "target-wd0.01")  # made up below instead
    before = summarize(tree / "results")  # without the folder no generated block names it
    assert all("weight decay 0.01" not in m[4] for t in docs(tree / "results").values()
               for m in before.MARKER.finditer(before.fill(t)))
    wd = tree / "results" / "indirect_indexing" / "target-wd0.01"
    accs = {(1337, "pope"): 0.95, (1338, "pope"): 0.30, (1337, "rope"): 0.10, (1338, "rope"): 0.12}
    for (seed, pe), a in accs.items():  # PoPE 1337 lifts off at 40k (above 50%), the others never
        run_files(wd, f"seed{seed}-{pe}", a, [0.05] * 20 + [max(a, 0.2)] * 31)
        run_files(wd, f"seed{seed}-{pe}-200000steps", min(a + 0.5, 0.99), [0.05] * 10 + [0.9] * 91)
    (wd / "env-seed1337_1338-pope_rope.txt").write_text(
        "command: LABEL='wd0.01' bash results/indirect_indexing.sh\ncommit: abc1234\ndirty: no\n"
        "date: 2026-12-07T00:00:00Z\ngpus: 0, NVIDIA H200, 580\nmps: on\ntorch 2.11.0\n")
    weight = [[[1.0] * 16 + [3.0] * 48] * 2] * 2  # (layer, head, channel): top quarter 32 of 320
    models = {"seed1337-pope": {"weight": weight}, "seed1337-rope": {"weight": weight}}
    (wd / "frequencies-seed1337-pope_rope.json").write_text(json.dumps({"models": models}))
    s = summarize(tree / "results")
    lines = s.fill((tree / "RESULTS.md").read_text()).splitlines()
    name = "loss on the target letter, weight decay 0.01 (the paper's)"

    def row(start):
        return next(line for line in lines if line.startswith(start)).split(" | ")

    assert row(f"| {name} |")[1:6] == ["1 of 2", "0 of 2", "1", "1 of 2", "0 of 2"]  # Fisher p 1
    target = tree / "results" / "indirect_indexing" / "target"
    old = {k: json.loads((target / f"seed{k[0]}-{k[1]}" / "eval.json").read_text())["test"]["acc"]
           for k in accs}
    for pe, PE in (("pope", "PoPE"), ("rope", "RoPE")):
        d = [100 * (accs[seed, pe] - old[seed, pe]) for seed in (1337, 1338)]
        assert row(f"| {PE}: {name} − ")[3:5] == ["2", f"{sum(d) / 2:+.1f} pt"]
    longer = row(f"| PoPE: {name}, 200k steps − {name} |")
    assert longer[3:5] == ["2", f"{100 * (0.99 + 0.80 - 0.95 - 0.30) / 2:+.1f} pt"]
    text = "\n".join(lines)
    assert "| 1337 | 87.49% (84k) | 45.71% (> 100k) | 8.70% (> 100k) | 95.00% (40k) | " \
        "10.00% (> 100k) | 99.00% (20k) |" in text
    assert f"- **Indirect indexing, {name}: PoPE solves the task, RoPE does not: too few seeds " \
        "for a test.**" in text
    readme = s.fill((tree / "results" / "indirect_indexing" / "README.md").read_text())
    assert "`indirect_indexing/target-wd0.01/env-seed1337_1338-pope_rope.txt` | abc1234 |" in readme
    assert f"| indirect_indexing/target-wd0.01/seed1337-pope | {32 / 320:.3f} |" in readme
    assert unaccounted(tree / "results") == sorted(  # a run's log is read, its metrics are not
        f"indirect_indexing/target-wd0.01/{p.parent.name}/metrics.jsonl"
        for p in wd.glob("*/eval.json"))


def test_the_code_corpus_joins_section_9_when_its_runs_are_in(tmp_path):
    """results/code/ as results/code.sh leaves it (three seeds here): RESULTS §9's perplexity table,
    two claims with their verdicts (PoPE − RoPE by seed at 1,024 and at 10,240 tokens), the
    frequency shares and provenance in the folder's README, every file read or named; before the
    runs, the blocks say so and no claim names the corpus."""
    tree = copy_tree(tmp_path)
    before = summarize(tree / "results")
    assert not any("Python source" in c[0] for c in before.claims())
    code = tree / "results" / "code"
    lengths = [1024 * i for i in range(1, 11)]
    noise = {1337: 0.5, 1338: -0.6, 1339: 0.2}  # PoPE − RoPE at 1,024: no clear sign
    ppl = {}
    for seed, e in noise.items():
        ppl[f"PoPE-s{seed}"] = [20.0 + e + 0.01 * i for i in range(10)]
        rise = 0.3 + 0.1 * (seed - 1337)  # RoPE's rise per 1,024 tokens grows: a blow-up
        ppl[f"RoPE-s{seed}"] = [20.0 + rise * i * i for i in range(10)]
        ppl[f"RoPE-s{seed}+YaRN"] = [x + 1.0 for x in ppl[f"PoPE-s{seed}"]]
    models = {k: {"results": {str(L): {"ppl": x} for L, x in zip(lengths, xs)}}
              for k, xs in ppl.items()}
    (code / "extrapolation.json").write_text(json.dumps({"lengths": lengths, "models": models}))
    weight = [[[1.0] * 16 + [3.0] * 48] * 2] * 2  # top quarter 16 of 160 per layer
    (code / "frequencies.json").write_text(json.dumps({"models": {"seed1337-rope": {
        "weight": weight}}}))
    (code / "env.txt").write_text("command: bash results/code.sh\ncommit: abc1234\ndirty: no\n"
                                  "date: 2026-12-08T00:00:00Z\ngpus: 0, NVIDIA H100\nmps: off\n")
    for run in ("seed1337-pope", "seed1337-rope"):
        (code / f"{run}.log").write_text("step 2000: train loss 1.0, val loss 1.1\n")
    s = summarize(tree / "results")
    text = s.fill((tree / "RESULTS.md").read_text())
    for group in ("PoPE", "RoPE", "RoPE+YaRN"):
        xs = [ppl[f"{group.replace('+YaRN', '')}-s{seed}" + ("+YaRN" if "+" in group else "")]
              for seed in noise]
        cells = [f"{statistics.mean(c):,.1f} ± {statistics.stdev(c):,.1f}" for c in zip(*xs)]
        assert f"| {group} | 3 | " + " | ".join(cells) + " |" in text
    claims = {c[0]: c for c in s.claims() if c[4] == "§9"}
    at = {L: [ppl[f"PoPE-s{seed}"][i] - ppl[f"RoPE-s{seed}"][i] for seed in noise]
          for i, L in ((0, 1024), (9, 10240))}
    short = claims["Python source: PoPE's perplexity is below RoPE's"]
    assert short[3] == "not established"
    assert f"at 1,024 tokens {statistics.mean(at[1024]):+.2f} " in short[2]
    far = claims["Python source, length extrapolation: at 10× its context PoPE's perplexity is "
                 "below RoPE's"]
    assert far[3] == "reproduced"
    assert f"at 10,240 tokens {statistics.mean(at[10240]):+.2f} " in far[2]
    assert far[5].endswith("over the last: it blows up")
    assert "Python source: PoPE's perplexity is below RoPE's: not established.**" in text
    readme = s.fill((code / "README.md").read_text())
    assert f"| code/seed1337-rope | {16 / 160:.3f} |" in readme
    assert "| `code/env.txt` | abc1234 | no |" in readme
    assert s.NOT_RUN not in text + readme
    assert unaccounted(tree / "results") == []


def test_section_9_reads_what_the_evals_write(tmp_path):
    """results/code/ as results/code.sh's evals write it (eval_extrapolation.py --yarn with its
    labels, eval_frequencies.py with its folder labels, on two tiny checkpoints): §9's table holds
    the JSON's perplexities, both claims are made, every file is read or named."""
    tree = copy_tree(tmp_path)
    code = tree / "results" / "code"
    meta = {"vocab_size": 16, "dtype": "uint16", "itos": list("abcdefghijklmnop")}
    (tmp_path / "d").mkdir()
    ids = np.random.default_rng(0).integers(0, 16, 2000).astype(np.uint16)
    ids.tofile(tmp_path / "d" / "test.bin")
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta))
    ckpts = []
    for pe in ("pope", "rope"):
        torch.manual_seed(0)
        cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=16, pos_emb=pe)
        (code / f"seed1337-{pe}").mkdir()
        ckpts.append(str(code / f"seed1337-{pe}" / "ckpt.pt"))
        torch.save({"model": GPT(cfg).state_dict(), "model_args": dataclasses.asdict(cfg),
                    "config": {}, "meta": meta}, ckpts[-1])
    common = ["--data", str(tmp_path / "d" / "test.bin"), "--ckpt", *ckpts, "--no_progress",
              "--device", "cpu"]
    labels = ["--labels", "PoPE-s1337,RoPE-s1337"]  # results/code.sh's
    eval_extrapolation.main(common + ["--yarn", "--max_tokens", "1600", *labels, "--json",
                                      str(code / "extrapolation.json")])
    eval_frequencies.main(common + ["--json", str(code / "frequencies.json")])
    for run in ("seed1337-pope", "seed1337-rope"):
        shutil.rmtree(code / run)  # (the checkpoints stay on the GPU machine)
    s = summarize(tree / "results")
    got = json.loads((code / "extrapolation.json").read_text())["models"]
    text = s.fill((tree / "RESULTS.md").read_text())
    for group in ("PoPE", "RoPE", "RoPE+YaRN"):
        label = group.replace("+", "-s1337+") if "+" in group else f"{group}-s1337"
        cells = [f"{got[label]['results'][str(L)]['ppl']:.1f}" for L in range(16, 161, 16)]
        assert f"| {group} | 1 | " + " | ".join(cells) + " |" in text
    assert [c[3] for c in s.claims() if c[4] == "§9"] == ["too few seeds for a test"] * 2
    assert "| code/seed1337-rope |" in s.fill((code / "README.md").read_text())
    assert unaccounted(tree / "results") == []


def test_paired_statistics_against_float64_references():
    """The t interval and p against printed quantiles, the exact permutation p by enumerating every
    sign flip, the sign test by binomial counts, Fisher's test by the hypergeometric sum."""
    r = S.paired({1: 3.0, 2: 5.0, 3: 4.0, 9: 8.0}, {2: 2.0, 1: 1.0, 3: 2.0, 9: 3.0, 7: 0.0})
    d = (2.0, 3.0, 2.0, 5.0)  # paired by key: 7 has no partner
    se = math.sqrt(sum((x - 3) ** 2 for x in d) / 3 / 4)
    assert r["n"] == 4 and r["mean"] == pytest.approx(3.0)
    assert (r["lo"], r["hi"]) == pytest.approx((3 - 3.1824463 * se, 3 + 3.1824463 * se), abs=1e-6)
    assert r["p"] == pytest.approx(0.0239811998, rel=1e-8)  # t = 4.2426 on 3 degrees of freedom
    sums = [sum(s * x for s, x in zip(signs, d)) for signs in itertools.product((1, -1), repeat=4)]
    assert r["exact_p"] == pytest.approx(sum(abs(x) >= 12 - 1e-9 for x in sums) / 16)
    assert (r["wins"], r["losses"], r["ties"], r["sign_p"]) == (4, 0, 0, 0.125)
    r = S.paired({1: 1.0, 2: 2.0}, {1: 0.5, 2: 2.0})  # two pairs: no interval or t-test; a tie
    assert r["lo"] is r["hi"] is r["p"] is None
    assert (r["wins"], r["ties"], r["sign_p"]) == (1, 1, 1)
    assert S.verdict(r, 1) == "too few seeds for a test"
    r = S.paired({i: float(i % 3 + 1) for i in range(8)}, dict.fromkeys(range(8), 0.0))
    assert r["sign_p"] == pytest.approx(2 / 256)
    assert (S.verdict(r, 1), S.verdict(r, -1)) == ("reproduced", "opposite")
    assert S.verdict(S.paired({1: 1.0, 2: -1.0, 3: 2.0}, dict.fromkeys((1, 2, 3), 0.0)), 1) == \
        "not established"
    assert S.paired({1: 1.0}, {1: 0.0})["exact_p"] == 1.0
    s = summarize()
    accs = {"pope": [90.0, 80.0, 70.0, 60.0, 10.0], "rope": [60.0, 5.0, 5.0, 5.0, 5.0]}
    s.arm = lambda a, pe: dict(enumerate(accs[pe]))  # solved: 4 of 5 against 1 of 5
    # the hypergeometric tails as far out as the table: X <= 1 and X >= 4 of 5 solved in 10
    tail = sum(math.comb(5, k) * math.comb(5, 5 - k) for k in (0, 1, 4, 5)) / math.comb(10, 5)
    assert s.fisher(("a", 100000)) == pytest.approx(tail)


def test_time_to_sample_from_the_printouts(tmp_path):
    """sample_time.sh's printouts: each call's series (a commit), setting, wall, first-token,
    import, checkpoint and capture times; a sample.py that does not print its imports' time says
    so."""
    folder = tmp_path / "sample" / "time-to-sample"
    folder.mkdir(parents=True)
    call = ("{} {} rc=0 wall={} s\n"
            "decoding: graph\n"
            "prefill: 3 x 4 tokens in 9.0 ms; time to first token {} s since start{}\n"
            "decode: 3 x 9 tokens in 1.0 s: 27.0 tokens/s (capture {} s excluded)\n")
    (folder / "sampletime.txt").write_text("".join(
        call.format(series, run, w, f, more, c) for series, run, w, f, more, c in (
            ("abc1234", "cold", 20.5, 10.25, "", 8.5), ("abc1234", "warm", 18.0, 9.0, "", 6.0),
            ("def5678", "cold", 15.0, 7.5, " (imports 4.0 s, checkpoint 3.0 s)", 6.0))))
    (folder / "sampledecode.txt").write_text("".join(
        call.format(d, f"n={n}", w, 6.0, " (imports 3.0 s, checkpoint 2.0 s)", c)
        .replace("decoding: graph\n", "")
        for d, n, w, c in (("eager", 100, 12.0, 0.0), ("graph", 100, 11.5, 4.0))))
    s = summarize(tmp_path)
    assert s.calls("sampletime") == [
        ("abc1234", "cold", "20.5", "10.25", "not printed", "not printed", "8.5"),
        ("abc1234", "warm", "18.0", "9.0", "not printed", "not printed", "6.0"),
        ("def5678", "cold", "15.0", "7.5", "4.0", "3.0", "6.0")]
    assert s.calls("sampledecode")[1] == ("graph", "100", "11.5", "6.0", "3.0", "2.0", "4.0")
