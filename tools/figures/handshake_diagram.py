#!/usr/bin/env python3
"""The per-layer ready/done handshake of the co-located data plane (SPEC §3.1, plans/0017 and
0018) as a sequence diagram: who writes what, in which order, and where nobody's CPU waits.

  handshake_diagram.py -o plans/figures/handshake.png

The steps are the ones backend/cuda/cuda_backend.h states for ComputeVerifyExternal and
python/verifyd/dataplane_channel.py for Channel.verify; edit STEPS when they change."""
from __future__ import annotations

import sys

import diagram_cli
import matplotlib.pyplot as plt

LANES = ["scheduler CPU", "scheduler's stream", "channel ring\n(shared memory)",
         "verifyd executor", "verifyd's stream", "ready / done flags\n(device memory)"]
SCHED_CPU, SCHED_STREAM, RING, EXECUTOR, VD_STREAM, FLAGS = range(len(LANES))

# (from, to, label); from == to: work on that lane. "async" steps are enqueued, not waited for.
STEPS = [
    (SCHED_STREAM, SCHED_STREAM, "layer l's model GEMM writes q and tree_kv"),
    (SCHED_CPU, RING, "Verify descriptor: layer, sequences, q / tree_kv / out / lse as region +"
                      " offset, ready = (flag, n), done = (flag, n)"),
    (SCHED_CPU, SCHED_STREAM, "enqueue: write ready = n, then wait done >= n (CPU returns)"),
    (RING, EXECUTOR, "the executor takes the descriptor (checks it, batches the layer)"),
    (EXECUTOR, VD_STREAM, "enqueue (one graph replay): wait ready >= n, upload, slot scatter,\n"
                          "tree-KV write, value check, flash + combine, write done = n"),
    (SCHED_STREAM, FLAGS, "ready = n (after the GEMM, in stream order)"),
    (FLAGS, VD_STREAM, "ready >= n: the wait ends"),
    (VD_STREAM, VD_STREAM, "attention reads q from the scheduler's memory, writes out and lse"),
    (VD_STREAM, FLAGS, "done = n"),
    (FLAGS, SCHED_STREAM, "done >= n: the wait ends; layer l+1's GEMM runs on out"),
    (EXECUTOR, RING, "completion record (id, code, message) once the device's value check"
                     " has answered"),
    (RING, SCHED_CPU, "result() / poll(): read whenever the scheduler likes (an error: NaN"
                      " outputs, done still written)"),
]


def draw(fig, ax) -> None:
    n = len(STEPS)
    xs = [i * 2.2 for i in range(len(LANES))]
    top, bottom = 0.0, -(n + 1)
    for x, name in zip(xs, LANES):
        ax.plot([x, x], [top - 0.2, bottom], color="#999999", linewidth=1, zorder=1)
        ax.text(x, top + 0.1, name, ha="center", va="bottom", fontsize=9, weight="bold",
                bbox=dict(boxstyle="round", facecolor="#EEF2F7", edgecolor="#4C72B0"))
    for k, (a, b, label) in enumerate(STEPS):
        y = -(k + 1)
        colour = "#DD8452" if FLAGS in (a, b) else "#4C72B0"
        if a == b:
            ax.add_patch(plt.Rectangle((xs[a] - 0.12, y - 0.3), 0.24, 0.6, color=colour,
                                       zorder=2))
            ax.text(xs[a] + 0.2, y, f"{k + 1}. {label}", va="center", fontsize=8.5,
                    bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
            continue
        ax.annotate("", xy=(xs[b], y), xytext=(xs[a], y),
                    arrowprops=dict(arrowstyle="-|>", color=colour, linewidth=1.3), zorder=3)
        left = min(xs[a], xs[b])
        ax.text(left + 0.08, y + 0.12, f"{k + 1}. {label}", va="bottom", fontsize=8.5,
                bbox=dict(facecolor="white", edgecolor="none", pad=0.5))
    ax.text(xs[0], bottom - 0.2, "Neither CPU waits for the GPU: the two streams order each "
            "other through the flags (orange).", fontsize=9, style="italic", va="top")
    ax.set_xlim(-1.2, xs[-1] + 2.4)
    ax.set_ylim(bottom - 0.8, top + 1.0)
    ax.set_title("one layer of a decode step through the co-located data plane", fontsize=11)


if __name__ == "__main__":
    sys.exit(diagram_cli.run(__doc__, (13, 0.62 * len(STEPS) + 2.2), draw))

