"""The commit protocol (``raysgd.commits``) under seeded fault schedules, and its pieces.

The target rules hold every invariant over thousands of schedules; each rule the grown code
had that differs is shown breaking one, as a case of its own (issue 70's four risks, and the
two more the simulation found). A failing schedule prints its seed: replay it with
``commit_sim.simulate(seed, rules, mix)`` and read ``World.trace``.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest

from commit_sim import KINDS, Mix, Violation, first_violation, simulate
from raysgd.commits.protocol import CommitProtocol, Current, Formed, Part, Point, Voided
from raysgd.commits.rules import GROWN, TARGET, TODAY, Rules
from raysgd.errors import ConfigError

MIXES = {
    "default": Mix(),
    "stray writes": Mix(stray_write=0.01),
    "heavy": Mix(kill=0.03, node_loss=0.02, user_error=0.01, notice=0.02, pause=0.05,
                 slow_ack=0.05, second=0.3, stray_write=0.005),
}
SCHEDULES = 1000  # per mix


def test_target_rules_keep_every_invariant_under_thousands_of_schedules():
    started, counts = time.perf_counter(), Counter()
    for mix in MIXES.values():
        for seed in range(SCHEDULES):
            counts.update(simulate(seed, TARGET, mix).counts)  # raises with the seed
    seconds = time.perf_counter() - started
    print(f"{len(MIXES) * SCHEDULES} schedules in {seconds:.1f} s")
    # The schedules did reach what the invariants are about, many times over.
    for what in ("restore after a failure", "restore after a user error",
                 "restore after a hand-over", "second failure", "survivors", "lose",
                 "timeout", "pause", "stray", "voided", "read", "copy"):
        assert counts[what] >= 30, (what, counts)
    assert counts["fallback"] == counts["catch-up"] == 0  # nothing under the target rules


def _only(field: str, **more) -> Rules:
    """The target rules with ``field`` (and ``more``) at the grown code's value."""
    return dataclasses.replace(TARGET, **{field: getattr(GROWN, field)},
                               **{name: getattr(GROWN, name) for name in more})


def _shows(rules: Rules, kind: str, mix: Mix, seeds: range = range(2000)) -> Violation:
    found = first_violation(rules, seeds, mix, kind)
    assert found is not None, f"no schedule broke {kind}"
    assert first_violation(TARGET, range(found.seed + 1), mix) is None
    with pytest.raises(Violation) as again:  # a seed replays the same schedule
        simulate(found.seed, rules, mix)
    assert again.value.trace == found.trace
    return found


def test_risk_1_a_view_commit_torn_after_a_slow_acknowledgement():
    """A rank trains on over a view the driver has taken but not yet stored; the part that
    arrives mixes two steps and is restored."""
    found = _shows(_only("snapshot", unacknowledged=True), "torn_restore", Mix())
    assert "trains on unacknowledged" in "\n".join(found.trace)


def test_risk_2_a_write_found_after_the_commit_it_tore_is_current():
    """A write outside an optimizer step tears a snapshot; found at the next settle, after
    the driver assembled the commit, with the re-commit on that rank alone."""
    rules = _only("write_check")
    _shows(rules, "torn_restore", Mix(stray_write=0.01))
    assert first_violation(rules, range(300), Mix()) is None  # no stray write, no tear


def test_risk_3_a_replace_leaves_survivors_without_buffers():
    """The driver keys names on processes and forgets them only for a new group: after a
    replace (or a part written to a buffer and then dropped) a rank is never named one."""
    found = _shows(_only("buffer_owner"), "buffer_lost", Mix())
    assert any(line.startswith("restore step") for line in found.trace)


def test_risk_4_a_read_after_a_lost_call_end_commit_sees_the_fallback():
    """A node lost before the call-end commit's copy landed: the ranks restore the fallback,
    and the catch-up runs only before calls that change state."""
    found = _shows(_only("current_when"), "stale_read",
                   Mix(node_loss=0.05, kill=0.0, user_error=0.0, notice=0.0))
    assert any("returns" in line for line in found.trace)


