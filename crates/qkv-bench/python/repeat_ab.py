#!/usr/bin/env python3
"""Two builds of the `repeat` example, paired: runs BEFORE and AFTER back to back PAIRS times (the
order flips each pair) with the same arguments, and prints each build's median and fastest time
and the median and quartiles of the pairs' ratios after/before. A ratio within one pair compares
two runs a second apart, so a spell of contention on a shared machine falls on both sides of it.

    cargo build --release -p qkv-bench --example repeat && cp target/release/examples/repeat /tmp/before
    # ... change, build again ...
    python3 crates/qkv-bench/python/repeat_ab.py /tmp/before target/release/examples/repeat \\
        --threads 2 --pairs 12 -- --pool --bf16 4096 4096 0 8

Needs nothing beyond the standard library.
"""

import argparse
import os
import statistics
import subprocess


def seconds(binary, args, threads):
    """The time `repeat` reports for its calls (its last line ends `in T s`)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    out = subprocess.run([binary, *args], capture_output=True, text=True, check=True, env=env).stdout
    return float(out.strip().splitlines()[-1].split()[-2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("args", nargs="+", help="repeat's arguments, after --")
    args = parser.parse_args()
    before, after = [], []
    for pair in range(args.pairs):
        order = [(args.before, before), (args.after, after)]
        for binary, times in order if pair % 2 == 0 else reversed(order):
            times.append(seconds(binary, args.args, args.threads))
    ratios = sorted(a / b for a, b in zip(after, before))
    quarter = len(ratios) // 4
    print(
        f"before: median {statistics.median(before):.4f} s, fastest {min(before):.4f} | "
        f"after: median {statistics.median(after):.4f} s, fastest {min(after):.4f} | "
        f"after/before over {len(ratios)} pairs: median {statistics.median(ratios):.3f} "
        f"(quartiles {ratios[quarter]:.3f}-{ratios[-1 - quarter]:.3f})"
    )


if __name__ == "__main__":
    main()
