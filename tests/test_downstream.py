"""eval_downstream.py: the scorers against log-probs computed by hand from the
model itself, an oracle model that must score 100%, every local-file parser on
slices of the real files (CBT on a file in the official format written here),
and the CLI with --limit on the CPU."""
import collections
import json
import math
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import eval_downstream as ed  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

DATA = os.path.join(os.environ.get("POPE_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data")), "evals")
needs_data = pytest.mark.skipif(not os.path.isdir(DATA), reason=f"offline eval data not found at {DATA}")

# a character vocabulary for the hand-made scorer tests: "\n" and printable ASCII
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
STOI = {c: i for i, c in enumerate(CHARS)}


def char_encode(s):
    return [STOI[c] for c in s]


def char_decode(ids):
    return "".join(CHARS[i] for i in ids)


def tiny_model(pos_emb="pope", block_size=64, vocab_size=len(CHARS), seed=0, std=0.5):
    """A 1-layer GPT with large random weights, so that log-probs differ clearly."""
    torch.manual_seed(seed)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=block_size, vocab_size=vocab_size,
                      pos_emb=pos_emb))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, std)
    return m.eval()


@torch.no_grad()
def hand_logprobs(model, ctx, cont, block_size):
    """log p of each continuation token and whether it is an argmax, from one
    unbatched forward pass over the last block_size + 1 tokens."""
    seq = (list(ctx) + list(cont))[-(block_size + 1):]
    x = torch.tensor([seq[:-1]])
    logits, _ = model(x, x)
    lp = F.log_softmax(logits[0].float(), dim=-1)
    n = min(len(cont), len(seq) - 1)
    out = []
    for j in range(len(seq) - n, len(seq)):  # token j is predicted at position j - 1
        out.append((lp[j - 1, seq[j]].item(), bool(lp[j - 1, seq[j]] >= lp[j - 1].max())))
    return out


def hand_ll(model, ctx, cont, block_size):
    return sum(lp for lp, _ in hand_logprobs(model, ctx, cont, block_size))


# -----------------------------------------------------------------------------
# scorers vs. hand computation

def test_make_request_moves_trailing_space_and_uses_bos():
    ctx, cont = ed.make_request(char_encode, "the cat ", "sat", bos=None)
    assert ctx == char_encode("the cat") and cont == char_encode(" sat")
    ctx, cont = ed.make_request(char_encode, "", "Hi there", bos=0)
    assert ctx == [0] and cont == char_encode("Hi there")
    ctx, cont = ed.make_request(char_encode, "", "Hi there", bos=None)  # no bos: first token is context
    assert ctx == char_encode("H") and cont == char_encode("i there")


@pytest.mark.parametrize("pos_emb", ["pope", "rope"])
def test_score_requests_matches_hand_logprobs(pos_emb):
    block = 64
    model = tiny_model(pos_emb, block_size=block)
    texts = [("Once upon a time", " there was"), ("a", "b"), ("x" * 80, " and the end"),  # context cut
             ("short", "q" * 70),  # continuation longer than block_size: its last 64 tokens scored
             ("The quick brown fox", " jumps over the lazy dog."), ("Hello", ",")]
    reqs = [ed.make_request(char_encode, c, t) for c, t in texts]
    got1 = ed.score_requests(model, reqs, block_size=block, batch_size=1, progress=False)
    got5 = ed.score_requests(model, reqs, block_size=block, batch_size=5, progress=False)  # padded batches
    for (ctx, cont), r1, r5 in zip(reqs, got1, got5):
        hand = hand_logprobs(model, ctx, cont, block)
        assert r1[2] == r5[2] == len(hand) == min(len(cont), block)
        assert r1[0] == pytest.approx(sum(lp for lp, _ in hand), abs=1e-4)
        assert r5[0] == pytest.approx(r1[0], abs=1e-4)
        assert r1[1] == r5[1] == all(g for _, g in hand)
    assert got1[0][0] < -1.0  # large weights: far from uniform-zero log-probs


