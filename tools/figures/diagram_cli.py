"""The command line every diagram script shares: `-o OUT.png`, then the script's draw(fig, ax)
on an empty axis of the given size, saved at one resolution (so the pictures match)."""
from __future__ import annotations

import argparse
from typing import Callable, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")  # files only: no display on the build machines
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110


def run(doc: str, size: Tuple[float, float], draw: Callable,
        argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    out = p.parse_args(argv).out
    fig, ax = plt.subplots(figsize=size)
    draw(fig, ax)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    return 0
