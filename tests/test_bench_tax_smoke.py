"""Smoke test for ``python -m bench.tax --quick``: every cell runs and reports every figure.

It asserts nothing about the bars (the quick sizes are tiny, their figures mean little);
only that each run worked, that the JSON holds each cell's figures (numbers > 0 where they
must be) and that the tables and the bars were printed. The commit figures that raysgd's
``train(profile=True)`` reports (``commits``, ``commit_hold_s``) may be absent from an older
raysgd: then they must be None, not wrong.
"""
import pytest

from bench_runs import WAIT_TIMEOUT_S

CELLS = {"ddp/small", "ddp/medium", "fsdp/small"}  # bench.tax.cli.QUICK_CELLS
POSITIVE = ("state_bytes_per_rank", "copy_s", "raysgd_samples_per_s", "loop_samples_per_s",
            "steady_ratio", "raysgd_peak_pss_mib", "loop_peak_pss_mib",
            "raysgd_peak_rss_mib", "loop_peak_rss_mib")
PRESENT = ("memory_over_state_pss", "memory_over_state_rss", "cpu_per_commit_ranks_s",
           "cpu_per_commit_tree_s")  # differences: any sign on a tiny quick model
BARS = ("DDP steady ratio to the loop", "FSDP steady ratio to torchrun FSDP2",
        "host memory that grows with the state, beyond the loop's, ÷ the state (PSS)",
        "steps redone per killed rank, DDP",
        "steps redone per killed rank ÷ the commit interval, FSDP",
        "peak memory growth from the 1st to the 3rd of three kills in a row, ÷ the state",
        "training-thread time per commit at large ÷ one plain copy")


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_tax_quick_reports_every_figure(bench_quick):
    # python -m bench.tax --quick --out ... (bench_runs.QUICK_RUNS)
    run = bench_quick.result("tax", WAIT_TIMEOUT_S)
    document, stdout = run.document(), run.stdout
    assert set(document["cells"]) == CELLS
    assert not document["copy_probe"]["error"]
    for name, cell in document["cells"].items():
        runs, summary = cell["runs"], cell["summary"]
        assert len(runs["raysgd"]) == len(runs["loop"]) == 1, name
        assert runs["loop_huge"] == [] and summary["like_for_like_ratio"] is None, name
        for kind_runs in runs.values():
            for one in kind_runs:
                assert one["ok"], f"{name}: {one.get('error')}"
        for figure in POSITIVE:
            assert summary[figure] is not None and summary[figure] > 0, (name, figure, summary)
        for figure in PRESENT:
            assert isinstance(summary[figure], float), (name, figure, summary)
        epochs = len(runs["raysgd"][0]["epoch_s"])
        assert epochs >= 2 and len(summary["raysgd_epoch_s"]) == len(summary["loop_epoch_s"]) \
            == epochs and min(summary["raysgd_epoch_s"] + summary["loop_epoch_s"]) > 0, summary
        probe = runs["raysgd"][0]["probe"]
        assert [call["expected_in_epoch_commits"] for call in probe["calls"]] == [0, 1], probe
        if summary["hold_per_commit_s"] is None:  # a raysgd that does not report commits
            assert summary["in_epoch_commits_per_run"] is None, summary
        else:
            assert summary["hold_per_commit_s"] > 0 and summary["hold_over_copy"] > 0, summary
            assert summary["in_epoch_commits_per_run"] >= 1, summary
            assert [call["commits"][0] for call in probe["calls"]] == [0, 1], probe
        # --quick kills rank 1 in three calls in a row in ddp/small only, on the full size.
        if name == "ddp/small":
            kill = runs["kill"][0]
            assert kill["failures"] == kill["recoveries"] == len(kill["calls"]) == 3, kill
            assert all(call["kill_error"] is None for call in kill["calls"]), kill
            assert summary["steps_redone"] >= 0 and summary["kill_to_next_step_s"] > 0, summary
            assert isinstance(summary["growth_over_kills"], float), summary
            assert summary["interval_at_kill"] >= 1, summary  # "auto" chose one, printed too
        else:
            assert runs["kill"] == [] and summary["steps_redone"] is None, summary
    assert [bar["figure"] for bar in document["bars"]] == list(BARS)
    for bar in BARS:
        assert bar in stdout, bar  # the bars table was printed ...
    assert "met" in stdout and "raysgd/loop" in stdout and "beyond ÷ state (PSS)" in stdout
    assert "memory_method" in document["meta"]
    assert isinstance(document["cells"]["ddp/medium"]["summary"]["memory_growth_pss"], float)


def test_a_bar_no_cell_of_which_ran_is_not_called_met():
    from bench.tax.report import bars

    done = {"ddp/large": {"summary": {"steady_ratio": 0.99, "hold_over_copy": 0.01,
                                      "memory_growth_pss": None, "steps_redone": 0},
                          "runs": {"kill": [{}]}}}
    met = {bar["figure"]: bar["met"] for bar in bars(done)}
    assert met["host memory that grows with the state, beyond the loop's, ÷ the state (PSS)"] \
        is None  # no cell had a smaller one of its strategy to compare with
    assert met["DDP steady ratio to the loop"] is None  # small and medium did not run
    assert met["training-thread time per commit at large ÷ one plain copy"] is None
    done["fsdp/large"] = {"summary": {"steady_ratio": None, "hold_over_copy": 0.2,
                                      "memory_growth_pss": None}, "runs": {"kill": []}}
    assert {b["figure"]: b["met"] for b in bars(done)}[
        "training-thread time per commit at large ÷ one plain copy"] is False


def test_the_like_for_like_ratio_is_against_the_loop_with_huge_pages():
    from bench.tax.report import cell_summary

    def run(rate):
        return {"ok": True, "steady_samples_per_s": rate, "epoch_s": [1.0, 1.0],
                "peak_pss_mib": 1.0, "peak_mem_mib": 1.0}

    runs = {"raysgd": [run(90.0)], "loop": [run(60.0)], "loop_huge": [run(100.0), run(80.0)],
            "kill": []}
    summary = cell_summary(runs, None, "ddp", 2)
    assert summary["steady_ratio"] == 1.5 and summary["like_for_like_ratio"] == 1.0
    del runs["loop_huge"]  # a JSON of a run before the variant existed
    assert cell_summary(runs, None, "ddp", 2)["like_for_like_ratio"] is None