def test_multiple_choice_picks_by_hand():
    """acc / acc_norm (per character) / acc_norm_token picks equal the argmax of
    the hand-computed log-likelihoods, raw and length-normalised."""
    block = 64
    model = tiny_model("pope", block_size=block, seed=1)
    questions = [("Question: what is red?\nAnswer:", ["a rose", "the sky at noon on a clear day", "x"]),
                 ("Question: pick one\nAnswer:", ["yes", "no", "maybe so", "it depends on many things"]),
                 ("The dog", ["barked", "ran away quickly", "!"]),
                 ("Roof shingle removal: A man is sitting on a roof. he", ["is ripping level tiles off.",
                                                                         "starts pulling up roofing."])]
    items = [ed.MCItem(c, [" " + x for x in ch], ch, 0) for c, ch in questions]
    scores = ed.score_mc(items, model, char_encode, bos=None, block_size=block, device="cpu", batch_size=3,
                         desc="t", progress=False)
    expected = collections.defaultdict(list)
    for it, sc in zip(items, scores):
        reqs = [ed.make_request(char_encode, it.context, c) for c in it.continuations]
        ll = [hand_ll(model, c, t, block) for c, t in reqs]
        ntok = [len(t) for _, t in reqs]
        assert [s for s, _ in sc] == pytest.approx(ll, abs=1e-4)
        assert [n for _, n in sc] == ntok
        for v in (ll, [s / len(c) for s, c in zip(ll, it.choices)], [s / n for s, n in zip(ll, ntok)]):
            ranked = sorted(v, reverse=True)
            assert ranked[0] - ranked[1] > 1e-4  # no near-ties: the picks below are well defined
        expected["acc"].append(max(range(len(ll)), key=lambda i: ll[i]))
        expected["acc_norm"].append(max(range(len(ll)), key=lambda i: ll[i] / len(it.choices[i])))
        expected["acc_norm_token"].append(max(range(len(ll)), key=lambda i: ll[i] / ntok[i]))
    assert ed.mc_predictions(items, scores) == dict(expected)
    # metrics with gold set to the hand-made acc picks: acc = 1, the others = agreement rate
    for it, g in zip(items, expected["acc"]):
        it.gold = g
    m = ed.run_task("piqa", items, model, char_encode, block_size=block, batch_size=4, progress=False)
    assert m["n"] == 4 and m["acc"] == 1.0
    for k in ("acc_norm", "acc_norm_token"):
        assert m[k] == sum(a == b for a, b in zip(expected[k], expected["acc"])) / 4


def test_lambada_greedy_accuracy_and_ppl_by_hand():
    block = 64
    model = tiny_model("pope", block_size=block, seed=2)
    items = []
    for ctx in ["She opened the door and saw", "It was the best of times, it was the"]:
        ids = char_encode(ctx)
        greedy = []
        with torch.no_grad():  # the model's own greedy continuation: a guaranteed hit
            for _ in range(4):
                x = torch.tensor([ids + greedy])
                logits, _ = model(x, x)
                greedy.append(int(logits[0, -1].argmax()))
        items.append(ed.LambadaItem(ctx, char_decode(greedy)))
        wrong = greedy[:2] + [(greedy[2] + 1) % len(CHARS)] + greedy[3:]  # one token off: a miss
        items.append(ed.LambadaItem(ctx, char_decode(wrong)))
    m = ed.run_task("lambada", items, model, char_encode, block_size=block, batch_size=3, progress=False)
    lls, hits = [], []
    for it in items:
        hand = hand_logprobs(model, *ed.make_request(char_encode, it.context, it.target), block)
        lls.append(sum(lp for lp, _ in hand))
        hits.append(all(g for _, g in hand))
    assert hits == [True, False, True, False]
    assert m["acc"] == 0.5 and m["n"] == 4
    assert m["ppl"] == pytest.approx(math.exp(-sum(lls) / 4), rel=1e-4)


def test_blimp_rule_by_hand_and_macro_average():
    block = 64
    model = tiny_model("rope", block_size=block, seed=3)
    bos = STOI["\n"]
    pairs = {"p1": [("The cats sleep.", "The cats sleeps."), ("Who did you see?", "Who did you see him?"),
                    ("He left.", "He lefted.")],
             "p2": [("She is here.", "She are here.")]}
    items = [ed.MCItem("", [g, b], [g, b], 0, name) for name, ps in pairs.items() for g, b in ps]
    m = ed.run_task("blimp", items, model, char_encode, bos=bos, block_size=block, batch_size=4, progress=False)
    per = {}
    for name, ps in pairs.items():
        ok = [hand_ll(model, [bos], char_encode(g), block) > hand_ll(model, [bos], char_encode(b), block)
              for g, b in ps]
        per[name] = sum(ok) / len(ok)
    assert m["paradigms"] == pytest.approx(per)
    assert m["acc"] == pytest.approx((per["p1"] + per["p2"]) / 2)  # mean over paradigms, not over pairs
    assert m["n"] == 4 and m["n_paradigms"] == 2


# -----------------------------------------------------------------------------
# CBT in the official format