def test_one_fallback_is_not_enough_when_copies_lag_two_commits():
    """Found by the simulation: the newest commit and its fallback both have an uncopied
    part on a lost node; nothing is left to restore, though older commits were whole."""
    _shows(_only("current_when"), "no_commit", Mix())


def test_training_on_without_the_drivers_word_loses_more_than_an_interval():
    """Found by the simulation: a driver that stops polling (or answers slowly) lets ranks
    train on past commits it never holds, so a failure then loses every step since."""
    _shows(_only("unacknowledged"), "lost_work", Mix(pause=0.05))


def _kinds(rules: Rules, seeds: int = 300) -> set:
    kinds = set()
    for mix in MIXES.values():
        for seed in range(seeds):
            try:
                simulate(seed, rules, mix)
            except Violation as violation:
                kinds.add(violation.kind)
    assert kinds <= set(KINDS)
    return kinds


def test_the_grown_rules_break_what_the_target_keeps_and_today_still_the_ranks_part():
    assert {"torn_restore", "buffer_lost", "stale_read"} <= _kinds(GROWN, 600)
    today = _kinds(TODAY)  # the driver's current_when is the target's: no stale read
    assert {"torn_restore", "buffer_lost"} <= today and "stale_read" not in today


# ------------------------------------------------------------ the state machine itself
def _part(rank, step, node="D", buffer=None, void=False):
    return Part(rank, step, node, buffer, ref=(rank, step), void=void)


def test_a_commit_forms_once_every_rank_handed_over_one_step():
    proto = CommitProtocol(2, "D")
    assert proto.arrived(_part(0, 2)) == []
    assert proto.arrived(_part(1, 4)) == []
    (formed,) = proto.arrived(_part(1, 2))
    assert isinstance(formed, Formed) and formed.current and formed.point.step == 2
    assert proto.current.step == 2 and proto.after(1) == 4 and proto.after(0) == 2
    assert proto.arrived(_part(0, 1)) == []  # older than the commit: ignored


def test_target_rules_make_a_commit_current_only_once_its_copies_landed():
    proto = CommitProtocol(2, "D")
    proto.adopt(Point(0, (_part(0, 0), _part(1, 0))))
    proto.arrived(_part(0, 3, "A"))
    (formed,) = proto.arrived(_part(1, 3))
    assert not formed.current and formed.copies == (_part(0, 3, "A"),)
    assert proto.current.step == 0 and not proto.may_return(3)
    assert proto.copy_landed(1, 3) == []  # not a part that needed a copy
    (current,) = proto.copy_landed(0, 3)
    assert isinstance(current, Current) and proto.may_return(3)
    assert proto.fallback is None


def test_the_grown_rules_fall_back_and_owe_the_call_that_made_the_lost_commit():
    proto = CommitProtocol(2, "D", GROWN)
    proto.adopt(Point(0, (_part(0, 0), _part(1, 0))))
    proto.arrived(_part(0, 5, "A"), between_calls=True, made=("train", 5))
    proto.arrived(_part(1, 5), between_calls=True, made=("train", 5))
    assert proto.current.step == 5 and proto.fallback.step == 0
    choice = proto.restore(lambda part: part.node == "A")
    assert choice.point.step == 0 and choice.steps_lost == 5
    assert choice.catch_up == ("train", 5)
    assert proto.before_call(mutates=False) is None  # risk 4: a read is not caught up
    assert proto.before_call(mutates=True) == ("train", 5)
    assert proto.before_call(mutates=True) is None


def test_a_void_part_drops_its_step_on_every_rank():
    proto = CommitProtocol(2, "D")
    proto.arrived(_part(0, 2))
    assert proto.arrived(_part(1, 2, void=True)) == [Voided(2, 1)]
    assert proto.arrived(_part(0, 2)) == [] and proto.current is None
    assert isinstance(proto.arrived(_part(0, 4)) + proto.arrived(_part(1, 4)), list)
    assert proto.current.step == 4


