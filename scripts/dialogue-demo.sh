#!/usr/bin/env bash
# The document-grounded dialogue demonstration at CPU size (README, "Document-grounded
# dialogue"): the ∞-former paper's Table 2 rows on lethe's generated movies. Writes the
# data set (3,000 conversations unless DATA exists), trains each row's preset for each of
# SEEDS, and replies to every test turn after the first two (greedy). Prints, per run,
# the true responses' perplexity, F1, ROUGE-1, ROUGE-L and METEOR (percent), and how
# many of the replies that state a fact of the document state it right (the director,
# an actor, the year, the critics' word, the rating: a name or number that only the
# document holds).
#
#   [WORDNET=DIR] scripts/dialogue-demo.sh [OUT] [SEEDS] [DATA] [STEPS]
#   (defaults: runs, "1", data/dialogue, the presets' 15,000)
#
# WORDNET, a folder of WordNet 3.0's database files (`apt install wordnet-base` puts them
# in /usr/share/wordnet), adds METEOR's synonym stage as NLTK runs it (`--wordnet`);
# without it METEOR has the exact and stem stages.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
OUT=${1:-runs}
SEEDS=${2:-1}
DATA=${3:-data/dialogue}
STEPS=${4:-}
wordnet=()
[ -n "${WORDNET:-}" ] && wordnet=(--wordnet "$WORDNET")
cargo build --release --quiet
LETHE=target/release/lethe
[ -d "$DATA/Conversations" ] || $LETHE dialogue-data --out "$DATA" >&2
steps=()
[ -n "$STEPS" ] && steps=(--steps "$STEPS")
printf '| run | seed | ppl | F1 | ROUGE-1 | ROUGE-L | METEOR | facts right |\n|---|---|---|---|---|---|---|---|\n'
for seed in $SEEDS; do
  for run in dialogue-tiny-nodoc dialogue-tiny dialogue-tiny-compressive dialogue-tiny-infinity dialogue-tiny-sticky; do
    name="demo-$run-s$seed"
    $LETHE train --preset $run --data "$DATA" "${steps[@]}" \
      --seed "$seed" --out "$OUT" --name "$name" --overwrite --quiet > /dev/null
    $LETHE dialogue-eval --checkpoint "$OUT/$name" "${wordnet[@]}" --json --csv "$OUT/$name/replies.csv" > "$OUT/$name/dialogue-eval.json" 2>/dev/null
    python3 - "$run" "$seed" "$OUT/$name" <<'PY'
import csv, json, sys
run, seed, folder = sys.argv[1:4]
r = json.load(open(f"{folder}/dialogue-eval.json"))
s = r["scores"]
rows = list(csv.DictReader(open(f"{folder}/replies.csv")))
# (a reference that states a fact, the words of it that only the document holds)
facts = [
    (lambda t: t.startswith("it was directed by"), lambda t: t.split()[4:6]),
    (lambda t: " plays " in t and not t.startswith("who"), lambda t: t.split()[0:2]),
    (lambda t: t.startswith("yes , it is a"), lambda t: t.split()[5:8]),
    (lambda t: t.startswith("critics called it"), lambda t: t.split()[3:4]),
    (lambda t: t.startswith("rotten tomatoes gave"), lambda t: t.split()[4:5]),
]
right = total = 0
for row in rows:
    for states, words in facts:
        if states(row["reference"]):
            total += 1
            right += words(row["reference"]) == words(row["prediction"])
print(f"| {run} | {seed} | {r['ppl']:.3f} | {100*s['f1']:.2f} | {100*s['rouge1']['f']:.2f} | {100*s['rouge_l']['f']:.2f} | {100*s['meteor']:.2f} | {right}/{total} |")
PY
  done
done
