# Source this file (`. scripts/env.sh`) to get a shell that can build and run lethe.
#
# On first use it creates a project-local virtual environment `.venv` holding the
# pinned `torch==2.11.0` wheel from PyPI: lethe links against the libtorch inside it
# (through tch 0.24, which expects exactly libtorch 2.11.0). Nothing Python runs at
# run time; the wheel is only the carrier of libtorch's headers and shared libraries.
# The build embeds an rpath to that libtorch, so the `lethe` binary runs on its own.

LETHE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LETHE_TORCH_VERSION="2.11.0"
LETHE_VENV="${LETHE_VENV:-$LETHE_ROOT/.venv}"

lethe_torch_ok() {
    [ -x "$LETHE_VENV/bin/python" ] &&
        "$LETHE_VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$LETHE_TORCH_VERSION' else 1)" 2>/dev/null
}

if ! lethe_torch_ok; then
    echo "lethe: setting up $LETHE_VENV with torch==$LETHE_TORCH_VERSION (one time, about 2 minutes)" >&2
    python3 -m venv "$LETHE_VENV" || return 1 2>/dev/null || exit 1
    "$LETHE_VENV/bin/pip" install --quiet "torch==$LETHE_TORCH_VERSION" || return 1 2>/dev/null || exit 1
fi

# `lethe plot` draws text through fontconfig and FreeType (the plotters crate): the build
# needs fontconfig's headers and a font. Installed here when missing and apt is at hand.
if ! pkg-config --exists fontconfig 2>/dev/null || ! fc-list 2>/dev/null | grep -q .; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "lethe: installing fontconfig and the DejaVu fonts for plots (one time)" >&2
        { apt-get update -qq && apt-get install -y -qq pkg-config libfontconfig1-dev fonts-dejavu-core >/dev/null; } || return 1 2>/dev/null || exit 1
    else
        echo "lethe: the build needs fontconfig's headers and a font: install pkg-config, libfontconfig1-dev and fonts-dejavu-core" >&2
    fi
fi

export VIRTUAL_ENV="$LETHE_VENV"
export PATH="$LETHE_VENV/bin:$PATH"
export LIBTORCH_USE_PYTORCH=1
