#!/usr/bin/env python3
"""Two builds of qkv-bench in one sitting: runs BEFORE and AFTER alternately (the order flips each
round, so drift on a shared machine falls on both), RUNS times each over the rows `--only TEXT`
selects, and prints a markdown table of the medians of every qkv row with after/before.

    git worktree add /tmp/before REV && (cd /tmp/before && cargo build --release -p qkv-bench)
    cargo build --release -p qkv-bench
    python3 crates/qkv-bench/python/ab.py /tmp/before/target/release/qkv-bench \\
        target/release/qkv-bench --only decode --runs 3

Needs nothing beyond the standard library.
"""

import argparse
import collections
import statistics
import subprocess


def rows(binary, only):
    """(shape, implementation, threads) -> median ms of one `--quick` run's qkv rows."""
    out = subprocess.run([binary, "--quick", "--only", only], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1] and cells[2].startswith("qkv"):
            try:
                yield (cells[1], cells[2], cells[3]), float(cells[4])
            except ValueError:
                continue


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--only", required=True)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    builds = [("before", args.before), ("after", args.after)]
    for run in range(args.runs):
        for name, binary in builds if run % 2 == 0 else builds[::-1]:
            for key, ms in rows(binary, args.only):
                times[key][name].append(ms)
    print("| row | implementation | threads | before ms | after ms | after/before |")
    print("|---|---|--:|--:|--:|--:|")
    for (shape, implementation, threads), by in times.items():
        after = statistics.median(by["after"]) if by["after"] else None
        if not by["before"] or after is None:
            print(f"| {shape} | {implementation} | {threads} | | {after or '':} | new |")
            continue
        before = statistics.median(by["before"])
        print(f"| {shape} | {implementation} | {threads} | {before:.3f} | {after:.3f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
