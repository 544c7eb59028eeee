#!/usr/bin/env bash
# Writes data/demo.txt, the CPU demonstrations' corpus: the reference topics of Python's
# standard library (pydoc_data/topics.py, in Debian's libpython3.11-stdlib; about 466 KB
# of text), one topic after another in key order. Run from the repository root.
set -euo pipefail
mkdir -p data
python3 - <<'PY'
from pydoc_data.topics import topics
with open("data/demo.txt", "w") as f:
    for key in sorted(topics):
        f.write(topics[key].strip() + "\n\n")
PY
