"""The Ray Data benchmark's text: the figures table and the ratios with the target."""
from __future__ import annotations

from typing import Any, Dict, List

from tabulate import tabulate

from bench.data.catalog import FIGURES, HEADERS, Entry
from bench.report import cell, ratio_table


def tables(entries: List[Entry], summaries: Dict[str, Dict[str, Any]],
           ratios: List[Dict[str, Any]]) -> str:
    """The figures (median [min – max]) and the ratios (medians, target, met), as text."""
    rows = [[entry.name, entry.variant.label,
             *(cell(summaries[entry.name][figure]) for figure in FIGURES),
             max((summaries[entry.name][figure] or {}).get("n", 0) for figure in FIGURES)]
            for entry in entries]
    out = [tabulate(rows, headers=["variant", "what", *(HEADERS[f] for f in FIGURES), "n"])]
    if ratios:
        out.append(ratio_table(ratios, HEADERS))
    return "\n\n".join(out) + "\n"
