#!/usr/bin/env python3
"""Compares `lethe score` with the Python packages the ∞-former paper's evaluation used.

    python3 -m venv /tmp/mvenv && /tmp/mvenv/bin/pip install nltk rouge-score
    /tmp/mvenv/bin/python scripts/textmetrics-check.py [--lethe target/release/lethe] [--pairs 500]

Generates seeded prediction/reference pairs (inflected words, capitals, punctuation,
articles, repeats, non-ASCII letters, empty lines), scores them with `lethe score --csv`
and with:
  - F1: the official eval.py's SQuAD normalisation and unigram overlap (re-typed here);
  - ROUGE-1, ROUGE-L: rouge_score.RougeScorer(['rouge1', 'rougeL'], use_stemmer=True);
  - METEOR: nltk.translate.meteor_score.meteor_score on whitespace words, given a WordNet
    that knows no synonyms (lethe has no WordNet stage).
Prints the largest difference per metric and exits 1 if any exceeds 1e-9. When NLTK's
WordNet data can be loaded, also prints how far lethe is from the full METEOR.
"""
import argparse
import collections
import csv
import os
import random
import re
import string
import subprocess
import sys
import tempfile

from nltk.translate import meteor_score
from rouge_score import rouge_scorer

STEMS = ["walk", "run", "play", "act", "movie", "character", "direct", "love", "happy", "story",
         "fly", "city", "watch", "scene", "sing", "dance", "jazz", "try", "cry", "famous"]
SUFFIXES = ["", "", "s", "ed", "ing", "er", "ies", "ly", "ness", "ful"]
SMALL = ["a", "an", "the", "i", "it", "is", "was", "of", "to", "and", "in", "you", "me", "no", "ok"]
ODD = ["café", "naïve", "Zoë", "42", "3.5", "co-star", "don't", "it's", "U.S.", "re-make"]
PUNCT = [",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "-"]


def word(rng):
    r = rng.random()
    if r < 0.35:
        w = rng.choice(SMALL)
    elif r < 0.9:
        w = rng.choice(STEMS) + rng.choice(SUFFIXES)
    else:
        w = rng.choice(ODD)
    if rng.random() < 0.15:
        w = w.capitalize()
    if rng.random() < 0.12:
        w += rng.choice(PUNCT)
    return w


def sentence(rng, n):
    return " ".join(word(rng) for _ in range(n))


def pairs(count, seed):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        ref = sentence(rng, rng.randint(0, 18) if i % 50 else 0)
        words = ref.split()
        # Predictions share part of the reference, shuffled locally, with new words.
        pred = [w for w in words if rng.random() < 0.6]
        for _ in range(rng.randint(0, 6)):
            pred.insert(rng.randint(0, len(pred)), word(rng))
        if len(pred) > 2 and rng.random() < 0.3:
            k = rng.randrange(len(pred) - 1)
            pred[k], pred[k + 1] = pred[k + 1], pred[k]
        out.append((" ".join(pred), ref))
    return out


def normalize_answer(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1(prediction, truth):
    p, t = normalize_answer(prediction).split(), normalize_answer(truth).split()
    same = sum((collections.Counter(p) & collections.Counter(t)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


class NoSynonyms:
    def synsets(self, _word):
        return []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lethe", default="target/release/lethe")
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    data = pairs(args.pairs, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        pred_path, ref_path, out = (os.path.join(tmp, n) for n in ("pred.txt", "ref.txt", "scores.csv"))
        with open(pred_path, "w") as f:
            f.write("".join(p + "\n" for p, _ in data))
        with open(ref_path, "w") as f:
            f.write("".join(r + "\n" for _, r in data))
        subprocess.run([args.lethe, "score", pred_path, ref_path, "--csv", out], check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            rows = list(csv.DictReader(f))
    assert len(rows) == len(data), (len(rows), len(data))

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    worst = collections.defaultdict(float)
    full_meteor_gap = []
    try:
        from nltk.corpus import wordnet
        wordnet.synsets("dog")
    except Exception:
        wordnet = None
    for (pred, ref), row in zip(data, rows):
        # rouge-score's score(target, prediction): the reference first.
        r = scorer.score(ref, pred)
        theirs = {
            "f1": f1(pred, ref),
            "rouge1_p": r["rouge1"].precision, "rouge1_r": r["rouge1"].recall, "rouge1_f": r["rouge1"].fmeasure,
            "rougeL_p": r["rougeL"].precision, "rougeL_r": r["rougeL"].recall, "rougeL_f": r["rougeL"].fmeasure,
            "meteor": meteor_score.meteor_score([ref.split()], pred.split(), wordnet=NoSynonyms()),
        }
        for k, v in theirs.items():
            # lethe's CSV holds 6 decimals: a difference under 5e-7 is rounding.
            worst[k] = max(worst[k], abs(float(row[k]) - v) - 5e-7)
        if wordnet is not None:
            full = meteor_score.meteor_score([ref.split()], pred.split())
            full_meteor_gap.append(abs(full - float(row["meteor"])))
    print(f"{len(data)} pairs; largest difference from the Python packages beyond the CSV's rounding:")
    bad = False
    for k, v in worst.items():
        ok = v <= 1e-9
        bad |= not ok
        print(f"  {k:9s} {max(v, 0.0):.2e} {'ok' if ok else 'MISMATCH'}")
    if full_meteor_gap:
        gap = sum(full_meteor_gap) / len(full_meteor_gap)
        print(f"  METEOR with WordNet synonyms differs by {gap:.4f} on average (max {max(full_meteor_gap):.4f})")
    else:
        print("  (NLTK's WordNet data is not installed: the synonym stage was not compared)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
