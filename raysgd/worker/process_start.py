"""How a process a trainer starts runs (its niceness, its allocator), decided once on the
driver and handed to each worker process it starts: ranks, spares and newcomers alike.
No torch and no Ray here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raysgd.worker import huge_pages, priority


@dataclass(frozen=True)
class ProcessStart:
    niceness: Optional[int] = None  # raysgd.worker.priority; None keeps Ray's
    huge_pages: bool = False  # raysgd.worker.huge_pages

    @classmethod
    def decide(cls) -> "ProcessStart":
        """On the driver, from its niceness and environment (a bad setting raises
        ``ConfigError`` here, before any worker starts)."""
        return cls(priority.rank_niceness(), huge_pages.wanted())

    def apply(self) -> bool:
        """In a new worker process, before torch is imported: both settings. Returns whether
        its large tensors will use huge pages."""
        uses_huge_pages = huge_pages.enable(self.huge_pages)
        priority.set_niceness(self.niceness)
        return uses_huge_pages
