"""CBT (Hill et al. 2016) as zero-shot multiple choice, the GPT-2 paper's way:
each of the 10 candidates fills the blank (XXXXX) and the candidate whose
filled-in question sentence is most likely wins. The text is PTB-tokenized
(`` '' , n't ...) and is detokenized first. The harness ships no CBT task."""
import re


def detokenize(text):
    text = re.sub(r"``\s*", '"', text)
    text = re.sub(r"\s*''", '"', text)
    text = re.sub(r" (n't|'s|'re|'ve|'ll|'m|'d)\b", r"\1", text, flags=re.IGNORECASE)
    text = re.sub(r" ([,.;:!?%)\]}])", r"\1", text)
    text = re.sub(r"([(\[{]) ", r"\1", text)
    return re.sub(r" {2,}", " ", text).strip()


def _doc(doc):
    story = " ".join(detokenize(s) for s in doc["sentences"])
    pre, post = detokenize(doc["question"]).split("XXXXX", 1)
    options = list(doc["options"])
    return {"query": story + " " + pre if story else pre, "choices": [o + post for o in options],
            "gold": options.index(doc["answer"])}


def process_docs(dataset):
    return dataset.map(_doc)