CARD_STORY = [  # the CBT item shown on the HF dataset card (PTB-tokenized, as in the files)
    "This vexed the king even more than the queen , who was very clever and learned , and who had hated dolls "
    "when she was a child .",
    "However , she , too in spite of all the books she read and all the pictures she painted , would have been "
    "glad enough to be the mother of a little prince .",
    "The king was anxious to consult the fairies , but the queen would not hear of such a thing .",
    "She did not believe in fairies : she said that they had never existed ; and that she maintained , though "
    "The History of the Royal Family was full of chapters about nothing else .",
    "Well , at long and at last they had a little boy , who was generally regarded as the finest baby that had "
    "ever been seen .",
    "Even her majesty herself remarked that , though she could never believe all the courtiers told her , yet "
    "he certainly was a fine child -- a very fine child .",
    "Now , the time drew near for the christening party , and the king and queen were sitting at breakfast in "
    "their summer parlour talking over it .",
    "It was a splendid room , hung with portraits of the royal ancestors .",
    "There was Cinderella , the grandmother of the reigning monarch , with her little foot in her glass "
    "slipper thrust out before her .",
    "There was the Marquis de Carabas , who , as everyone knows , was raised to the throne as prince consort "
    "after his marriage with the daughter of the king of the period .",
    "On the arm of the throne was seated his celebrated cat , wearing boots .",
    "There , too , was a portrait of a beautiful lady , sound asleep : this was Madame La Belle au "
    "Bois-dormant , also an ancestress of the royal family .",
    "Many other pictures of celebrated persons were hanging on the walls .",
    "`` You have asked all the right people , my dear ? ''",
    "said the king .",
    "`` Everyone who should be asked , '' answered the queen .",
    "`` People are so touchy on these occasions , '' said his majesty .",
    "`` You have not forgotten any of our aunts ? ''",
    "`` No ; the old cats ! ''",
    "replied the queen ; for the king 's aunts were old-fashioned , and did not approve of her , and she "
    "knew it .",
]
CARD_QUESTION = ("`` They are very kind old ladies in their way , '' XXXXX the king ; `` and were nice to me "
                 "when I was a boy . ''")
CARD_OPTIONS = ["christening", "existed", "hear", "knows", "read", "remarked", "said", "sitting", "talking",
                "wearing"]


def cbt_rows():
    """Three items: the dataset card's, and two made-up ones (short lines, answers
    at other positions, one blank right after a quote)."""
    rows = [{"sentences": CARD_STORY, "question": CARD_QUESTION, "answer": "said", "options": CARD_OPTIONS}]
    names = ["Tom", "Anna", "Peter", "Mary", "Jack", "Lucy", "Ben", "Kate", "Sam", "Rose"]
    for k in range(2):
        sents = [f"{names[i % 10]} went to the {['mill', 'river', 'market', 'castle'][i % 4]} on day {i + 1} ."
                 for i in range(20)]
        sents[4] = "`` I do n't like it , '' said Anna 's brother ."
        q = "`` XXXXX , come here ! '' cried the old woman ." if k == 0 else "Then XXXXX went home to bed ."
        rows.append({"sentences": sents, "question": q, "answer": names[3 + k], "options": names})
    return rows


