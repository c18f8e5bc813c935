"""Times shell commands in one run, interleaved, and prints medians and ratios.

    python benches/timeit.py --runs 7 NAME='command' NAME2='command' ...

Each round runs every command once, in turn, so machine noise hits all of them alike.
Prints a Markdown table: name, median ms, min ms, max ms, time relative to the first command.
"""
import argparse
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("commands", nargs="+", help="NAME=COMMAND")
    a = ap.parse_args()
    cmds = [c.split("=", 1) for c in a.commands]
    times = {n: [] for n, _ in cmds}
    for r in range(a.warmup + a.runs):
        for name, cmd in cmds:
            t = time.perf_counter()
            p = subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            dt = (time.perf_counter() - t) * 1000
            if p.returncode != 0:
                sys.exit(f"{name} failed ({p.returncode}): {p.stderr.decode()[-500:]}")
            if r >= a.warmup:
                times[name].append(dt)
    base = statistics.median(times[cmds[0][0]])
    print(f"| command | median ms | min ms | max ms | time vs {cmds[0][0]} |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in cmds:
        t = times[name]
        m = statistics.median(t)
        print(f"| {name} | {m:.1f} | {min(t):.1f} | {max(t):.1f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
