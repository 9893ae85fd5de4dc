"""Properties of how the driver puts commits together from the ranks' parts
(``CommitAssembler``) and whom it asks next (``waits_for_a_slot``), under random schedules:
each rank hands over its own increasing steps, skipping any of the others', in any
interleaving. Pure logic, no Ray."""
from hypothesis import given, settings
from hypothesis import strategies as st

from raysgd.driver.watch import waits_for_a_slot
from raysgd.state.commit import CommitAssembler

STEPS = st.lists(st.integers(1, 12), unique=True).map(sorted)


@st.composite
def schedules(draw):
    """Each rank's steps, and the order the ranks' parts reach the driver in."""
    ranks = draw(st.lists(STEPS, min_size=2, max_size=4))
    order = draw(st.permutations([rank for rank, steps in enumerate(ranks) for _ in steps]))
    return ranks, order


def _feed(assembler, ranks, order):
    pending = [list(steps) for steps in ranks]
    formed = []
    for rank in order:
        commit = assembler.add(rank, pending[rank].pop(0), 0, object())
        if commit is not None:
            formed.append(commit.step)
    return formed


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_a_commit_forms_for_every_step_all_ranks_hand_over_and_no_other(schedule):
    ranks, order = schedule
    formed = _feed(CommitAssembler(len(ranks), 0), ranks, order)
    assert formed == sorted(set.intersection(*map(set, ranks)))


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_no_part_waits_for_a_rank_already_past_its_step(schedule):
    ranks, order = schedule
    assembler, pending, seen = CommitAssembler(len(ranks), 0), [list(s) for s in ranks], {}
    for rank in order:
        seen[rank] = pending[rank].pop(0)
        assembler.add(rank, seen[rank], 0, object())
        for step, holders in assembler.parts_waiting().items():
            absent = set(range(len(ranks))) - holders
            assert all(seen.get(r, 0) < step for r in absent), (step, holders, seen)


@settings(max_examples=400, deadline=None)
@given(st.lists(STEPS, min_size=2, max_size=4))
def test_ranks_kept_waiting_for_a_slot_never_stall_the_commits(ranks):
    """The worst case for slabs: every rank's slots are both needed, so each rank with a
    part waiting is asked again only once that commit forms. Whatever steps each rank
    skips before a step they all commit (13 here), some rank can always hand over its next
    part until every rank handed over all of its own."""
    assembler, pending = CommitAssembler(len(ranks), 0), [list(s) + [13] for s in ranks]
    everyone = set(range(len(ranks)))
    while any(pending):
        later = waits_for_a_slot(everyone, assembler.waiting())
        asked = [rank for rank in everyone - later if pending[rank]]
        assert asked, f"all wait: {pending} to hand over, {assembler.parts_waiting()} waiting"
        for rank in asked:
            assembler.add(rank, pending[rank].pop(0), 0, object())
    assert assembler.committed_step == 13


def test_a_rank_that_skipped_a_step_frees_the_others_part_at_it():
    """Rank 1 skipped step 1 (it committed again after a torn view, say): rank 0's part at
    step 1 can never form, so it holds no slot and rank 0 is asked again."""
    assembler = CommitAssembler(2, 0)
    assembler.add(0, 1, 0, "r0s1")
    assert waits_for_a_slot({0, 1}, assembler.waiting()) == {0}
    assembler.add(1, 2, 0, "r1s2")
    assert assembler.waiting() == {1}
    assert waits_for_a_slot({0, 1}, assembler.waiting()) == {1}
    assert assembler.add(0, 2, 0, "r0s2").snapshots == ["r0s2", "r1s2"]
