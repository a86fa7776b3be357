"""What a report is built of: cells, plain JSON-able dicts (see ``loadgen.reports.report``), and how
the flash question's cells (``loadgen.sim.flash``) are grouped for comparison."""

from __future__ import annotations

from typing import Any

Cell = dict[str, Any]
# The policy every other is measured against, LRU admitting everything: the reports' baseline.
BASELINE = "always"


def flash_group(cell: Cell) -> tuple[str, int, int]:
    """The (workload, memory, disk) a flash cell is compared within."""
    return cell["workload"], cell["memory_bytes"], cell["disk_bytes"]
