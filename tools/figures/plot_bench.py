#!/usr/bin/env python3
"""Charts from the benchmarks' own output text (matplotlib from Debian's python3-matplotlib).

  plot_bench.py decode LOG [LOG...] -o decode_step.png
      tools/bench/decode_step_bench's table(s): "| way (MPS on) | ms/step | layer p50 µs | layer
      p99 µs | ÷ in-process | per-layer over in-process µs |", or the same with an MPS column
      ("| way | MPS | ms/step | ..."), as plans/ copies it. One bar per way and MPS state
      (ms/step), labelled with ÷ in-process and the µs per layer over it.
  plot_bench.py kernel LOG [LOG...] -o kernel_floor.png
      tools/bench/mla_verify_bench's closing table ("shape path time_us TFLOP/s GB/s floor_us
      /floor /burst MHz ..."; a "-" where a value is unknown). Bars of kernel ÷ floor per shape,
      one colour per path, with ÷ burst floor as a tick on each bar and the 2.0 x burst line.

A log may hold anything else (the benches' progress lines, '#' comments): only the tables are
read. The lead regenerates the pictures in plans/figures/ from new runs with the same commands
(tools/figures/README.md)."""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # files only: no display on the build machines
import matplotlib.pyplot as plt  # noqa: E402


@dataclass
class DecodeRow:
    way: str
    mps: str  # "on", "off" or "" (not said)
    ms_per_step: float
    ratio: Optional[float]
    per_layer_us: Optional[float]


@dataclass
class KernelRow:
    shape: str
    path: str
    us: float
    ratio: Optional[float]        # ÷ floor (sustained)
    burst_ratio: Optional[float]  # ÷ burst floor


def _number(text: str) -> Optional[float]:
    text = text.strip().strip("*").replace("+", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse_decode(text: str) -> List[DecodeRow]:
    rows: List[DecodeRow] = []
    columns: Optional[List[str]] = None
    table_mps = ""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            columns = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells and cells[0].startswith("way") and any("ms/step" in c for c in cells):
            columns = [c.lower() for c in cells]
            m = re.search(r"MPS (on|off)", cells[0])
            table_mps = m.group(1) if m else ""
            continue
        if columns is None or set(line) <= set("|-: "):
            continue
        row = dict(zip(columns, cells))
        ms = _number(row.get("ms/step", ""))
        if ms is None:
            continue
        rows.append(DecodeRow(row[columns[0]].strip("*"), row.get("mps", table_mps).strip("*"),
                              ms, _number(row.get("÷ in-process", "")),
                              _number(row.get("per-layer over in-process µs", ""))))
    return rows


def parse_kernel(text: str) -> List[KernelRow]:
    rows: List[KernelRow] = []
    header: Optional[List[str]] = None
    for line in text.splitlines():
        words = line.split()
        if words[:3] == ["shape", "path", "time_us"]:
            header = words
            continue
        if header is None or not words or words[0].startswith("#"):
            continue
        if len(words) != len(header):
            header = None  # the table ended
            continue
        row = dict(zip(header, words))
        us = _number(row["time_us"])
        if us is None:
            continue
        rows.append(KernelRow(row["shape"], row["path"], us, _number(row.get("/floor", "-")),
                              _number(row.get("/burst", "-"))))
    return rows


def plot_decode(rows: List[DecodeRow], out: str, title: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.6))
    labels = [f"{r.way}" + (f"  (MPS {r.mps})" if r.mps else "") for r in rows]
    colours = ["#4C72B0" if r.way.startswith("in-process") else
               "#DD8452" if "stream order" in r.way else "#8C8C8C" for r in rows]
    y = list(range(len(rows)))[::-1]
    ax.barh(y, [r.ms_per_step for r in rows], color=colours)
    for yi, r in zip(y, rows):
        note = f"{r.ms_per_step:.2f} ms"
        if r.ratio is not None:
            note += f"  {r.ratio:.3f}x"
        if r.per_layer_us:
            note += f"  {r.per_layer_us:+.1f} µs/layer"
        ax.text(r.ms_per_step, yi, "  " + note, va="center", fontsize=9)
    ax.set_yticks(y, labels, fontsize=9)
    ax.set_xlabel("ms per decode step (61 layers); labels: ÷ in-process, µs per layer over it")
    ax.set_xlim(0, max(r.ms_per_step for r in rows) * 1.45)
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def plot_kernel(rows: List[KernelRow], out: str, title: str) -> None:
    shapes: List[str] = []
    paths: List[str] = []
    for r in rows:
        shapes += [r.shape] if r.shape not in shapes else []
        paths += [r.path] if r.path not in paths else []
    by: Dict[tuple, KernelRow] = {(r.shape, r.path): r for r in rows}  # the last run of each wins
    fig, ax = plt.subplots(figsize=(1.1 * len(shapes) + 2.5, 4.6))
    width = 0.8 / len(paths)
    palette = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    for k, path in enumerate(paths):
        xs, ratios, bursts = [], [], []
        for i, shape in enumerate(shapes):
            r = by.get((shape, path))
            if r is None or r.ratio is None:
                continue
            xs.append(i + (k - (len(paths) - 1) / 2) * width)
            ratios.append(r.ratio)
            bursts.append(r.burst_ratio)
        ax.bar(xs, ratios, width * 0.95, color=palette[k % len(palette)], label=f"{path}: ÷ floor")
        ax.scatter([x for x, b in zip(xs, bursts) if b is not None],
                   [b for b in bursts if b is not None], marker="_", s=250, color="black",
                   zorder=3, label="÷ burst floor" if k == 0 else None)
        for x, v in zip(xs, ratios):
            ax.text(x, v + 0.03, f"{v:.2f}", ha="center", fontsize=7)
    ax.axhline(2.0, color="#C44E52", linestyle="--", linewidth=1)
    ax.text(-0.45, 2.04, "2.0: the must (÷ burst floor ≤ 2.0)", color="#C44E52", fontsize=8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("kernel time ÷ roofline floor")
    ax.set_ylim(0, max(max(r.ratio or 0, r.burst_ratio or 0) for r in rows) * 1.15)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=("decode", "kernel"))
    p.add_argument("logs", nargs="+", help="bench output text ('-': stdin)")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    p.add_argument("--title", default="")
    args = p.parse_args(argv)
    text = "\n".join(sys.stdin.read() if path == "-" else open(path).read()
                     for path in args.logs)
    if args.kind == "decode":
        rows = parse_decode(text)
        if not rows:
            print("plot_bench: no decode-step table in the input", file=sys.stderr)
            return 1
        plot_decode(rows, args.out, args.title or "decode step, 61 layers (decode_step_bench)")
    else:
        rows = parse_kernel(text)
        if not rows:
            print("plot_bench: no mla_verify_bench table in the input", file=sys.stderr)
            return 1
        plot_kernel(rows, args.out, args.title or "flash verify kernel ÷ floor (mla_verify_bench)")
    print(f"plot_bench: {len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
