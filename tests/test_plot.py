"""raysgd.plot: metrics.csv -> panels -> PNG, and the CLI's exit codes and messages."""
import os
import subprocess
import sys

import pytest

from raysgd import plot

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = ("step,epoch,train_loss,train_num_samples,train_batch_count,train_samples_per_s,"
          "val_loss,val_accuracy,val_num_samples,val_batch_count,val_samples_per_s")
EXAMPLE = HEADER + """
23,1,1.52,1437,23,4100.5,,,,,
23,1,,,,,0.9,0.71,360,6,9000.0
46,2,0.61,1437,23,4200.1,,,,,
46,2,,,,,0.4,0.88,360,6,9100.0
"""


def write_run(tmp_path, text, name="run"):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.csv").write_text(text)
    return run


def layout_of(tmp_path, text):
    return plot.build_layout(plot.read_metrics(str(write_run(tmp_path, text) / "metrics.csv")))


def panel(layout, name):
    return next(p for p in layout.panels if p.name == name)


def series(layout, name, label):
    return next(s for s in panel(layout, name).series if s.label == label)


def test_cli_writes_a_readable_png(tmp_path):
    import matplotlib.image

    run = write_run(tmp_path, EXAMPLE)
    out = tmp_path / "X.png"
    proc = subprocess.run([sys.executable, "-m", "raysgd.plot", str(run), "-o", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    pixels = matplotlib.image.imread(str(out))
    height, width = pixels.shape[:2]
    assert width > 800 and height > 250
    assert pixels.min() < 0.5  # something dark was drawn, not a blank canvas
    assert sorted(os.listdir(tmp_path)) == ["X.png", "run"]  # no temp file left behind


def test_plot_run_leaves_pyplot_unimported(tmp_path):
    run = write_run(tmp_path, EXAMPLE)
    code = ("import sys; from raysgd.plot import plot_run; "
            f"print(plot_run({str(run)!r})); "
            "print('matplotlib.pyplot' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(run / "curves.png"), "False"]
    assert (run / "curves.png").stat().st_size > 10_000


def test_panels_group_phases_and_skip_bookkeeping(tmp_path):
    layout = layout_of(tmp_path, EXAMPLE)
    assert layout.x_label == "epoch"
    assert [p.name for p in layout.panels] == ["loss", "samples_per_s", "accuracy"]
    assert [s.label for s in panel(layout, "loss").series] == ["train", "validation"]
    assert series(layout, "loss", "train").xs == (1, 2)
    assert series(layout, "loss", "train").ys == (1.52, 0.61)
    assert series(layout, "loss", "validation").ys == (0.9, 0.4)
    assert [s.column for s in panel(layout, "accuracy").series] == ["val_accuracy"]
    drawn = {s.column for p in layout.panels for s in p.series}
    assert not any(c.endswith(("num_samples", "batch_count")) for c in drawn)
    assert "step" not in drawn and "epoch" not in drawn


def test_loss_first_and_user_metrics_without_prefix(tmp_path):
    text = ("step,epoch,train_lr,lr,validation_loss,train_loss,notes\n"
            "10,1,0.1,0.2,0.5,0.7,ok\n")
    layout = layout_of(tmp_path, text)
    assert [p.name for p in layout.panels] == ["loss", "lr"]  # notes is text: no points
    assert [s.label for s in panel(layout, "loss").series] == ["validation", "train"]
    assert [s.label for s in panel(layout, "lr").series] == ["train", "lr"]
    assert plot.panel_title(panel(layout, "loss")) == "loss"


def test_single_phase_panel_title_names_the_phase(tmp_path):
    layout = layout_of(tmp_path, EXAMPLE)
    assert plot.panel_title(panel(layout, "accuracy")) == "accuracy (validation)"


def test_x_axis_is_step_when_epochs_repeat(tmp_path):
    # train(num_steps=5) four times within epoch 0, then once into epoch 1.
    text = "step,epoch,train_loss\n5,0,2.0\n10,0,1.5\n15,0,1.2\n20,1,1.0\n"
    layout = layout_of(tmp_path, text)
    assert layout.x_label == "global step"
    assert series(layout, "loss", "train").xs == (5, 10, 15, 20)
    assert series(layout, "loss", "train").ys == (2.0, 1.5, 1.2, 1.0)


def test_x_axis_is_step_when_epoch_is_empty(tmp_path):
    layout = layout_of(tmp_path, "step,epoch,train_loss\n5,,2.0\n10,,1.5\n")
    assert layout.x_label == "global step"
    assert series(layout, "loss", "train").xs == (5, 10)


def test_x_axis_is_step_without_epoch_column(tmp_path):
    layout = layout_of(tmp_path, "step,loss\n3,1.0\n6,0.5\n")
    assert layout.x_label == "global step"
    assert [s.label for s in layout.panels[0].series] == ["loss"]


def test_resumed_run_keeps_the_last_value_per_x(tmp_path):
    # Resumed from the epoch-1 checkpoint: epoch 2 (step 46) was logged twice.
    text = ("step,epoch,train_loss,val_loss\n23,1,1.5,\n46,2,0.9,\n46,2,,0.8\n"
            "46,2,0.6,\n46,2,,0.5\n69,3,0.4,\n")
    layout = layout_of(tmp_path, text)
    assert layout.x_label == "epoch"  # the repeat is one step, not several steps per epoch
    assert series(layout, "loss", "train").xs == (1, 2, 3)
    assert series(layout, "loss", "train").ys == (1.5, 0.6, 0.4)
    assert series(layout, "loss", "validation").ys == (0.5,)


def test_torn_and_non_finite_cells_are_skipped(tmp_path):
    text = "step,epoch,train_loss\n1,1,nan\n2,2,0.5\n3,3,inf\n4,4,0.25\n5,"
    layout = layout_of(tmp_path, text)
    assert series(layout, "loss", "train").xs == (2, 4)


def test_csv_path_default_output_and_single_point(tmp_path):
    run = write_run(tmp_path, "step,epoch,val_accuracy\n10,1,0.5\n")
    written = plot.plot_run(str(run / "metrics.csv"))
    assert written == str(run / "curves.png")
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"),
    ("no_csv", "checkpoint_dir=..."),
    ("empty", "is empty"),
    ("no_step", "no 'step' column"),
    ("bookkeeping_only", "no plottable metric"),
    ("binary", "not a readable CSV"),
    ("no_out_dir", "directory does not exist"),
])
def test_user_errors_exit_2_with_a_message(tmp_path, capsys, case, needle):
    run = tmp_path / "run"
    run.mkdir()
    csv_text = {"empty": "", "no_step": "epoch,loss\n1,0.5\n",
                "bookkeeping_only": "step,epoch,train_num_samples,train_batch_count\n1,1,8,1\n",
                "no_out_dir": EXAMPLE}
    if case in csv_text:
        (run / "metrics.csv").write_text(csv_text[case])
    if case == "binary":
        (run / "metrics.csv").write_bytes(b"\xff\xfe\x00step\x89")
    target = str(tmp_path / "nope") if case == "missing" else str(run)
    argv = [target, "-o", str(tmp_path / "missing_dir" / "c.png")] if case == "no_out_dir" \
        else [target]
    assert plot.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err
    assert "Traceback" not in captured.err
    assert not (run / "curves.png").exists()


def test_missing_matplotlib_says_how_to_install(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path, EXAMPLE)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    assert plot.main([str(run)]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"raysgd\[plot\]"):
        plot.plot_run(str(run))
