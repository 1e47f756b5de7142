"""prepare/indirect_indexing.py: format, semantics, masks, sizes, seeds, the content floors."""
import re

import numpy as np
import pytest

from prepare import common
from prepare import indirect_indexing as ii

LINE = re.compile(r"^([A-Za-z]+), ([A-Za-z]), ([+-]\d{1,2}), ([A-Za-z])$")


def rows_of(out_dir, split):
    meta = common.load_meta(out_dir)
    L = meta["row_len"]
    toks = np.fromfile(out_dir / f"{split}.bin", dtype=meta["dtype"]).reshape(-1, L)
    mask = np.fromfile(out_dir / f"{split}_mask.bin", dtype=np.uint8).reshape(-1, L)
    return meta, toks, mask


def check_rows(toks, mask, min_len, max_len, max_shift):
    shifts = []
    for row, m in zip(toks, mask):
        text = ii.decode(row)
        line = text.rstrip("\n")
        assert "\n" not in line and text.endswith("\n")  # one example per row, "\n"-padded
        mt = LINE.match(line)
        assert mt, line
        string, char, shift, target = mt.group(1), mt.group(2), int(mt.group(3)), mt.group(4)
        # distinct letters
        assert min_len <= len(string) <= max_len and len(set(string)) == len(string)
        idx = string.index(char)
        assert -max_shift <= shift <= max_shift and 0 <= idx + shift < len(string)
        assert (string[idx + shift] == target
                and ii.parse_example(line) == (string, char, shift, target))
        assert ii.format_example(string, char, shift, target) == line
        # the mask scores exactly the target letter, the last character of the line
        assert m.sum() == 1 and np.flatnonzero(m)[0] == len(line) - 1
        assert ii.ITOS[row[len(line) - 1]] == target
        shifts.append(shift)
    return np.array(shifts)


def test_vocabulary():
    assert (ii.ITOS[:5] == ["\n", " ", "+", ",", "-"] and len(ii.ITOS) == 67
            and len(set(ii.ITOS)) == 67)
    assert "".join(ii.ITOS[5:15]) == "0123456789" and "".join(ii.ITOS[15:]) == ii.LETTERS
    assert (ii.decode(ii.encode("NZTUIGWkXFrhCJDzscat, N, +4, I"))
            == "NZTUIGWkXFrhCJDzscat, N, +4, I")
    assert ii.row_len_for(40, 15) == 52 and ii.row_len_for(12, 3) == 23
    for text, meta in (("Kbé, R, +2, ", None),
                       ("Kb, R, <+20>, ", {"itos": ii.vocabulary("token")})):
        with pytest.raises(ValueError):
            ii.encode(text, meta)
    assert ii.encode("Kb, R, <+2>, ", {"itos": ii.vocabulary("token")})[-3] == len(ii.ITOS) + 15 + 2


def test_paper_format_every_row(tmp_path):
    counts = ii.main(["--n_train", "3000", "--n_val", "500", "--n_test", "500",
                      "--out_dir", str(tmp_path)])
    assert counts == {"train": 3000 * 52, "val": 500 * 52, "test": 500 * 52}
    meta = common.load_meta(tmp_path)
    assert (meta["format"] == "indirect_indexing" and meta["vocab_size"] == 67
            and meta["row_len"] == 52)
    assert meta["itos"] == ii.ITOS and meta["dtype"] == "uint16" and meta["tokens"] == counts
    assert common.check_dataset(tmp_path, common.SPLITS) == meta
    seen = {}
    for split in common.SPLITS:
        _, toks, mask = rows_of(tmp_path, split)
        assert toks.size == mask.size == counts[split]
        check_rows(toks, mask, 20, 40, 15)
        seen[split] = {bytes(r) for r in toks}
    # splits come from different seeds: no shared example
    assert not (seen["train"] & seen["val"] or seen["train"] & seen["test"]
                or seen["val"] & seen["test"])


def test_shift_is_uniform_and_lengths_cover_range():
    rows, tpos = ii.generate_rows(62_000, np.random.default_rng(0))
    text = [ii.decode(r).rstrip("\n") for r in rows[:2000]]
    shift = np.array([ii.parse_example(t)[2] for t in text])
    assert all(LINE.match(t) for t in text) and shift.min() == -15 and shift.max() == 15
    # shift uniform over the 31 values: read it from the rows' sign/digits columns of all 62k rows
    lens = np.argmax(rows == ii.STOI[","], axis=1)  # the string ends at the first comma
    assert lens.min() == 20 and lens.max() == 40
    sign = rows[np.arange(len(rows)), lens + 5]
    digits = [(r[l + 6:l + 8]) for r, l in zip(rows, lens)]
    vals = np.array([int("".join(ii.ITOS[d] for d in ds if ii.ITOS[d].isdigit())) for ds in digits])
    vals = np.where(sign == ii.STOI["-"], -vals, vals)
    counts = np.bincount(vals + 15, minlength=31)
    # expected 2000 each
    assert counts.sum() == 62_000 and counts.min() > 1700 and counts.max() < 2300
    assert np.array_equal(tpos, lens + 9 + (np.abs(vals) >= 10))


