"""Commit hand-off between a training thread and the driver's long poll; no Ray."""
import threading
import time

from raysgd.state.commit import CommitAssembler
from raysgd.worker.handoff import KEEP_COMMITS, CommitHandoff


def test_without_wait_commits_queue_and_the_oldest_newer_one_is_taken():
    handoff = CommitHandoff(wait_s=0)
    for step in (3, 6, 9, 12, 15, 18):
        assert handoff.offer(step, {"step": step}) is False
    assert handoff.steps() == [6, 9, 12, 15, 18][-KEEP_COMMITS:]
    assert handoff.take(after=10) == {"step": 12}
    assert handoff.steps() == [15, 18]  # older ones dropped with it
    assert handoff.take(after=18) is None


def test_a_waiting_offer_returns_once_a_poll_took_it():
    handoff = CommitHandoff(wait_s=5)
    taken = []
    poller = threading.Thread(target=lambda: taken.append(handoff.take(after=0, wait_s=5)))
    poller.start()
    started = time.monotonic()
    assert handoff.offer(4, "c4") is True
    assert time.monotonic() - started < 2
    poller.join(5)
    assert taken == ["c4"] and handoff.steps() == []


def test_an_untaken_offer_gives_up_after_wait_s_and_stays_queued():
    handoff = CommitHandoff(wait_s=0.05)
    assert handoff.offer(4, "c4") is False
    assert handoff.steps() == [4]


def test_a_poll_from_a_newer_call_releases_an_older_one_empty_handed():
    handoff = CommitHandoff(wait_s=0)
    old = []
    waiting = threading.Thread(target=lambda: old.append(handoff.take(0, wait_s=5, ticket=1)))
    waiting.start()
    time.sleep(0.05)
    assert handoff.take(0, wait_s=0, ticket=2) is None  # nothing yet, but it bumps the ticket
    waiting.join(2)
    assert old == [None] and not waiting.is_alive()
    handoff.offer(3, "c3")
    assert handoff.take(0, ticket=1) is None  # a stale request never takes a commit
    assert handoff.take(0, ticket=2) == "c3"


def test_clear_empties_the_queue():
    handoff = CommitHandoff()
    handoff.offer(2, "c2")
    handoff.clear()
    assert handoff.take(after=0) is None


def test_assembler_commits_a_step_only_when_every_rank_handed_it_over():
    assembler = CommitAssembler(world_size=2, committed_step=0)
    assert assembler.add(0, 4, 4, "r0s4") is None
    assert assembler.add(0, 8, 8, "r0s8") is None
    assert assembler.after(0) == 8 and assembler.after(1) == 0
    commit = assembler.add(1, 4, 4, "r1s4")
    assert (commit.step, commit.call_done, commit.snapshots) == (4, 4, ["r0s4", "r1s4"])
    assert assembler.after(1) == 4
    assert assembler.add(1, 2, 2, "old") is None  # older than the commit: ignored
    commit = assembler.add(1, 8, 8, "r1s8")
    assert commit.step == 8 and commit.snapshots == ["r0s8", "r1s8"]
    assert assembler.committed_step == 8


def test_assembler_keeps_the_slabs_of_parts_waiting_and_names_them_in_the_commit():
    assembler = CommitAssembler(world_size=2, committed_step=0)
    in_slab = {"in_slab": True, "slab_version": 7}
    assert assembler.add(0, 4, 4, "r0s4", 0, in_slab) is None
    # named but not written (a write that failed): not in a slab
    assert assembler.add(0, 8, 8, "r0s8", 0, {"in_slab": False, "slab_version": 9}) is None
    assert assembler.in_slabs() == [7]  # a part waiting for rank 1's keeps its slab
    commit = assembler.add(1, 4, 4, "r1s4", 0, None)
    assert (commit.slab_versions, commit.slab_ranks) == ((7,), (0,))
    assert assembler.in_slabs() == []  # the commit holds it now, not the assembler
    commit = assembler.add(1, 8, 8, "r1s8")
    assert (commit.slab_versions, commit.slab_ranks) == ((), ())


def test_settle_gives_a_queued_live_commit_its_own_copy():
    handoff = CommitHandoff(wait_s=0)
    live = [1]
    handoff.offer(3, live, materialize=lambda commit: list(commit))
    handoff.settle()
    live[0] = 2  # the live state moves on
    assert handoff.take(after=0) == [1]


def test_settle_waits_for_a_taken_live_commit_until_the_next_request_acknowledges_it():
    handoff = CommitHandoff(wait_s=0)  # an offer would wait this long for a take
    handoff.offer(3, "live3", materialize=lambda commit: "copy")
    handoff.wait_s = 5
    assert handoff.take(after=0) == "live3"
    settled = threading.Event()
    waiter = threading.Thread(target=lambda: (handoff.settle(), settled.set()))
    waiter.start()
    assert not settled.wait(0.2)  # Ray may still be storing it
    assert handoff.take(after=2, wait_s=0) is None  # a request before it acknowledges nothing
    assert not settled.wait(0.1)
    assert handoff.take(after=3, wait_s=0) is None  # the driver has it: the next request
    assert settled.wait(2)
    waiter.join(2)


def test_settle_gives_up_after_wait_s_when_no_request_comes():
    handoff = CommitHandoff(wait_s=0.1)
    handoff.offer(3, "live3", materialize=lambda commit: "copy")
    assert handoff.take(after=0) == "live3"
    started = time.monotonic()
    handoff.settle()
    assert 0.05 < time.monotonic() - started < 2