def write_cbt_txt(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            for i, s in enumerate(r["sentences"], 1):
                f.write(f"{i} {s}\n")
            f.write(f"21 {r['question']}\t{r['answer']}\t\t{'|'.join(r['options'])}\n\n")


def test_detokenize_ptb():
    assert ed.detokenize_ptb(CARD_QUESTION) == ('"They are very kind old ladies in their way," XXXXX the king; '
                                                '"and were nice to me when I was a boy."')
    assert ed.detokenize_ptb("`` I do n't like it , '' said Anna 's brother .") == \
        '"I don\'t like it," said Anna\'s brother.'
    assert ed.detokenize_ptb("a ( b ) c : d !") == "a (b) c: d!"


def test_cbt_parser_official_format_and_hf_rows(tmp_path):
    rows = cbt_rows()
    p = tmp_path / "cbtest_CN_test_2500ex.txt"
    write_cbt_txt(p, rows)
    parsed = ed.read_cbt_txt(str(p))
    assert parsed == rows  # the same rows the HF `cbt` builder yields for this file
    assert ed.read_cbt_txt(str(p), limit=2) == rows[:2]
    it = ed.cbt_item(parsed[0], "CN")
    assert it.gold == CARD_OPTIONS.index("said") == 6 and it.group == "CN"
    assert it.context.startswith("This vexed the king even more than the queen, who was very clever")
    assert it.context.endswith('and she knew it. "They are very kind old ladies in their way," ')
    assert it.continuations[6] == 'said the king; "and were nice to me when I was a boy."'
    req = ed.make_request(char_encode, it.context, it.continuations[6])  # the blank's space joins the word
    assert char_decode(req[1]).startswith(" said the king;")
    it1 = ed.cbt_item(parsed[1])
    assert it1.context.endswith('on day 20. "') and it1.continuations[3] == 'Mary, come here!" cried the old woman.'
    assert ed.cbt_item(parsed[2]).continuations[4] == "Jack went home to bed."
    # HF rows as JSON lines (the shape of load_dataset("cam-cst/cbt", "NE", split="test"))
    with open(tmp_path / "cbt_NE.jsonl", "w") as f:
        for r in rows[:2]:
            f.write(json.dumps(r) + "\n")
    items, src = ed.load_items("cbt", str(tmp_path))
    assert [i.group for i in items] == ["CN"] * 3 + ["NE"] * 2
    assert items[3] == ed.cbt_item(rows[0], "NE") and items[0].continuations == items[3].continuations
    assert "cbtest_CN_test_2500ex.txt" in src and "cbt_NE.jsonl" in src
    items, _ = ed.load_items("cbt", str(tmp_path), limit=1)  # --limit is per subset
    assert [i.group for i in items] == ["CN", "NE"]


def test_cbt_parser_rejects_broken_files(tmp_path):
    p = tmp_path / "bad.txt"
    p.write_text("1 a .\n3 c .\n")
    with pytest.raises(ed.TaskDataError, match="story line 3"):
        ed.read_cbt_txt(str(p))
    p.write_text("one a .\n")
    with pytest.raises(ed.TaskDataError, match="number"):
        ed.read_cbt_txt(str(p))
    with pytest.raises(ed.TaskDataError, match="not among"):
        ed.cbt_item({"sentences": ["a ."], "question": "XXXXX b .", "answer": "z", "options": ["x", "y"]})


def test_cbt_rule_by_hand_and_subset_average(tmp_path):
    block = 64
    model = tiny_model("pope", block_size=block, seed=4)
    rows = cbt_rows()
    items = [ed.cbt_item(r, "CN") for r in rows[1:]] + [ed.cbt_item(rows[2], "NE")]
    m = ed.run_task("cbt", items, model, char_encode, block_size=block, batch_size=7, progress=False)
    ok = collections.defaultdict(list)
    for it in items:
        ll = [hand_ll(model, *ed.make_request(char_encode, it.context, c), block) for c in it.continuations]
        ok[it.group].append(max(range(len(ll)), key=lambda i: ll[i]) == it.gold)
    acc = {g: sum(v) / len(v) for g, v in ok.items()}
    assert m["acc_CN"] == acc["CN"] and m["acc_NE"] == acc["NE"] and m["n_CN"] == 2 and m["n_NE"] == 1
    assert m["acc"] == pytest.approx((acc["CN"] + acc["NE"]) / 2)


def test_missing_data_fails_fast_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    write_cbt_txt(tmp_path / "cbtest_CN_test_2500ex.txt", cbt_rows()[:1])
    with pytest.raises(ed.TaskDataError) as e:
        ed.load_items("cbt", str(tmp_path))  # NE is missing
    assert "cbtest_NE_test_2500ex.txt" in str(e.value) and "--data_dir" in str(e.value)
    with pytest.raises(ed.TaskDataError, match="lambada_openai.jsonl"):
        ed.load_items("lambada", str(tmp_path))
    # evaluate() records the failure and still runs the other task
    model = tiny_model(block_size=64)
    r = ed.evaluate(model, char_encode, ["lambada", "cbt"], block_size=64, data_dir=str(tmp_path),
                    progress=False, log=lambda *a: None)
    assert set(r["errors"]) == {"lambada", "cbt"} and r["results"] == {} and r["average"] is None
    os.makedirs(tmp_path / "more")
    write_cbt_txt(tmp_path / "more" / "cbtest_NE_test_2500ex.txt", cbt_rows()[1:])
    shutil.copy(tmp_path / "cbtest_CN_test_2500ex.txt", tmp_path / "more")
    r = ed.evaluate(model, char_encode, ["lambada", "cbt"], block_size=64, data_dir=str(tmp_path / "more"),
                    progress=False, log=lambda *a: None)
    assert list(r["errors"]) == ["lambada"] and r["results"]["cbt"]["n"] == 3
    assert r["average"] == r["table"]["cbt"] == r["results"]["cbt"]["acc"] and r["n_avg"] == 1


class FakeHF:
    """Stands in for the `datasets` package: records the load_dataset calls."""

    class DS(list):
        def select(self, idx):
            return FakeHF.DS(self[i] for i in idx)

    def __init__(self, fail=()):
        self.calls, self.fail = [], fail

    def load_dataset(self, path, name=None, split=None, **kw):
        self.calls.append((path, name, split))
        if path in self.fail:
            raise FileNotFoundError(f"Couldn't find {path} on the Hub (offline)\nmore")
        row = {"EleutherAI/lambada_openai": {"text": "a b c"},
               "nyu-mll/blimp": {"sentence_good": "A.", "sentence_bad": "B."},
               "cam-cst/cbt": {"sentences": ["x ."], "question": "XXXXX y .", "answer": "p", "options": ["p", "q"]},
               "Rowan/hellaswag": {"activity_label": "L", "ctx_a": "a.", "ctx_b": "b", "endings": ["e", "f"],
                                   "label": "1"},
               "baber/piqa": {"goal": "g", "sol1": "s", "sol2": "t", "label": 0},
               "allenai/ai2_arc": {"question": "q", "choices": {"text": ["u", "v"], "label": ["1", "2"]},
                                   "answerKey": "2"}}[path]
        return FakeHF.DS([row] * 5)


def test_hub_loading_ids_splits_and_limit(monkeypatch):
    """Without local files each task asks `datasets` for its standard id and split."""
    fake = FakeHF()
    monkeypatch.setitem(sys.modules, "datasets", fake)
    got = {t: ed.load_items(t, None, limit=3) for t in ed.TASKS}
    assert ("EleutherAI/lambada_openai", "default", "test") in fake.calls
    assert ("Rowan/hellaswag", None, "validation") in fake.calls
    assert ("baber/piqa", None, "validation") in fake.calls
    assert ("allenai/ai2_arc", "ARC-Easy", "test") in fake.calls
    assert [c[1:] for c in fake.calls if c[0] == "cam-cst/cbt"] == [("CN", "test"), ("NE", "test")]
    assert [c[1] for c in fake.calls if c[0] == "nyu-mll/blimp"] == list(ed.BLIMP_PARADIGMS)
    assert got["lambada"][0][0] == ed.LambadaItem("a b", " c") and len(got["lambada"][0]) == 3
    assert len(got["blimp"][0]) == 3 * 67 and len(got["cbt"][0]) == 6
    assert got["hellaswag"][0][0].context == "L: a. B" and got["hellaswag"][0][0].gold == 1
    assert got["piqa"][0][0].context == "Question: g\nAnswer:" and got["arc_easy"][0][0].gold == 1
    # a failing id falls through to the next candidate, and finally to a clear error
    fake = FakeHF(fail=("baber/piqa",))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ed.TaskDataError, match="baber/piqa: FileNotFoundError.*ybisk/piqa: KeyError"):
        ed.load_items("piqa", None, limit=1)  # the fake has no ybisk/piqa either
    assert [c[0] for c in fake.calls] == ["baber/piqa", "ybisk/piqa"]
    fake = FakeHF(fail=("EleutherAI/lambada_openai",))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(ed.TaskDataError, match="Couldn't find EleutherAI/lambada_openai.*lambada_openai.jsonl"):
        ed.load_items("lambada", None)


