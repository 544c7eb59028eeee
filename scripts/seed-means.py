"""The mean over seeds of a figure in one CSV a seed, as a CSV and a Markdown table.

    python3 scripts/seed-means.py PATTERN SEEDS... --name COL --key COL --value COL \
        --memory COL --out PREFIX --title TEXT [--bracket TEXT] [--digits N]

PATTERN is each seed's CSV with `{seed}` in its place (runs/eval-s{seed}/compare.csv).
Rows are grouped by the `--name` column with the seed suffix taken out of run names
(`expire-a1e-4-s2` and `(runs/expire-a1e-4-s2)` count as one) and by the `--key` column
(a budget, a length). PREFIX.csv holds each group's seeds, the mean and standard
deviation of `--value` and the mean of `--memory`; PREFIX.md a table with a row a name
and a column a key (numeric keys sorted, others in the order they come), each cell the
mean value and, in brackets, the mean memory (`--bracket` says what it is); it is also
printed.
"""

import argparse
import csv
import re
import statistics


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pattern")
    p.add_argument("seeds", nargs="+")
    for flag in ("--name", "--key", "--value", "--memory", "--out", "--title"):
        p.add_argument(flag, required=True)
    p.add_argument("--bracket", help="what the bracketed figure is (default: the --memory column)")
    p.add_argument("--digits", type=int, default=3, help="decimals of the means in the table")
    a = p.parse_args()
    cells = {}
    for seed in a.seeds:
        with open(a.pattern.format(seed=seed), newline="") as f:
            for row in csv.DictReader(f):
                name = re.sub(r"-s\d+(?=\)|-|$)", "", row[a.name])
                cells.setdefault((name, row[a.key]), []).append((float(row[a.value]), float(row[a.memory])))
    names = list(dict.fromkeys(n for n, _ in cells))
    keys = list(dict.fromkeys(k for _, k in cells))
    if all(re.fullmatch(r"\d+", k) for k in keys):
        keys.sort(key=int)
    with open(f"{a.out}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", a.key, "seeds", f"{a.value}_mean", f"{a.value}_sd", a.memory])
        for (name, key), v in cells.items():
            values = [x for x, _ in v]
            sd = statistics.stdev(values) if len(values) > 1 else 0.0
            mean_memory = statistics.mean(m for _, m in v)
            w.writerow([name, key, len(v), f"{statistics.mean(values):.4f}", f"{sd:.4f}", f"{mean_memory:.1f}"])
    lines = ["| policy | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for n in names:
        row = []
        for k in keys:
            v = cells.get((n, k))
            mean = statistics.mean(x for x, _ in v) if v else 0.0
            row.append(f"{mean:.{a.digits}f} ({statistics.mean(m for _, m in v):.0f})" if v else "")
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    bracket = a.bracket or a.memory.replace("_", " ")
    text = f"{a.title}, mean of seeds {' '.join(a.seeds)}; in brackets the {bracket}:\n\n"
    text += "\n".join(lines) + "\n"
    with open(f"{a.out}.md", "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
