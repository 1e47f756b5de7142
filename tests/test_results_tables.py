"""RESULTS.md's tables are what results/summarize.py makes from the committed raw files, its prose quotes only
numbers those tables hold, and the paired statistics behind its verdicts match Student's t."""
import importlib.util
import math
import random
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("summarize", REPO / "results" / "summarize.py")
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)
# a result in the prose: a decimal number, not a version (2.11.0), a size (10.75M) or a code span's setting
NUM = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\d.A-Za-z])")


def prose_numbers_not_in_tables(text):
    """Decimal numbers of a section's prose (outside its tables and `code`) that none of its tables holds; the
    sections without tables (title, summary) are checked against every table."""
    every = "".join(m[3] for m in S.MARKER.finditer(text))
    bad = []
    for section in re.split(r"^(?=## )", text, flags=re.M):
        tables = "".join(m[3] for m in S.MARKER.finditer(section)) or every
        prose = re.sub(r"`[^`]*`|\]\([^)]*\)", "", S.MARKER.sub("", section))
        bad += [n for n in NUM.findall(prose) if n not in tables]
    return bad


def test_every_table_is_the_one_its_raw_files_give():
    text = (REPO / "RESULTS.md").read_text()
    assert sorted(m[2] for m in S.MARKER.finditer(text)) == sorted(S.TABLES)  # each once, none unused
    assert S.fill(text) == text, "RESULTS.md is not what its raw files give: results/summarize.py --write"
    assert prose_numbers_not_in_tables(text) == []


def test_the_attention_rules_measurement_is_the_committed_one():
    """model.py's comment on auto's rule quotes the step times of results/kernel/train-*.json (PyTorch path,
    kernel): a new measurement cannot leave the rule's stated basis stale."""
    quoted = re.search(r"compile: 1k ([\d.]+) vs ([\d.]+), 4k ([\d.]+) vs ([\d.]+), 16k ([\d.]+) vs ([\d.]+)",
                       (REPO / "model.py").read_text()).groups()
    rows = {T: S.bench(f"kernel/train-{T}.json") for T in (1024, 4096, 16384)}
    assert list(quoted) == [f"{rows[T][p]['ms']:.2f}" for T in rows for p in ("pope-torch", "pope-kernel")]


@pytest.mark.parametrize("old, new", [("| 1342 | 97.42% |", "| 1342 | 97.43% |"),  # a table cell
                                      ("seed 1339 (12.99%)", "seed 1339 (12.98%)")])  # a number in the prose
def test_one_changed_number_is_caught(old, new):
    text = (REPO / "RESULTS.md").read_text()
    assert text.count(old) == 1
    changed = text.replace(old, new)
    assert S.fill(changed) != changed or prose_numbers_not_in_tables(changed) == NUM.findall(new)


def test_t_distribution_against_closed_forms_and_tables():
    """df = 1 is Cauchy, df = 2 has a closed form; larger df against printed 97.5% quantiles and p-values."""
    rng = random.Random(0)
    for _ in range(200):
        t = rng.uniform(0, 30)
        assert S.t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10, abs=1e-14)
        assert S.t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10, abs=1e-14)
    for df, q in ((1, 12.7062047), (2, 4.3026527), (5, 2.5705818), (10, 2.2281389), (30, 2.0422725)):
        assert S.t_quantile(0.975, df) == pytest.approx(q, abs=1e-6)
    for t, df, p in ((2.0, 5, 0.1019394788), (3.0, 10, 0.0133436550), (1.5, 30, 0.1440659291)):
        assert S.t_two_sided_p(t, df) == pytest.approx(p, rel=1e-8)


def test_incomplete_beta_against_a_float64_quadrature():
    """I_x(a, b) against Simpson's rule on the beta density; for a, b < 1 (a singular density) the symmetry
    I_x(a, b) + I_(1-x)(b, a) = 1, which the continued fraction's two branches meet in."""
    rng = random.Random(1)
    for _ in range(20):
        a, b, x, n = rng.uniform(2, 20), rng.uniform(2, 20), rng.uniform(0.01, 0.99), 20000
        lb = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
        f = [math.exp((a - 1) * math.log(u) + (b - 1) * math.log1p(-u) - lb) if u > 0 else 0.0
             for u in (x * i / n for i in range(n + 1))]
        ref = x / n / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))
        assert S.betainc(a, b, x) == pytest.approx(ref, rel=1e-7, abs=1e-12)
        a, b = rng.uniform(0.05, 1), rng.uniform(0.05, 1)
        assert S.betainc(a, b, x) + S.betainc(b, a, 1 - x) == pytest.approx(1, abs=1e-12)


def test_paired_statistics():
    r = S.paired([3, 5, 4, 8], [1, 2, 2, 3])  # d = 2, 3, 2, 5: mean 3, se 0.7071, t 4.2426 on 3 df
    assert r["n"] == 4 and r["mean"] == pytest.approx(3)
    assert (r["lo"], r["hi"]) == pytest.approx((3 - 2.2503293632, 3 + 2.2503293632), abs=1e-8)
    assert r["p"] == pytest.approx(0.0239811998, rel=1e-8)
    assert (r["wins"], r["losses"], r["ties"], r["sign_p"]) == (4, 0, 0, 0.125)
    r = S.paired([1.0, 2.0], [0.5, 2.0])  # two pairs: no interval or t-test; the tie leaves the sign test
    assert r["lo"] is r["hi"] is r["p"] is None and (r["wins"], r["ties"], r["sign_p"]) == (1, 1, 1.0)
    assert S.sign_test_p(5, 1) == pytest.approx(14 / 64) and S.sign_test_p(7, 1) == pytest.approx(18 / 256)
    cells = S.pair_cells({7: 9.0, 1: 3, 2: 5, 3: 4, 4: 8}, {4: 3, 3: 2, 2: 2, 1: 1, 5: 0.0}, 2)  # by seed
    assert cells[:2] == ["4", "+3.00"] and cells[3] == "0.024"