# -----------------------------------------------------------------------------
# parsers on the real files

@needs_data
def test_lambada_parser_real_file():
    items, src = ed.load_items("lambada", DATA)
    assert len(items) == 5153 and src.endswith("lambada_openai.jsonl")
    assert items[0].context.startswith("In my palm is a clear stone, and inside it is a small ivory statuette.")
    assert items[0].context.endswith("his mouth curved in a confident grin, I don't care about")
    assert items[0].target == " signs"
    assert sum("\n" in it.target.strip() for it in items) == 6  # README: 6 continuations span a line break
    assert sum("\n" in it.target for it in items) == 7  # and one starts with one: " \n\nrecorder"
    assert all(it.target.startswith(" ") and not it.context.endswith(" ") for it in items)
    # the HF row shape {"text"} gives the same item
    assert ed.lambada_item({"text": items[0].context + items[0].target}) == items[0]
    assert ed.load_items("lambada", DATA, limit=7)[0] == items[:7]


@needs_data
def test_piqa_and_arc_parsers_real_files():
    piqa, _ = ed.load_items("piqa", DATA)
    assert len(piqa) == 1838 and all(len(i.choices) == 2 for i in piqa)
    assert collections.Counter(i.gold for i in piqa) == {0: 910, 1: 928}
    assert piqa[0].context == "Question: How do I ready a guinea pig cage for it's new occupants?\nAnswer:"
    assert piqa[0].gold == 0 and piqa[0].continuations[0].startswith(" Provide the guinea pig with a cage")
    assert piqa[1].context == "Question: dresser\nAnswer:" and piqa[1].choices == [
        "replace drawer with bobby pin", "finish, woodgrain with  bobby pin"] and piqa[1].gold == 1
    hf = {"goal": "dresser", "sol1": "replace drawer with bobby pin", "sol2": "finish, woodgrain with  bobby pin",
          "label": 1}
    assert ed.qa_item(hf) == piqa[1]
    arc, _ = ed.load_items("arc_easy", DATA)
    assert len(arc) == 2376 and all(len(i.choices) == 4 for i in arc)
    assert collections.Counter(i.gold for i in arc) == {0: 565, 1: 592, 2: 634, 3: 585}
    assert arc[1].context == ("Question: Which piece of safety equipment is used to keep mold spores from "
                              "entering the respiratory system?\nAnswer:")
    assert arc[1].continuations == [" safety goggles", " breathing mask", " rubber gloves", " lead apron"]
    assert arc[1].gold == 1
    hf = {"question": "Which piece of safety equipment is used to keep mold spores from entering the "
                      "respiratory system?",
          "choices": {"text": arc[1].choices, "label": ["A", "B", "C", "D"]}, "answerKey": "B"}
    assert ed.qa_item(hf) == arc[1]
    assert len(ed.load_items("piqa", DATA, limit=5)[0]) == 5 and ed.load_items("arc_easy", DATA, limit=3)[0] == arc[:3]


