"""Compare reports of bench/bench_core.py: before and after a change, run in turn.

    python bench/compare_core.py --before a1.md a2.md --after b1.md b2.md [--out file.md]

Reads the append, context-build and compaction tables of each report and prints, for
each measure, the median over the runs of each side and the after/before ratio
(below 1 is faster for times, above 1 for throughputs). Run the two sides alternately
(before, after, before, after) so that load on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

# (label, section heading prefix, row label prefix, column index, unit, higher is better)
MEASURES = [
    ("Append, one turn per call: messages/s (wall)", "## 1.", "one agent turn", 2, "msg/s", True),
    ("Append, one turn per call: messages/s (CPU)", "## 1.", "one agent turn", 3, "msg/s", True),
    ("Append, one turn per call: ms/call", "## 1.", "one agent turn", 5, "ms", False),
    ("Append, 100 per call: messages/s (CPU)", "## 1.", "100 messages", 3, "msg/s", True),
    ("Append probe, 100 archived: ms/call", "## 3b.", "probe, small", 2, "ms", False),
    ("Append probe, 20,000 archived: ms/call", "## 3b.", "probe, big", 2, "ms", False),
    ("Context build, 100 archived: get_context ms", "## 3.", "100", 3, "ms", False),
    ("Context build, 20,000 archived: get_context ms", "## 3.", "20,000", 3, "ms", False),
    ("Context build, 20,000 archived: status ms", "## 3.", "20,000", 5, "ms", False),
    ("Compaction 1-5 (new session): median CPU ms", "## 5.", "1–5, new session", 3, "ms", False),
    ("Compaction 46-50: median CPU ms", "## 5.", "46–50", 3, "ms", False),
    ("Compaction 41-50: mean CPU ms", "## 5.", "41–50", 5, "ms", False),
]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _number(cell: str) -> float:
    return float(re.sub(r"[^0-9.]", "", cell))


def read(path: Path) -> dict[str, float]:
    text = path.read_text(encoding="utf-8")
    out: dict[str, float] = {}
    for label, heading, row, col, _, _ in MEASURES:
        start = text.find("\n" + heading)
        if start < 0:
            continue
        section = text[start + 1 :]
        end = section.find("\n## ", 1)
        section = section[: end if end > 0 else None]
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and cells[0].startswith(row):
                out[label] = _number(cells[col])
                break
    return out


def compare(before: list[Path], after: list[Path]) -> str:
    b = [read(p) for p in before]
    a = [read(p) for p in after]
    lines = [
        f"| Measure | Before (median of {len(b)}) | After (median of {len(a)}) | After/before |",
        "|---|---|---|---|",
    ]
    for label, _, _, _, unit, higher in MEASURES:
        bv = [r[label] for r in b if label in r]
        av = [r[label] for r in a if label in r]
        if not bv or not av:
            continue
        mb, ma = statistics.median(bv), statistics.median(av)
        ratio = ma / mb if mb else float("nan")
        better = "faster" if (ratio > 1) == higher else "slower"
        if abs(ratio - 1) < 0.05:
            better = "same, within 5%"
        lines.append(
            f"| {label} | {_fmt(mb)} {unit} | {_fmt(ma)} {unit} | {ratio:.2f} ({better}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", nargs="+", type=Path, required=True)
    parser.add_argument("--after", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    table = compare(args.before, args.after)
    print(table)
    if args.out:
        args.out.write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
