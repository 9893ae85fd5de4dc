"""The disk writer's queue (``raysgd.state.write_queue``): pure bookkeeping, no thread."""
from raysgd.state.commit import Commit
from raysgd.state.write_queue import RETRY_FIRST_S, WriteQueue


def commit(step):
    return Commit(step, 0, 1, [None])


def test_a_newer_commit_replaces_a_pending_one_and_best_goes_first_on_a_tie():
    queue = WriteQueue()
    queue.submit("latest", commit(1), None, not_before=5.0)
    queue.submit("latest", commit(2), None, not_before=5.0)
    queue.submit("best", commit(2), 0.1, not_before=5.0)
    assert queue.next(now=4.0, flushing=False, closing=False) == ("best", 1.0)
    assert queue.next(now=4.0, flushing=True, closing=False) == ("best", 0.0)  # no settle
    assert queue.pop("best").commit.step == 2 and queue.pop("latest").commit.step == 2
    assert queue.next(4.0, False, False) == (None, 0.0) and queue.never_written == []


def test_a_failed_write_is_retried_with_backoff_and_a_flush_does_not_cut_it_short():
    queue = WriteQueue()
    queue.submit("latest", commit(1), None, 0.0)
    job = queue.pop("latest")
    assert queue.failed("latest", job, now=10.0, closing=False) == RETRY_FIRST_S
    assert queue.next(now=10.0, flushing=True, closing=False) == ("latest", RETRY_FIRST_S)
    job = queue.pop("latest")
    assert queue.failed("latest", job, now=11.0, closing=False) == 2 * RETRY_FIRST_S
    assert queue.failed_tries == 2
    assert queue.wrote("latest", queue.pop("latest")) is True  # the outage ended
    assert queue.failed_tries == 0 and queue.landed["latest"].step == 1


def test_a_retry_replaced_by_a_newer_commit_never_reaches_the_storage():
    queue = WriteQueue()
    queue.submit("latest", commit(1), None, 0.0)
    queue.failed("latest", queue.pop("latest"), now=0.0, closing=False)
    queue.submit("latest", commit(2), None, 0.0)  # while 1 waits for its retry
    assert queue.unwritten() == [1]
    job = queue.pop("latest")
    queue.submit("latest", commit(3), None, 0.0)  # while 2 is being written (and fails)
    assert queue.failed("latest", job, now=0.0, closing=False) is None
    assert queue.unwritten() == [1, 2]


def test_the_same_commit_submitted_again_is_not_counted_lost():
    queue = WriteQueue()
    first = commit(5)
    queue.submit("latest", first, None, 0.0)
    queue.failed("latest", queue.pop("latest"), now=0.0, closing=False)
    queue.submit("latest", first, None, 0.0)  # save_now of the commit being retried
    assert queue.unwritten() == []


def test_closing_tries_a_failing_write_once_more_then_gives_it_up():
    queue = WriteQueue()
    queue.submit("latest", commit(7), None, 0.0)
    assert queue.failed("latest", queue.pop("latest"), now=0.0, closing=True) is not None
    assert queue.next(now=0.0, flushing=False, closing=True) == ("latest", 0.0)  # at once
    assert queue.failed("latest", queue.pop("latest"), now=0.0, closing=True) is None
    queue.submit("best", commit(8), 0.1, 0.0)
    queue.abandon()
    assert queue.unwritten() == [7, 8] and queue.pending == {}
