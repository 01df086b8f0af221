#!/usr/bin/env python3
"""Compare two benchmarks/run.py results (e.g. a baseline build against a change, measured on
one machine in one run): one markdown row per case present in both, with the ratio
baseline time / new time (> 1: the new build is faster), cold and CUDA-graph replay.

    python benchmarks/compare.py BASE/results.json NEW/results.json [--out table.md]
"""
import argparse
import json
import math
import sys


def _rows(path):
    with open(path) as f:
        return {(r["case"], r["op"]): r for r in json.load(f)["rows"] if not r.get("error")}


def _ratio(a, b):
    return a / b if a and b else None


def _fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def compare(base, new):
    lines = ["| case | op | base us | new us | ratio | base graph us | new graph us | graph ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    cold, graph = [], []
    for key in base:
        if key not in new:
            continue
        b, n = base[key], new[key]
        rc, rg = _ratio(b["time_us"], n["time_us"]), _ratio(b["graph_us"], n["graph_us"])
        cold += [rc] if rc else []
        graph += [rg] if rg else []
        lines.append(f"| {key[0]} | {key[1]} | {_fmt(b['time_us'], 1)} | {_fmt(n['time_us'], 1)} | "
                     f"{_fmt(rc)} | {_fmt(b['graph_us'], 1)} | {_fmt(n['graph_us'], 1)} | {_fmt(rg)} |")

    def geo(xs):
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None

    def span(xs):
        return f"{min(xs):.2f}-{max(xs):.2f}" if xs else "-"

    lines += ["", f"{len(cold)} cold rows: geomean ratio {_fmt(geo(cold), 3)}, range {span(cold)}; "
              f"{len(graph)} graph rows: geomean {_fmt(geo(graph), 3)}, range {span(graph)}"]
    missing = sorted(set(base) ^ set(new))
    if missing:
        lines.append(f"rows in only one run: {len(missing)}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    text = "\n".join(compare(_rows(args.base), _rows(args.new))) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
