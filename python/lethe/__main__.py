"""``python -m lethe`` and the ``lethe`` command the package installs: lethe's command
line, the same program as the ``lethe`` binary (``lethe --help``)."""

import sys

from . import _lethe


def main() -> None:
    """Runs ``lethe`` with this process's arguments and exits with its status."""
    sys.exit(_lethe.main(sys.argv))


if __name__ == "__main__":
    main()
