"""What made a commit between calls from the one before it, to be done again after a
rollback to that one. No Ray here: the supervisor's calls do the work.

A group whose commit copies cross nodes keeps the commit before the newest as a fallback
until the newest's copy has landed (``raysgd.driver.replicas``). When the newest was taken
between calls (the end of a ``train()`` call, a call that changed the state, new datasets)
and a lost node takes it along, the ranks restore the fallback, which lies inside or before
the previous call. The next call must not start there as if it were its own beginning: it
would resume the previous call's pass under its own name and step count. So the supervisor
keeps, with each commit taken between calls, how it was made (a :class:`TrainCall`,
:class:`GroupCall` or :class:`DataRefresh`), and after such a rollback does that again
first; a ``train()`` call done again reports nothing (its metrics were returned when it
first ran). Commits taken inside a call need nothing: the call itself goes on from them.

:class:`CatchUp` is mixed into :class:`raysgd.driver.supervisor.Supervisor`: it uses its
``group``, ``capabilities``, ``commit``, ``_catch_up``, ``_train_call``, ``_moved``,
``_recover`` and ``_roll_back``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Tuple, Union

from raysgd.driver.progress import NULL_PROGRESS
from raysgd.errors import WorkerFailedError

logger = logging.getLogger("raysgd")


@dataclass(frozen=True)
class TrainCall:
    """One ``train()`` call: ``num_steps`` (None: to the end of the pass) and ``info``."""

    num_steps: Optional[int]
    info: Optional[dict]

    def remaining(self, done: int) -> Tuple[Optional[int], bool]:
        """``(num_steps, resume)`` for ``train_and_commit`` when the commit holds ``done``
        steps of this call (its ``call_done``)."""
        return (None if self.num_steps is None else self.num_steps - done), done > 0

    def describe(self) -> str:
        return "the train() call" + ("" if self.num_steps is None else
                                     f" of {self.num_steps} step(s)")


@dataclass(frozen=True)
class GroupCall:
    """A call that changed every rank's state (``apply_all_workers``, ``load_state_dict``)."""

    method: str
    args: Tuple[Any, ...]

    def describe(self) -> str:
        return f"the state-changing call {self.method}()"


@dataclass(frozen=True)
class DataRefresh:
    """New datasets handed to ``train(dataset=...)``: new shards on every rank."""

    def describe(self) -> str:
        return "the change of datasets"


Made = Union[TrainCall, GroupCall, DataRefresh]


class CatchUp:
    """Mixed into the supervisor (see the module's docstring)."""

    def _catch_up_first(self) -> bool:
        """After a rollback past the newest commit taken between calls, make that commit's
        state again (``raysgd.driver.catch_up``) before anything else runs. False when a
        worker failure cut it short (recovered: ask again)."""
        made, self._catch_up = self._catch_up, None
        if made is None:
            return True
        logger.warning("raysgd: re-running %s from step %d: the commit it made was lost with "
                       "a node", made.describe(), self.commit.step)
        if isinstance(made, TrainCall):
            try:  # recovers from failures and rolls back after user errors itself
                self._train_call(made, False, NULL_PROGRESS)  # and commits its end
            except BaseException:
                self._catch_up = self._catch_up or made
                raise
            return True
        try:
            if isinstance(made, GroupCall):
                self.group.execute(made.method, *made.args)
            else:
                self.group.attach_data(self.capabilities)
            self._moved(self.group.snapshot(), in_epoch=False, made=made)
        except WorkerFailedError as failure:
            self._catch_up = made  # still owed once the ranks are back at the commit
            self._recover(failure)
            return False
        except BaseException as error:
            self._catch_up = made
            self._roll_back(error, mutated=True)
            raise
        return True
