"""``pretty_print``: a result dict (nested ``profile`` included) as a two-column table."""
from __future__ import annotations

import numbers
from typing import Any, Dict, List, Mapping, Tuple

from tabulate import tabulate


def _rows(result: Mapping[str, Any], prefix: str = "") -> List[Tuple[str, Any]]:
    rows: List[Tuple[str, Any]] = []
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            rows += _rows(value, prefix=f"{name}.")
        else:
            rows.append((name, _shown(value)))
    return rows


def _shown(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    return f"{value:.6g}"


def pretty_print(result: Dict[str, Any]) -> str:
    """``train()``/``validate()`` metrics, one per row; nested dicts as ``profile.mean_fwd_s``."""
    return tabulate(_rows(result), headers=("metric", "value"), tablefmt="simple",
                    disable_numparse=True)