@needs_data
def test_hellaswag_parser_real_file():
    items, _ = ed.load_items("hellaswag", DATA)
    assert len(items) == 10042 and all(len(i.choices) == 4 for i in items)
    assert collections.Counter(i.gold for i in items) == {0: 2515, 1: 2485, 2: 2584, 3: 2458}
    assert items[0].context == "Roof shingle removal: A man is sitting on a roof. he"
    assert items[0].gold == 3 and items[0].continuations[3] == " starts pulling up roofing on a roof."
    assert items[1].context == "Clean and jerk: A lady walks to a barbell. She bends down and grabs the pole. the lady"
    assert all("[" not in i.context and "  " not in i.context for i in items)
    # HF / rowanz rows: lm-eval's prompt, ctx_b capitalised
    hf = {"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
          "endings": items[0].choices, "label": "3"}
    assert ed.hellaswag_item(hf).context == "Roof shingle removal: A man is sitting on a roof. He"
    assert ed.hellaswag_clean("How to tie a tie [title] Cross the ends. [step] Pull  it.") == \
        "How to tie a tie. Cross the ends. Pull it."
    assert ed.load_items("hellaswag", DATA, limit=4)[0] == items[:4]


@needs_data
def test_blimp_parser_real_files():
    items, _ = ed.load_items("blimp", DATA)
    counts = collections.Counter(i.group for i in items)
    assert len(items) == 67000 and set(counts) == set(ed.BLIMP_PARADIGMS) and set(counts.values()) == {1000}
    first = items[0]
    assert first.group == "adjunct_island" and first.context == "" and first.gold == 0
    assert first.continuations == ["Who should Derek hug after shocking Richard?",
                                   "Who should Derek hug Richard after shocking?"]
    items2, _ = ed.load_items("blimp", DATA, limit=2)  # --limit is per paradigm
    assert len(items2) == 134 and collections.Counter(i.group for i in items2) == {p: 2 for p in ed.BLIMP_PARADIGMS}


@needs_data
def test_parsers_on_slices_of_the_real_files(tmp_path):
    """Each local parser on the first lines of each real file, copied out."""
    k = 7
    for name in ("lambada_openai.jsonl", "piqa.jsonl", "arc_easy.jsonl"):
        with open(os.path.join(DATA, name)) as f:
            (tmp_path / name).write_text("".join(next(f) for _ in range(k)))
    with open(os.path.join(DATA, "hellaswag_val.txt")) as f:
        (tmp_path / "hellaswag_val.txt").write_text("".join(next(f) for _ in range(6 * k)))
    os.makedirs(tmp_path / "blimp")
    for p in ("adjunct_island", "wh_island", "passive_1"):
        with open(os.path.join(DATA, "blimp", p + ".jsonl")) as f:
            (tmp_path / "blimp" / (p + ".jsonl")).write_text("".join(next(f) for _ in range(k)))
    for task in ("lambada", "piqa", "arc_easy", "hellaswag"):
        sliced, src = ed.load_items(task, str(tmp_path))
        assert src.startswith(str(tmp_path))
        assert sliced == ed.load_items(task, DATA, limit=k)[0] and len(sliced) == k
    sliced, _ = ed.load_items("blimp", str(tmp_path))
    assert len(sliced) == 3 * k and [i.group for i in sliced[::k]] == ["adjunct_island", "passive_1", "wh_island"]
    (tmp_path / "hellaswag_val.txt").write_text("ctx\n1\na\nb\nc\n")  # a truncated block
    with pytest.raises(ed.TaskDataError, match="multiple of 6"):
        ed.load_items("hellaswag", str(tmp_path))


# -----------------------------------------------------------------------------
# oracle: a model whose log-probs favour the gold continuation gets 100%

