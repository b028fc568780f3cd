"""summary.csv of a results/ folder: every row of every nanoccl-perf table in its .txt files.

    python bench/results_summary.py results/fabric results/latency results/rails results/security

nanoccl-perf prints nccl-tests tables (the default form, or --wide's, as older runs did); the
emulated cluster prefixes node 0's lines with "[n0] ". Each data row becomes one CSV row per
side: file, launch (the n-th "# nanoccl-perf:" header of the file, from 1), collective, side,
size, time_us, busbw, wrong, p99_us (empty where the table has none), speedup (the row's,
the same for both sides).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

FIELDS = ("file", "launch", "collective", "side", "size", "time_us", "busbw", "wrong", "p99_us",
          "speedup")


def table_rows(path: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    launch, collective = 0, ""
    labels: list[str] = []
    columns: list[str] = []
    previous = ""
    for raw in path.read_text(errors="replace").splitlines():
        line = re.sub(r"^\[n\d+\] ", "", raw)
        if line.startswith("# nanoccl-perf:"):
            launch += 1
        elif m := re.match(r"# (\w+)  \(", line):
            collective, labels, columns = m.group(1), [], []
        elif line.startswith("#") and " size " in f" {line[1:]} " and "time" in line:
            columns = line[1:].split()
            labels = previous[1:].split() if previous.startswith("#") else []
        elif columns and re.match(r"^\s*\d", line):
            values = line.split()
            if len(values) != len(columns):
                continue  # not a row of this table
            firsts = [i for i, c in enumerate(columns) if c == "time"]
            ends = firsts[1:] + [next((i for i, c in enumerate(columns)
                                       if c in ("speedup", "iters")), len(columns))]
            speedup = values[columns.index("speedup")] if "speedup" in columns else ""
            for side, (start, end) in enumerate(zip(firsts, ends)):
                group = dict(zip(columns[start:end], values[start:end]))
                rows.append({
                    "file": path.name, "launch": str(launch), "collective": collective,
                    "side": labels[side] if side < len(labels) else ("A", "B")[side],
                    "size": values[0], "time_us": group.get("time", ""),
                    "busbw": group.get("busbw", ""), "wrong": group.get("#wrong", ""),
                    "p99_us": group.get("p99", ""), "speedup": speedup})
        previous = line
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args(argv)
    for folder in args.folders:
        rows = [r for path in sorted(folder.glob("*.txt")) for r in table_rows(path)]
        out = folder / "summary.csv"
        with out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"{out}: {len(rows)} rows from {len({r['file'] for r in rows})} tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