def test_paper_sizes(tmp_path):
    counts = ii.main(["--out_dir", str(tmp_path)])
    assert counts == {"train": 52_000_000, "val": 520_000, "test": 520_000}
    assert (tmp_path / "train.bin").stat().st_size == 104_000_000
    assert np.memmap(tmp_path / "train_mask.bin", dtype=np.uint8,
                     mode="r").sum(dtype=np.int64) == 1_000_000


def test_quick_variant_and_seeds(tmp_path):
    args = ["--quick", "--n_train", "1000", "--n_val", "200", "--n_test", "200"]
    for name, seed in (("a", "1234"), ("b", "1234"), ("c", "7")):
        counts = ii.main(args + ["--seed", seed, "--out_dir", str(tmp_path / name)])
    meta, toks, mask = rows_of(tmp_path / "a", "val")
    assert meta["row_len"] == 23 and meta["string_len"] == [8, 12] and meta["max_shift"] == 3
    assert counts == meta["tokens"] == {"train": 23_000, "val": 4_600, "test": 4_600}
    assert set(check_rows(toks, mask, 8, 12, 3).tolist()) == set(range(-3, 4))
    bins = {d: {s: (tmp_path / d / f"{s}.bin").read_bytes() for s in common.SPLITS} for d in "abc"}
    assert bins["a"] == bins["b"] and all(bins["a"][s] != bins["c"][s] for s in common.SPLITS)


@pytest.mark.parametrize("setting", [dict(), dict(min_len=8, max_len=12, max_shift=3)])
def test_content_floor_matches_the_generator(setting):
    """The exact floors of the content-only rules against the same rules scored on 200k examples of
    the real generator (their expected score per example; a shift of 0 is always right)."""
    rows, _ = ii.generate_rows(200_000, np.random.default_rng(2024), **setting)
    copy, valid = [], []
    for row in rows[:, :60].tolist():
        string, char, shift, target = ii.parse_example(ii.decode(row).split("\n")[0])
        L, i, targets = (len(string), string.index(char),
                         range(max(0, shift), len(string) + min(0, shift)))
        copy.append(1.0 if shift == 0 else 1.0 / (L - 1))
        valid.append(1.0 if shift == 0 else 1.0 / (len(targets) - (i in targets)))
    want = ii.content_floor(**setting)
    assert (abs(np.mean(copy) - want["copy"]) < 0.003
            and abs(np.mean(valid) - want["valid"]) < 0.003), want
    if not setting:  # the paper's setting: ~6.7% and ~8.5%, not E[1/L] ~ 3.5%
        assert 0.066 < want["copy"] < 0.068 and 0.084 < want["valid"] < 0.086


# (shift_format, order) -> the line's pattern, groups (string, char, shift, target)
VARIANT_LINE = {
    ("token", "string_first"): (r"^([A-Za-z]+), ([A-Za-z]), <([+-]\d{1,2})>, ([A-Za-z])$",
                                (1, 2, 3, 4)),
    ("chars", "question_first"): (r"^([A-Za-z]), ([+-]\d{1,2}), ([A-Za-z]+), ([A-Za-z])$",
                                  (3, 1, 2, 4)),
    ("token", "question_first"): (r"^([A-Za-z]), <([+-]\d{1,2})>, ([A-Za-z]+), ([A-Za-z])$",
                                  (3, 1, 2, 4)),
}


@pytest.mark.parametrize("shift_format,order", list(VARIANT_LINE))
def test_format_variants(tmp_path, shift_format, order):
    """--shift_format token / --order question_first: every row parses in its format, the target is
    right and alone in the mask, a shift token is one token, the examples are the default's draws
    written otherwise."""
    args = ["--n_train", "2000", "--n_val", "300", "--n_test", "300"]
    ii.main(args + ["--out_dir", str(tmp_path / "paper")])
    ii.main(args + ["--shift_format", shift_format, "--order", order,
                    "--out_dir", str(tmp_path / "v")])
    pattern, groups = VARIANT_LINE[shift_format, order]
    for split in ("train", "val", "test"):
        _, ptoks, _ = rows_of(tmp_path / "paper", split)
        meta, toks, mask = rows_of(tmp_path / "v", split)
        assert ((meta["vocab_size"], meta["row_len"])
                == ((98, 50) if shift_format == "token" else (67, 52)))
        assert len(meta["itos"]) == meta["vocab_size"] and meta["shift_format"] == shift_format
        assert meta["order"] == order
        for prow, row, m in zip(ptoks, toks, mask):
            line = ii.decode(row, meta).rstrip("\n")
            string, char, shift, target = (re.match(pattern, line).group(g) for g in groups)
            shift = int(shift)
            assert string[string.index(char) + shift] == target
            assert (ii.parse_example(ii.decode(prow).rstrip("\n")) == (string, char, shift, target)
                    == ii.parse_example(line, order))
            n_tokens = len(line) - (len(f"<{shift:+d}>") - 1 if shift_format == "token" else 0)
            # the last token, the target
            assert m.sum() == 1 and np.flatnonzero(m)[0] == n_tokens - 1
            assert meta["itos"][row[n_tokens - 1]] == target
            assert ii.encode(ii.decode(row, meta), meta) == list(row)