class OracleLM:
    """Same call signature as GPT: (idx, targets) -> (logits (B, T, V), loss).
    At every position whose prefix is a prefix of a gold sequence, the next
    gold token gets logit 50; everything else is uniform."""

    def __init__(self, gold_seqs, vocab_size, block_size):
        self.config = SimpleNamespace(block_size=block_size, vocab_size=vocab_size)
        self.V = vocab_size
        self.trie = {}
        for s in gold_seqs:
            node = self.trie
            for a, b in zip(s[:-1], s[1:]):
                node = node.setdefault(a, {})
                node["next"] = b if node.get("next", b) == b else None  # conflicting golds: no preference

    def __call__(self, idx, targets=None):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.V)
        for b, row in enumerate(idx.tolist()):
            node = self.trie
            for t, tok in enumerate(row):
                node = node.get(tok) if node is not None else None
                if node is None:
                    break
                if node.get("next") is not None:
                    logits[b, t, node["next"]] = 50.0
        return logits, None


class CompactGPT2:
    """gpt2 BPE with ids renumbered densely, so that the oracle's logits stay small."""

    def __init__(self):
        from sample import load_codec
        self.enc, _ = load_codec({"tokenizer": "gpt2"})
        self.ids = {ed.GPT2_EOT: 0}

    def __call__(self, s):
        return [self.ids.setdefault(t, len(self.ids)) for t in self.enc(s)]


@needs_data
def test_oracle_scores_100_percent_on_every_task(tmp_path):
    for name in ("lambada_openai.jsonl", "piqa.jsonl", "arc_easy.jsonl", "hellaswag_val.txt"):
        os.symlink(os.path.join(DATA, name), tmp_path / name)
    os.symlink(os.path.join(DATA, "blimp"), tmp_path / "blimp")
    write_cbt_txt(tmp_path / "cbtest_CN_test_2500ex.txt", cbt_rows())
    write_cbt_txt(tmp_path / "cbtest_NE_test_2500ex.txt", cbt_rows()[::-1])
    encode, limit, bos = CompactGPT2(), 6, 0
    gold = []
    for task in ed.TASKS:
        items, _ = ed.load_items(task, str(tmp_path), limit=limit)
        for it in items:
            ctx, cont = (ed.make_request(encode, it.context, it.target, bos) if task == "lambada" else
                         ed.make_request(encode, it.context, it.continuations[it.gold], bos))
            gold.append(ctx + cont)
    assert len(encode.ids) < 4096
    oracle = OracleLM(gold, vocab_size=4096, block_size=2048)
    r = ed.evaluate(oracle, encode, ed.TASKS, bos=bos, block_size=2048, data_dir=str(tmp_path), limit=limit,
                    batch_size=16, progress=False, log=lambda *a: None)
    assert not r["errors"]
    res = r["results"]
    assert res["blimp"]["n"] == 67 * limit and res["cbt"]["n"] == 6
    for task in ed.TASKS:
        metrics = ["acc"] + (["acc_norm", "acc_norm_token"] if task in ed.MC_TASKS else [])
        assert all(res[task][m] == 1.0 for m in metrics), (task, res[task])
    assert res["lambada"]["ppl"] == pytest.approx(1.0, abs=1e-6)
    assert r["average"] == 1.0 and r["n_avg"] == 6
    # and an anti-oracle (gold = the first wrong choice) gets 0% on the multiple-choice tasks
    items, _ = ed.load_items("piqa", str(tmp_path), limit=limit)
    anti = OracleLM([sum(ed.make_request(encode, it.context, it.continuations[1 - it.gold], bos), [])
                     for it in items], vocab_size=4096, block_size=2048)
    m = ed.run_task("piqa", items, anti, encode, bos=bos, block_size=2048, batch_size=4, progress=False)
    assert m["acc"] == m["acc_norm"] == m["acc_norm_token"] == 0.0


# -----------------------------------------------------------------------------
# CLI

def save_tiny_ckpt(path, pos_emb):
    args = dict(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=50304, pos_emb=pos_emb)
    torch.manual_seed(0)
    m = GPT(GPTConfig(**args))
    torch.save({"model": m.state_dict(), "model_args": args,
                "meta": {"vocab_size": 50304, "dtype": "uint16", "tokenizer": "gpt2"}, "config": {}}, path)


def test_progress_fallback_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    bar = ed._Progress(5, "demo")
    assert bar.bar is None
    bar.update(2)
    bar.update(3)
    bar.close()
    err = capsys.readouterr().err
    assert "demo: 2/5" in err and "demo: 5/5 (100%" in err


