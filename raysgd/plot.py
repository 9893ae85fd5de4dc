"""Training curves from a run's ``metrics.csv``: ``python -m raysgd.plot RUN_DIR [-o curves.png]``.

Columns that differ only by phase prefix (``train_loss``, ``val_loss``) share a
panel with one line per phase. matplotlib is imported lazily and used without
pyplot, so plotting never changes the backend or global state of the caller.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import tempfile
from dataclasses import dataclass

from raysgd.errors import RaySGDError

CSV_NAME = "metrics.csv"
# Both validation spellings land on one label so train/val lines share a legend vocabulary.
PHASES = (("train_", "train"), ("validation_", "validation"), ("val_", "validation"))
BOOKKEEPING_SUFFIXES = ("num_samples", "batch_count")
MISSING_MATPLOTLIB = ("raysgd.plot needs matplotlib: pip install matplotlib "
                      "(or pip install 'raysgd[plot]')")


class PlotError(RaySGDError, ValueError):
    """The run directory or its metrics.csv cannot be plotted."""


@dataclass(frozen=True)
class Point:
    step: int
    epoch: int | None
    value: float


@dataclass(frozen=True)
class Series:
    label: str
    column: str
    xs: tuple[int, ...]
    ys: tuple[float, ...]


@dataclass(frozen=True)
class Panel:
    name: str
    series: tuple[Series, ...]


@dataclass(frozen=True)
class Layout:
    x_label: str
    panels: tuple[Panel, ...]


def _number(cell: str) -> float | None:
    """The cell as a finite float, or None (empty, text, nan or inf: inf would wreck autoscale)."""
    try:
        value = float(cell)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_metrics(csv_path: str) -> dict[str, list[Point]]:
    """Per metric column (file order; not step/epoch), the rows whose cell is a finite number."""
    try:
        with open(csv_path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise PlotError(f"{csv_path} is not a readable CSV ({exc}); pass the metrics.csv "
                        "written by raysgd's CSVLogger or the run directory holding it.") from exc
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise PlotError(f"{csv_path} is empty: no header row. Train for at least one call "
                        "of train() or validate() with checkpoint_dir set, then plot again.")
    header = [name.strip() for name in rows[0]]
    if "step" not in header:
        raise PlotError(f"{csv_path} has no 'step' column (header: {','.join(header)}); "
                        "raysgd.plot reads files written by raysgd's CSVLogger.")
    step_at, epoch_at = header.index("step"), header.index("epoch") if "epoch" in header else None
    points: dict[str, list[Point]] = {n: [] for n in header if n and n not in ("step", "epoch")}
    for row in rows[1:]:
        step = _number(row[step_at]) if step_at < len(row) else None
        if step is None:  # a torn last line from a crashed writer: nothing to place it at
            continue
        epoch = _number(row[epoch_at]) if epoch_at is not None and epoch_at < len(row) else None
        for index, name in enumerate(header[:len(row)]):
            value = _number(row[index]) if name in points else None
            if value is not None:
                points[name].append(Point(int(step), None if epoch is None else int(epoch), value))
    return points


def split_phase(column: str) -> tuple[str | None, str]:
    """('train', 'loss') for 'train_loss'; (None, column) when there is no phase prefix."""
    for prefix, phase in PHASES:
        if column.startswith(prefix) and len(column) > len(prefix):
            return phase, column[len(prefix):]
    return None, column


def is_plotted(column: str) -> bool:
    """False for bookkeeping columns, which only say how much work a call did."""
    return column not in ("step", "epoch") and not column.endswith(BOOKKEEPING_SUFFIXES)


def choose_x(metrics: dict[str, list[Point]], columns: list[str]) -> str:
    """'epoch', unless some series lacks epochs or has several steps within one epoch."""
    for name in columns:
        steps = {p.step: p.epoch for p in metrics[name]}
        epochs = list(steps.values())
        if None in epochs or len(set(epochs)) < len(epochs):
            return "step"
    return "epoch"


def build_layout(metrics: dict[str, list[Point]]) -> Layout:
    """Panels in drawing order ('loss' first, then by first column) with their series."""
    columns = [c for c in metrics if is_plotted(c) and metrics[c]]
    x = choose_x(metrics, columns)
    grouped: dict[str, list[Series]] = {}
    for column in columns:
        phase, name = split_phase(column)
        # x -> value with later rows winning: a resumed run may re-log a step it logged before.
        values = {getattr(p, x): p.value for p in metrics[column]}
        xs = tuple(sorted(values))
        series = grouped.setdefault(name, [])
        # Two columns mapping to one label (val_loss and validation_loss) keep their own names.
        label = phase or column
        if any(s.label == label for s in series):
            label = column
        series.append(Series(label, column, xs, tuple(values[v] for v in xs)))
    names = sorted(grouped, key=lambda n: n != "loss")  # stable: the rest keep column order
    return Layout("epoch" if x == "epoch" else "global step",
                  tuple(Panel(n, tuple(grouped[n])) for n in names))


def panel_title(panel: Panel) -> str:
    """'loss'; 'accuracy (validation)' when one phase alone has it, since no legend says so."""
    title = panel.name.replace("_", " ")
    only = panel.series[0].label if len(panel.series) == 1 else None
    return f"{title} ({only})" if only in ("train", "validation") else title


def draw(layout: Layout, title: str):
    """A matplotlib Figure (no pyplot) with one panel per metric, up to 3 per row."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as exc:
        raise ImportError(MISSING_MATPLOTLIB) from exc
    ncols = min(3, len(layout.panels))
    nrows = math.ceil(len(layout.panels) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.5 * nrows + 0.4), layout="constrained")
    FigureCanvasAgg(fig)  # attaches itself to fig; savefig then needs no global backend
    fig.suptitle(title)
    for index, panel in enumerate(layout.panels):
        ax = fig.add_subplot(nrows, ncols, index + 1)
        for series in panel.series:
            # Markers so that a series with a single point (one validate() call) still shows.
            ax.plot(series.xs, series.ys, marker="o", markersize=3.5, label=series.label)
        ax.set_title(panel_title(panel))
        ax.set_xlabel(layout.x_label)
        ax.set_ylabel(panel.name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(panel.series) > 1:
            ax.legend()
    return fig


def find_csv(path: str) -> str:
    """The metrics.csv for ``path``: the file itself, or the one inside a run directory."""
    if not os.path.exists(path):
        raise PlotError(f"{path} does not exist; pass a run directory (the trainer's "
                        "checkpoint_dir) or the metrics.csv inside it.")
    if os.path.isdir(path):
        csv_path = os.path.join(path, CSV_NAME)
        if not os.path.isfile(csv_path):
            raise PlotError(f"{path} has no {CSV_NAME}; pass TorchTrainer(checkpoint_dir=...) "
                            "so a run writes one, then plot that directory.")
        return csv_path
    return path


def plot_run(path: str, out: str | None = None) -> str:
    """Draw the curves of a run directory (or its metrics.csv) to a PNG; returns the path."""
    csv_path = find_csv(path)
    layout = build_layout(read_metrics(csv_path))
    if not layout.panels:
        raise PlotError(f"{csv_path} has no plottable metric: every column is empty, "
                        "non-numeric or bookkeeping (step, epoch, *num_samples, *batch_count). "
                        "Plot again after a train() or validate() call has logged one.")
    out = out or os.path.join(os.path.dirname(os.path.abspath(csv_path)), "curves.png")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise PlotError(f"cannot write {out}: its directory does not exist; create it "
                        "or pass another -o/--output.")
    run_name = os.path.basename(os.path.dirname(os.path.abspath(csv_path)))
    fig = draw(layout, title=run_name)
    # Temp file + rename in the same directory: a viewer polling the PNG never sees half of it.
    fd, tmp = tempfile.mkstemp(suffix=".png", prefix=".curves-",
                               dir=os.path.dirname(os.path.abspath(out)))
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=110)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would survive the rename
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str] | None = None) -> int:
    """CLI entry: prints the PNG written and returns 0, or prints the problem and returns 2."""
    parser = argparse.ArgumentParser(prog="python -m raysgd.plot",
                                     description="Draw training curves from a run's metrics.csv.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory or its metrics.csv")
    parser.add_argument("-o", "--output", help="PNG to write (default: curves.png next to the csv)")
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.run_dir, args.output)
    except (PlotError, ImportError, OSError) as exc:  # user-fixable: message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
