#!/usr/bin/env python3
"""Two builds of the `pools` example in one sitting: runs BEFORE and AFTER in turns (the order
flips each round), RUNS times each, and prints for each build the median over every pool of the
two-thread time, the one-thread median and the median of their ratio.

    git worktree add /tmp/before REV && (cd /tmp/before && cargo build --release -p qkv-bench --example pools)
    cargo build --release -p qkv-bench --example pools
    python3 crates/qkv-bench/python/pools_ab.py /tmp/before/target/release/examples/pools \\
        target/release/examples/pools --n 256 --runs 30

Needs nothing beyond the standard library.
"""

import argparse
import re
import statistics
import subprocess


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    builds = [("before", args.before), ("after", args.after)]
    two, one, ratio = ({name: [] for name, _ in builds} for _ in range(3))
    for run in range(args.runs):
        for name, binary in builds if run % 2 == 0 else builds[::-1]:
            out = subprocess.run([binary, str(args.n), "8"], capture_output=True, text=True, check=True).stdout
            times = [float(ms) for ms in re.findall(r"\dt ([\d.]+)\[", out)]
            one[name].append(times[0])
            two[name].extend(times[1:])
            ratio[name].extend(t / times[0] for t in times[1:])
    for name, _ in builds:
        print(
            f"{name}: 2 threads {statistics.median(two[name]):.3f} ms, 1 thread {statistics.median(one[name]):.3f} ms,"
            f" 2t/1t {statistics.median(ratio[name]):.3f} ({len(two[name])} pools)"
        )


if __name__ == "__main__":
    main()
