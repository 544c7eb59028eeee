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
    that knows no synonyms, against `lethe score` without --wordnet;
  - METEOR with synonyms: meteor_score with NLTK's WordNet, against
    `lethe score --wordnet DIR` on the same database (NLTK's corpora/wordnet folder, or
    --wordnet DIR, which must be the folder NLTK reads). Skipped, and said so, when
    NLTK's WordNet cannot be loaded: Debian's wordnet-base and wordnet-sense-index give
    the files; NLTK wants them, with a `lexnames` file, in ~/nltk_data/corpora/wordnet.
Prints the largest difference per metric and exits 1 if any exceeds 1e-9.
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
# Words with WordNet synonyms among each other (whose Porter stems are lemmas too).
SYNONYMS = ["film", "flick", "glad", "fast", "quick", "big", "large", "car", "auto", "talk",
            "speak", "begin", "start", "end", "finish", "actor", "player", "role", "part",
            "plot", "good", "great", "funny", "comic", "film", "picture", "shot", "hit"]
ODD = ["café", "naïve", "Zoë", "42", "3.5", "co-star", "don't", "it's", "U.S.", "re-make"]
PUNCT = [",", ".", "!", "?", ";", ":", "'", '"', "(", ")", "-"]


def word(rng):
    r = rng.random()
    if r < 0.3:
        w = rng.choice(SMALL)
    elif r < 0.45:
        w = rng.choice(SYNONYMS)
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


def lethe_scores(lethe, data, extra):
    """`lethe score` on the pairs, with `extra` flags: its CSV rows."""
    with tempfile.TemporaryDirectory() as tmp:
        pred_path, ref_path, out = (os.path.join(tmp, n) for n in ("pred.txt", "ref.txt", "scores.csv"))
        with open(pred_path, "w") as f:
            f.write("".join(p + "\n" for p, _ in data))
        with open(ref_path, "w") as f:
            f.write("".join(r + "\n" for _, r in data))
        subprocess.run([lethe, "score", pred_path, ref_path, "--csv", out] + extra, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            rows = list(csv.DictReader(f))
    assert len(rows) == len(data), (len(rows), len(data))
    return rows


def nltk_wordnet(folder):
    """NLTK's WordNet and the folder it reads, or (None, reason)."""
    try:
        import nltk
        from nltk.corpus import wordnet
        wordnet.synsets("dog")
        found = folder or str(nltk.data.find("corpora/wordnet"))
    except Exception as e:
        return None, f"NLTK's WordNet cannot be loaded ({type(e).__name__})"
    if not os.path.isdir(found):
        return None, f"NLTK's WordNet is at {found}, not a folder lethe can read (unzip it)"
    return (wordnet, found), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lethe", default="target/release/lethe")
    ap.add_argument("--pairs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wordnet", help="the WordNet folder NLTK reads (default: NLTK's corpora/wordnet)")
    args = ap.parse_args()
    data = pairs(args.pairs, args.seed)
    rows = lethe_scores(args.lethe, data, [])
    wn, why_not = nltk_wordnet(args.wordnet)
    rows_wn = lethe_scores(args.lethe, data, ["--wordnet", wn[1]]) if wn else [None] * len(data)

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    worst = collections.defaultdict(float)
    synonym_pairs = 0
    for (pred, ref), row, row_wn in zip(data, rows, rows_wn):
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
        if row_wn is not None:
            full = meteor_score.meteor_score([ref.split()], pred.split(), wordnet=wn[0])
            worst["meteor+wn"] = max(worst["meteor+wn"], abs(float(row_wn["meteor"]) - full) - 5e-7)
            synonym_pairs += abs(full - theirs["meteor"]) > 1e-12
    print(f"{len(data)} pairs; largest difference from the Python packages beyond the CSV's rounding:")
    bad = False
    for k, v in worst.items():
        ok = v <= 1e-9
        bad |= not ok
        print(f"  {k:9s} {max(v, 0.0):.2e} {'ok' if ok else 'MISMATCH'}")
    if wn:
        print(f"  (meteor+wn: with WordNet synonyms from {wn[1]}; the synonym stage changed "
              f"{synonym_pairs} of {len(data)} pairs' NLTK METEOR)")
    else:
        print(f"  ({why_not}: the synonym stage was not compared)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
