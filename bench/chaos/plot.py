"""The chaos benchmark's plot: goodput (median, min–max bars) against failures per minute."""
from __future__ import annotations

from typing import Any, Dict, List

from bench.chaos.summary import LABELS, TRAINERS, cell_key


def write_plot(summaries: Dict[str, Dict[str, Any]], mtbfs: List[float], path: str) -> bool:
    """Write the PNG; False (and nothing written) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for trainer in TRAINERS:
        points = []
        for mtbf in [None, *mtbfs]:
            stats = summaries.get(cell_key(trainer, mtbf), {}).get("goodput")
            if stats:
                points.append((0.0 if mtbf is None else 60.0 / mtbf, stats))
        if points:
            x = [p[0] for p in points]
            y = [p[1]["median"] for p in points]
            errors = [[p[1]["median"] - p[1]["min"] for p in points],
                      [p[1]["max"] - p[1]["median"] for p in points]]
            axes.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=LABELS[trainer])
    axes.set_xlabel("failures per minute (Poisson; 0 = unfaulted)")
    axes.set_ylabel("goodput (distinct samples / unfaulted torchrun)")
    axes.set_ylim(0, 1.1)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True