def test_cli_help():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "eval_downstream.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for s in ("--ckpt", "--tasks", "--data_dir", "--limit", "--json", "--device", "--batch_size",
              "python eval_downstream.py --ckpt PATH", "acc_norm"):
        assert s in out.stdout


@needs_data
def test_cli_limit_on_real_data_without_cbt(tmp_path):
    """The shipped data has no CBT: that task fails with a message, the rest run."""
    ckpt = tmp_path / "ckpt.pt"
    save_tiny_ckpt(ckpt, "pope")
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "eval_downstream.py"), "--ckpt", str(ckpt),
                          "--data_dir", DATA, "--limit", "1", "--json", str(tmp_path / "r.json"), "--device", "cpu",
                          "--no_progress"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "| Model | LAMBADA | BLiMP | CBT | HellaSwag | PIQA | ARC-E | Avg |" in out.stdout
    assert "FAILED: cbt:" in out.stdout and "cbtest_CN_test_2500ex.txt" in out.stdout
    rep = json.load(open(tmp_path / "r.json"))
    m = rep["models"][0]
    assert m["label"].startswith("PoPE") and set(m["errors"]) == {"cbt"}
    assert set(m["results"]) == {"lambada", "blimp", "hellaswag", "piqa", "arc_easy"}
    assert m["results"]["blimp"]["n"] == 67 and m["results"]["lambada"]["n"] == 1
    assert m["n_avg"] == 5 and m["average"] == pytest.approx(sum(m["table"].values()) / 5)
    assert "average over 5 of the 6 tasks" in out.stdout


@needs_data
def test_main_two_checkpoints_all_tasks(tmp_path):
    """In-process main() with both PoPE and RoPE checkpoints and all six tasks:
    one row each, and the JSON numbers match evaluate() on the loaded model."""
    data = tmp_path / "data"
    os.makedirs(data / "blimp")
    for name in ("lambada_openai.jsonl", "piqa.jsonl", "arc_easy.jsonl", "hellaswag_val.txt"):
        os.symlink(os.path.join(DATA, name), data / name)
    for p in ("adjunct_island", "passive_1"):
        os.symlink(os.path.join(DATA, "blimp", p + ".jsonl"), data / "blimp" / (p + ".jsonl"))
    os.makedirs(data / "cbt")
    write_cbt_txt(data / "cbt" / "cbtest_CN_test_2500ex.txt", cbt_rows()[1:])
    write_cbt_txt(data / "cbt" / "cbtest_NE_test_2500ex.txt", cbt_rows()[:1])
    paths = []
    for pe in ("pope", "rope"):
        paths.append(str(tmp_path / f"{pe}.pt"))
        save_tiny_ckpt(paths[-1], pe)
    rc = ed.main(["--ckpt", *paths, "--data_dir", str(data), "--limit", "2", "--json", str(tmp_path / "r.json"),
                  "--device", "cpu", "--batch_size", "8", "--no_progress", "--mc_metric", "acc"])
    assert rc == 0
    rep = json.load(open(tmp_path / "r.json"))
    assert [m["label"].split()[0] for m in rep["models"]] == ["PoPE", "RoPE"]
    for m in rep["models"]:
        assert not m["errors"] and m["n_avg"] == 6
        assert {t: m["results"][t]["n"] for t in ed.TASKS} == {
            "lambada": 2, "blimp": 4, "cbt": 3, "hellaswag": 2, "piqa": 2, "arc_easy": 2}
        assert m["table"]["piqa"] == m["results"]["piqa"]["acc"]  # --mc_metric acc
        assert m["average"] == pytest.approx(sum(m["table"].values()) / 6)
    from model import load_checkpoint
    from sample import load_codec
    model, ckpt = load_checkpoint(paths[1])
    encode, _ = load_codec(ckpt["meta"])
    r = ed.evaluate(model, encode, ed.TASKS, bos=ed.GPT2_EOT, block_size=64, data_dir=str(data), limit=2,
                    batch_size=8, progress=False, log=lambda *a: None)
    for t in ed.TASKS:
        for k, v in r["results"][t].items():
            if k not in ("seconds", "paradigms"):
                assert rep["models"][1]["results"][t][k] == pytest.approx(v, abs=1e-9), (t, k)


def test_main_exit_status_when_nothing_ran(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ckpt = tmp_path / "c.pt"
    save_tiny_ckpt(ckpt, "rope")
    assert ed.main(["--ckpt", str(ckpt), "--data_dir", str(tmp_path), "--tasks", "cbt,piqa", "--device", "cpu",
                    "--no_progress"]) == 1
    with pytest.raises(SystemExit):
        ed.main(["--ckpt", str(ckpt), "--tasks", "lambada,nope"])
    with pytest.raises(SystemExit):
        ed.main(["--ckpt", str(ckpt), "--limit", "0"])