def test_buffers_are_named_from_free_slots_and_as_each_rank_reports():
    proto = CommitProtocol(1, "D")
    assert proto.name(0, "A", process=1) is None  # off the driver's node
    first = proto.name(0, "D", process=1)
    assert (first.slot, first.version) == (0, 1)
    assert proto.name(0, "D", process=1, in_use={1}) is None  # it still holds it
    proto.arrived(_part(0, 2, buffer=1))  # the commit of step 2 lives in slot 0
    second = proto.name(0, "D", process=1)
    assert second.slot == 1
    proto.arrived(_part(0, 4, buffer=second.version))  # step 4 in slot 1: slot 0 is free
    assert proto.name(0, "D", process=1).slot == 0
    # A rank that reports a buffer it still writes keeps the other one out of reach too.
    proto2 = CommitProtocol(1, "D")
    held = proto2.name(0, "D", process=1)
    proto2.arrived(_part(0, 2, buffer=held.version))
    assert proto2.name(0, "D", process=1, in_use={99}).slot == 1
    proto2._holds[(0, 1)] = 99
    assert proto2.name(0, "D", process=1, in_use={99}) is None  # both slots needed


def test_the_grown_rules_never_name_again_to_a_process_they_named_once():
    proto = CommitProtocol(1, "D", GROWN)
    assert proto.name(0, "D", process=7) is not None
    proto.renewed(new_group=False)  # a replace: new runner, same process
    assert proto.name(0, "D", process=7) is None  # risk 3
    proto.renewed(new_group=True)
    assert proto.name(0, "D", process=7) is not None


def test_names_keyed_on_runners_are_named_again_after_a_replace():
    """Today's driver (``buffer_owner="runner"``): a replace's survivors keep their processes
    but not their runners, so they are named buffers again; an in-place rollback keeps both."""
    proto = CommitProtocol(1, "D", TODAY)
    assert proto.name(0, "D", process=7, runner="r1") is not None
    proto.renewed(new_group=False)  # an in-place rollback: the same runner holds it still
    assert proto.name(0, "D", process=7, runner="r1") is None
    proto.renewed(new_group=False)  # a replace: the same process, a new runner
    assert proto.name(0, "D", process=7, runner="r2") is not None


def test_runner_keys_leave_only_the_dropped_parts_buffers_lost():
    """The simulation agrees: keyed on runners, the driver overwrites nothing, and only a
    part written to a buffer and then dropped (never reported) still loses one, so
    ``"reported"`` stays the target."""
    rules = dataclasses.replace(TARGET, buffer_owner="runner")
    kinds = _kinds(rules)
    assert kinds == {"buffer_lost"}, kinds
    process = _kinds(dataclasses.replace(TARGET, buffer_owner="process"), 100)
    assert process == {"buffer_lost"}


def test_rules_refuse_an_unknown_choice():
    with pytest.raises(ConfigError, match="Rules.snapshot='copy'"):
        Rules(snapshot="copy")


def test_a_pending_commit_is_restored_when_whole_and_stays_pending_until_copied():
    proto = CommitProtocol(2, "D")
    proto.adopt(Point(0, (_part(0, 0), _part(1, 0))))
    proto.arrived(_part(0, 3))
    proto.arrived(_part(1, 3, "A"))
    alive = {"D", "A"}

    def lost(part):
        return part.node not in alive

    assert proto.restore(lost).point.step == 3  # a rank died: its node's store still has it
    proto.restored(3)
    assert proto.current.step == 0 and [p.step for p in proto.pending] == [3]
    alive.discard("A")  # then the node goes before the copy landed
    assert proto.restore(lost).point.step == 0
    assert proto.pending == []
    assert proto.held() == [None]  # the payloads: none given here
