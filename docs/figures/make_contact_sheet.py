"""Draw one PNG of a comparison's figures side by side (the contact sheet in this folder).

    tlora-sim compare --trace synthetic:default --cluster 4x8xH100 \\
        --policies independent-backfill,mlora,tlora --seed 0 --out /tmp/demo --force
    python docs/figures/make_contact_sheet.py /tmp/demo docs/figures/demo_contact_sheet.png

Reads ``DIR/figures/<name>.png`` for the comparison figures (``sim/report/rundata.py``
``COMPARE_FIGURE_NAMES``) and tiles them, three per row, each titled with its file name.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import math

    import matplotlib.image as mpimg
    from matplotlib.figure import Figure

    from tlora_sim.sim.report.rundata import COMPARE_FIGURE_NAMES

    src, dst = Path(argv[0]), Path(argv[1])
    files = [src / "figures" / f"{n}.png" for n in COMPARE_FIGURE_NAMES if (src / "figures" / f"{n}.png").is_file()]
    cols = 3
    rows = math.ceil(len(files) / cols)
    fig = Figure(figsize=(cols * 4.2, rows * 3.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, f in zip(axes, files):
        ax.imshow(mpimg.imread(f))
        ax.set_title(f.name, fontsize=9)
        ax.set_axis_off()
    for ax in axes[len(files):]:
        ax.set_axis_off()
    fig.savefig(dst, dpi=120, metadata={"Software": None})
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