def test_copied_commits_need_no_settling_and_clear_forgets_a_taken_live_one():
    handoff = CommitHandoff(wait_s=0)
    handoff.offer(3, "c3")
    assert handoff.take(after=0) == "c3"
    handoff.offer(6, "live6", materialize=lambda commit: "copy")
    handoff.wait_s = 5  # settling would wait this long for an acknowledgement
    started = time.monotonic()
    handoff.settle()  # a copied commit taken is not waited for; the queued live one copied
    assert handoff.take(after=3) == "copy"
    handoff.wait_s = 0
    handoff.offer(9, "live9", materialize=lambda commit: "copy")
    assert handoff.take(after=6) == "live9"
    handoff.wait_s = 5
    handoff.clear()  # a restore replaces the state: nothing is being stored for the driver
    handoff.settle()
    assert time.monotonic() - started < 1


def test_the_second_batch_after_a_taken_commit_waits_until_the_driver_holds_it():
    # Taken is not held: Ray still sends the commit, and a rank killed meanwhile loses it.
    handoff = CommitHandoff(wait_s=0)
    handoff.offer(3, "c3")  # a copied commit
    handoff.wait_s = 5
    assert handoff.take(after=0, wait_s=0) == "c3"
    started = time.monotonic()
    assert handoff.landing
    assert not handoff.wait_landed(3)  # the commit's own boundary: the next batch may start
    assert time.monotonic() - started < 0.5
    landed = threading.Event()
    waiter = threading.Thread(target=lambda: (handoff.wait_landed(4), landed.set()))
    waiter.start()
    assert not landed.wait(0.2)  # the boundary after one more batch waits
    assert handoff.take(after=2, wait_s=0) is None  # a request before it acknowledges nothing
    assert not landed.wait(0.1)
    assert handoff.take(after=3, wait_s=0) is None  # the driver's next request: it holds c3
    assert landed.wait(2)
    waiter.join(2)
    assert not handoff.landing
    assert not handoff.wait_landed(9)  # nothing taken since: no wait
    assert time.monotonic() - started < 2


def test_waiting_for_a_landing_gives_up_after_wait_s_and_a_restore_forgets_it():
    handoff = CommitHandoff(wait_s=0.1)
    handoff.offer(3, "c3")
    assert handoff.take(after=0) == "c3"
    started = time.monotonic()
    assert handoff.wait_landed(4)
    assert 0.05 < time.monotonic() - started < 2
    handoff.wait_s = 0
    handoff.offer(6, "c6")
    assert handoff.take(after=3) == "c6"
    handoff.wait_s = 5
    handoff.clear()
    started = time.monotonic()
    assert not handoff.wait_landed(7)
    assert time.monotonic() - started < 1


def test_a_newer_calls_request_ends_the_wait_for_a_commit_an_older_calls_request_took():
    # The previous call's request took this call's first commit before this call's own
    # request came: the driver closed that call and never holds it, so nobody will
    # acknowledge it. Before, the rank waited wait_s (10 s) before its second batch.
    handoff = CommitHandoff(wait_s=0)
    handoff.offer(18, "c18")
    handoff.wait_s = 5
    assert handoff.take(after=15, wait_s=0, ticket=1) == "c18"  # the leftover request
    assert handoff.take(after=16, wait_s=0, ticket=2) is None  # this call's first one
    started = time.monotonic()
    assert not handoff.wait_landed(19)
    assert time.monotonic() - started < 0.5


def _answers_a_waiting_request_at_once(handoff, release, after: int, ticket: int) -> None:
    """A request of call ``ticket`` waits (30 s) on ``handoff``; ``release()`` must answer
    it empty-handed within a second."""
    answered = []
    waiter = threading.Thread(target=lambda: answered.append(
        handoff.take(after=after, wait_s=30, ticket=ticket)))
    waiter.start()
    time.sleep(0.1)
    started = time.monotonic()
    release()
    waiter.join(2)
    assert answered == [None] and time.monotonic() - started < 1


def test_closing_answers_a_waiting_request_at_once():
    # A trainer's last request waits COMMIT_POLL_S on its runner; closed with the runner,
    # it must not hold a commit thread of the warm process into the next trainer.
    handoff = CommitHandoff(wait_s=5)
    _answers_a_waiting_request_at_once(handoff, handoff.close, after=45, ticket=3)
    assert handoff.take(after=0, wait_s=0, ticket=1) is None


def test_a_calls_start_answers_the_previous_calls_request_before_any_commit_of_its_own():
    # The previous call's last request still waits when the next call starts. Before
    # begin(), it could take the new call's first commit (a live view): the driver never
    # acknowledges that, and the next optimizer step's settle() waited wait_s (10 s).
    handoff = CommitHandoff(wait_s=5)
    _answers_a_waiting_request_at_once(handoff, lambda: handoff.begin(2), after=40, ticket=1)
    handoff.offer(44, "c44", materialize=lambda commit: f"copy of {commit}")
    assert handoff.take(after=40, wait_s=0, ticket=1) is None  # late, and from the old call
    assert handoff.take(after=40, wait_s=0, ticket=2) == "c44"
    handoff.take(after=44, wait_s=0, ticket=2)  # the driver holds it: acknowledged
    started = time.monotonic()
    handoff.settle()
    assert time.monotonic() - started < 0.5
    handoff.begin(2)  # the same call again (a retry) changes nothing
    handoff.begin(1)  # nor does an older one
    handoff.offer(48, "c48")
    assert handoff.take(after=44, wait_s=0, ticket=2) == "c48"


def test_a_calls_start_ends_the_wait_for_a_commit_of_an_older_call():
    handoff = CommitHandoff(wait_s=0)
    handoff.offer(18, "c18")
    assert handoff.take(after=15, wait_s=0, ticket=1) == "c18"
    handoff.wait_s = 5
    handoff.begin(2)
    started = time.monotonic()
    assert not handoff.wait_landed(20)
    assert time.monotonic() - started < 0.5
