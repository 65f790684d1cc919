#!/usr/bin/env python3
"""verifyd's architecture as one picture (README's top): a scheduler process, the per-GPU daemon's
floors (plans/0014-layout.md, shared/ARCHITECTURE.md) and the three ways a Verify travels.

  architecture_diagram.py -o plans/figures/architecture.png"""
from __future__ import annotations

import sys

import diagram_cli
from matplotlib.patches import FancyBboxPatch

BLUE, ORANGE, GREEN, GREY = "#4C72B0", "#DD8452", "#55A868", "#8C8C8C"


def box(ax, x, y, w, h, title, body="", colour=BLUE, fill="#EEF2F7"):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=fill, edgecolor=colour, linewidth=1.4))
    ax.text(x + w / 2, y + h - 0.12, title, ha="center", va="top", fontsize=9.5, weight="bold")
    if body:
        ax.text(x + w / 2, y + h - 0.42, body, ha="center", va="top", fontsize=7.8,
                linespacing=1.3)


def arrow(ax, a, b, label, colour, offset=(0, 0.08), both=False):
    ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="<|-|>" if both else "-|>",
                                                    color=colour, linewidth=1.6))
    mid = ((a[0] + b[0]) / 2 + offset[0], (a[1] + b[1]) / 2 + offset[1])
    ax.text(*mid, label, ha="center", va="bottom", fontsize=8, color=colour,
            bbox=dict(facecolor="white", edgecolor="none", pad=0.8))


def draw(fig, ax) -> None:
    # The scheduler process (left).
    box(ax, 0.1, 4.3, 3.0, 2.5, "scheduler process",
        "engine: model layers on its stream\nverifyd::client (C++) or the verifyd\n"
        "Python package; GroupClient: one\ndaemon per tensor-parallel rank\n"
        "registered buffers: q, tree KV,\nout, lse, ready / done flags", GREY, "#F4F4F4")
    # The daemon (right): its floors, top to bottom.
    ax.add_patch(FancyBboxPatch((4.3, 0.2), 7.9, 6.75, boxstyle="round,pad=0.02",
                                facecolor="none", edgecolor=GREY, linestyle="--"))
    ax.text(4.45, 6.8, "verifyd: one daemon per GPU", fontsize=9, color=GREY, va="top")
    box(ax, 4.6, 5.3, 7.3, 1.25, "service/  (the gRPC edge)",
        "Unix socket (owner) / TCP + token; decode and validate; Append, Verify, Commit, Release,"
        "\nFork, Compact, Stats; shared-memory and device-memory registries; channel listener;"
        " Prometheus; event log")
    box(ax, 4.6, 3.75, 7.3, 1.25, "executor/  (one per device)",
        "queue and batching per layer, riding commits, leases, compaction manager,\n"
        "the channels' consumers (descriptors from the rings, completions back)")
    box(ax, 4.6, 2.2, 3.55, 1.25, "backend/", "cpu/: reference arithmetic\ncuda/: KV pool, slot "
        "mirror,\nstaging, graph cache")
    box(ax, 8.35, 2.2, 3.55, 1.25, "kvstore/", "slot allocator, sequences,\nslot tables, "
        "pending trees,\nleases, compaction plans", GREEN, "#EEF7F0")
    box(ax, 4.6, 0.5, 3.55, 1.4, "kernels/  (GPU)", "flash tree-verify (sm_90a wgmma;\nportable "
        "sm_80 / sm_120), combine,\ntree-KV write, slot scatter", ORANGE, "#FBF0E8")
    box(ax, 8.35, 0.5, 3.55, 1.4, "verify/ + base/", "the math contract (SPEC §1): dims,\nbf16, "
        "TreeMask, parents rule;\nstatus macros, CUDA checks", GREEN, "#EEF7F0")
    for x, y0, y1 in [(8.25, 5.3, 5.0), (6.4, 3.75, 3.45), (10.1, 3.75, 3.45), (6.4, 2.2, 1.9),
                      (10.1, 2.2, 1.9)]:
        ax.annotate("", xy=(x, y1), xytext=(x, y0),
                    arrowprops=dict(arrowstyle="-|>", color=GREY, linewidth=1.2))
    # The three ways a Verify travels.
    arrow(ax, (3.1, 6.2), (4.6, 6.0), "gRPC (any host)", BLUE, both=True)
    arrow(ax, (3.1, 5.3), (4.6, 5.55), "shared memory\n(same host)", BLUE, offset=(0, -0.45),
          both=True)
    arrow(ax, (3.1, 4.6), (4.6, 4.35), "channel ring: descriptors /\ncompletions (no RPC)",
          ORANGE, offset=(-0.15, -0.62), both=True)
    ax.annotate("", xy=(4.6, 1.2), xytext=(1.6, 4.3),
                arrowprops=dict(arrowstyle="<|-|>", color=ORANGE, linewidth=1.6,
                                connectionstyle="arc3,rad=0.25"))
    ax.text(0.15, 0.55, "CUDA IPC: the kernels read q and write\nout / lse in the scheduler's "
            "memory;\nthe two streams order each other\nthrough ready / done flags",
            fontsize=8, color=ORANGE, ha="left")
    ax.set_xlim(0, 12.4)
    ax.set_ylim(0, 7.1)


if __name__ == "__main__":
    sys.exit(diagram_cli.run(__doc__, (12.5, 7.2), draw))

