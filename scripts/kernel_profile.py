#!/usr/bin/env python3
"""One step of an Nsight Compute CSV (scripts/device_check.sh profile) summed by kernel.

Reads ncu's raw CSV (`ncu --csv --print-units base --metrics ...`: a row per kernel and metric,
ncu's own lines before it), splits the launches into steps after each sampling kernel
(f32_argmax, f32_sample*), and prints for step STEP (default: the last) each kernel's launches
(a kernel of several grids, a row per grid),
total and per-call duration, DRAM bytes read and the bandwidth they make over its duration,
instructions issued, grid and registers, the longest first; the step's totals on the first
line. Usage: kernel_profile.py CSV[.gz] [--step N]. A file it cannot read, or without a kernel
row, a sampling kernel or the step asked for: one line on stderr naming the file, exit 2.
"""
import argparse
import collections
import csv
import gzip
import re
import sys

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "lts__t_bytes.sum", "smsp__inst_executed.sum")
COLUMNS = ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value")


class ProfileError(Exception):
    pass


def short(name):
    """The kernel's name without its namespace and parameter list."""
    name = re.sub(r"\(.*$", "", name.replace("(anonymous namespace)::", "")
                  .replace("unnamed>::", "").replace("void ", ""))
    return name.strip()


def read(path):
    """The kernels in launch order: name, grid and each metric's value."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith('"')]
    except (OSError, EOFError) as e:
        raise ProfileError(f"cannot read it: {e.strerror or e}") from None
    rows = csv.DictReader(lines)
    if rows.fieldnames is None or any(c not in rows.fieldnames for c in COLUMNS):
        raise ProfileError("not ncu's raw CSV (no ID, Kernel Name, Grid Size, Metric Name and "
                           "Metric Value columns)")
    kernels = collections.OrderedDict()
    for row in rows:
        if any(row.get(c) is None for c in COLUMNS):
            raise ProfileError(f"a row with too few columns at kernel {row.get('ID')!r:.40}")
        k = kernels.setdefault(row["ID"], {"name": short(row["Kernel Name"]),
                                           "grid": row["Grid Size"]})
        try:
            k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            k[row["Metric Name"]] = row["Metric Value"]
    if not kernels:
        raise ProfileError("no kernel in it")
    return list(kernels.values())


def steps_of(kernels):
    steps, cur = [], []
    for k in kernels:
        cur.append(k)
        if k["name"].startswith(("f32_argmax", "f32_sample")):
            steps.append(cur)
            cur = []
    return steps


def number(k, m):
    v = k.get(m, 0.0)
    return v if isinstance(v, float) else 0.0


def report(step, label):
    by = collections.OrderedDict()
    for k in step:
        b = by.setdefault((k["name"], k["grid"]), collections.Counter())
        b["n"] += 1
        for m in METRICS:
            b[m] += number(k, m)
        b["grid"] = k["grid"]
        b["regs"] = number(k, "launch__registers_per_thread")
    total_t = sum(b["gpu__time_duration.sum"] for b in by.values())
    total_r = sum(b["dram__bytes_read.sum"] for b in by.values())
    out = [f"{label}: {len(step)} kernels, {total_t / 1e3:.1f} us of kernel time, "
           f"{total_r / 1e6:.1f} MB read from DRAM "
           f"({total_r / total_t if total_t else 0:.0f} GB/s over the kernels' time)",
           f"{'kernel':58} {'n':>4} {'us':>9} {'us/call':>8} {'MB read':>9} {'GB/s':>6} "
           f"{'Minst':>7} {'grid':>16} {'regs':>4}"]
    for (name, _), b in sorted(by.items(), key=lambda kv: -kv[1]["gpu__time_duration.sum"]):
        t, r = b["gpu__time_duration.sum"], b["dram__bytes_read.sum"]
        out.append(f"{name[:58]:58} {b['n']:4d} {t / 1e3:9.1f} {t / 1e3 / b['n']:8.2f} "
                   f"{r / 1e6:9.1f} {r / t if t else 0:6.0f} "
                   f"{b['smsp__inst_executed.sum'] / 1e6:7.2f} {b['grid']:>16} {int(b['regs']):4d}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-1)
    args = ap.parse_args()
    try:
        steps = steps_of(read(args.csv))
        if not steps:
            raise ProfileError("no sampling kernel (f32_argmax, f32_sample*) ends a step in it")
        if not -len(steps) <= args.step < len(steps):
            raise ProfileError(f"--step {args.step}: it holds steps 0 to {len(steps) - 1}")
    except ProfileError as e:
        print(f"kernel_profile: {args.csv[:200]!r}: {e}", file=sys.stderr)
        return 2
    n = args.step % len(steps)
    print(report(steps[n], f"step {n} of {len(steps)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
