"""What the command-line tools (nanoccl-perf, nanoccl-tune, nanoccl-advise) share: a wrong
option or value is one line on stderr, from one rank, and exit status 2.

Under a launcher every rank parses the same arguments; argparse's usage text on each of them
would bury the one line that matters, so only rank 0 (or a process outside a launcher)
prints it, and ``--help`` stays the place for the usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if os.environ.get("RANK", "0") == "0":
            print(f"{self.prog}: error: {message} (--help lists the options)", file=sys.stderr)
        sys.exit(2)
