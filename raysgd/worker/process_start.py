"""How a process a trainer starts runs (its niceness, its allocator), decided once on the
driver and handed to each worker process it starts: ranks, spares and newcomers alike.
The arena setting must be in the process's environment when it starts, so it travels in the
actor's options (:meth:`ProcessStart.actor_options`); the others are applied by the process
itself before it imports torch (:meth:`ProcessStart.apply`). No torch and no Ray here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from raysgd.worker import huge_pages, malloc_arena, priority


@dataclass(frozen=True)
class ProcessStart:
    niceness: Optional[int] = None  # raysgd.worker.priority; None keeps Ray's
    huge_pages: bool = False  # raysgd.worker.huge_pages
    one_arena: bool = False  # raysgd.worker.malloc_arena

    @classmethod
    def decide(cls) -> "ProcessStart":
        """On the driver, from its niceness and environment (a bad setting raises
        ``ConfigError`` here, before any worker starts)."""
        return cls(priority.rank_niceness(), huge_pages.wanted(), malloc_arena.wanted())

    def allocator(self) -> tuple:
        """What a process keeps for life from its start: only processes started alike may
        serve one another's trainers from the warm pool."""
        return (self.huge_pages, self.one_arena)

    def actor_options(self) -> Dict[str, Any]:
        """Ray actor options that start a worker process this way (Ray merges the
        ``env_vars`` with the job's own)."""
        env = malloc_arena.env_vars(self.one_arena)
        return {"runtime_env": {"env_vars": env}} if env else {}

    def apply(self) -> bool:
        """In a new worker process, before torch is imported: both settings. Returns whether
        its large tensors will use huge pages."""
        uses_huge_pages = huge_pages.enable(self.huge_pages)
        priority.set_niceness(self.niceness)
        return uses_huge_pages
