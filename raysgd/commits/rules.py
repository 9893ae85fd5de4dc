"""The commit protocol's rules as data: where today's code and the one commit path differ.

Each field is one decision the protocol makes (``raysgd.commits.protocol``) or that a rank
follows (the simulation in ``tests/commit_sim.py`` plays the ranks). :data:`GROWN` is the
commit path as it grew, one mechanism at a time; :data:`TODAY` is the code as it runs now;
:data:`TARGET` is the one commit path being built (issue 70's design). Each field of
:data:`GROWN` that differs from :data:`TARGET` names a fault schedule that breaks an
invariant; the simulation test holds every set to the same invariants, so a change of rule
is a change of one value, tested under thousands of schedules before the code follows it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from raysgd.errors import ConfigError

_CHOICES = {
    # What a commit's copy reads. "view": the live tensors, copied after the driver took the
    # commit, while the next batch runs (worker/live_state.py); an optimizer step must wait
    # until the driver acknowledges it. "buffer": the rank's own buffer, filled beside the
    # next forward and backward; the optimizer step waits for that local copy only.
    "snapshot": ("view", "buffer"),
    # A rank whose commit the driver has not acknowledged within its wait. "train_on": logs
    # and trains on (worker/handoff.py: settle, wait_landed). "wait": waits on; lost work then
    # stays within one interval whatever the driver does.
    "unacknowledged": ("train_on", "wait"),
    # When a rank finds that its parameters were written outside an optimizer step while a
    # commit of them was being copied. "next_settle": at its next settle, after the driver may
    # already hold the commit, and commits again on that rank alone (rank_commits._again).
    # "before_sent": before the part leaves the rank, which then sends it void, and the
    # protocol drops that step on every rank.
    "write_check": ("next_settle", "before_sent"),
    # How the driver knows which buffer a rank holds. "process": from its own memory of what
    # it named, keyed on the actor's process and forgotten only for a new group, although a
    # replace gives every rank a new runner with none, and a part written to a buffer and
    # then dropped never reports it used. "runner": the same memory keyed on the rank's
    # runner (driver/slabs.py with WorkerGroup.process_keys), so a replace's new runners are
    # named buffers again; the dropped part still goes unreported. "reported": each answer
    # of the rank says which buffers its runner still holds or has parts in.
    "buffer_owner": ("process", "runner", "reported"),
    # When a new commit becomes the one a recovery falls back to. "assembled": once every
    # rank's part is held, with the one before kept as a fallback until its copies land, and
    # what made it re-run before the next call that changes state (the driver's catch-up,
    # removed). "copied": only once every part also has its copy in another failure domain
    # (a newer whole one is still restored while its nodes live); a call returns only then.
    "current_when": ("assembled", "copied"),
}


@dataclass(frozen=True)
class Rules:
    snapshot: str = "buffer"
    unacknowledged: str = "wait"
    write_check: str = "before_sent"
    buffer_owner: str = "reported"
    current_when: str = "copied"

    def __post_init__(self) -> None:
        for field in fields(self):
            value, choices = getattr(self, field.name), _CHOICES[field.name]
            if value not in choices:
                raise ConfigError(f"Rules.{field.name}={value!r}: choose one of {choices}.")


GROWN = Rules(snapshot="view", unacknowledged="train_on", write_check="next_settle",
              buffer_owner="process", current_when="assembled")
# The supervisor runs on CommitProtocol with "copied", its slabs keyed on runners; the ranks'
# side still has the rest.
TODAY = Rules(snapshot="view", unacknowledged="train_on", write_check="next_settle",
              buffer_owner="runner", current_when="copied")
TARGET = Rules()
