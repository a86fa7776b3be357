"""Simulated sweeps run on an existing Dask distributed cluster, with the results a local run
gives.

* One task per (admission, eviction) policy, holding every cache size of the sweep: a worker
  reads the trace once per task, by its path (the workers must see the same file: a shared
  file system, or the same machine), or generates it from its ``WorkloadSpec`` (the same
  spec, the same trace, byte for byte), and runs the same ``sweep`` a local run does.
* The results come back as ``SimResult``s in the local order (size-major, policy-minor), so
  tables, reports and JSON are those of a local run; only ``elapsed`` differs.
* Progress is reported as each result arrives, as locally; Ctrl-C cancels the tasks not done
  and leaves the cluster running.

``distributed`` is imported only here, when a cluster is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from loadgen.sim.simulate import SimResult, sweep
from loadgen.traces.trace import Columns, read_trace
from loadgen.traces.workload import WorkloadSpec, generate
from proxy.core.admission import AdmissionConfig


def policy_cells(
    source: str | WorkloadSpec,
    columns: Columns | None,
    sizes: Sequence[int],
    admission: AdmissionConfig,
    eviction: str,
    max_object_bytes: int | None,
    entry_overhead: int,
) -> list[SimResult]:
    """One task: every size of one policy over the trace ``source`` names, on the worker."""
    trace = generate(source) if isinstance(source, WorkloadSpec) else read_trace(source, columns)
    return sweep(trace, list(sizes), [(admission, eviction)], max_object_bytes=max_object_bytes,
                 entry_overhead=entry_overhead, workers=1)  # fmt: skip


def cluster_sweep(
    address: str,
    source: Path | WorkloadSpec,
    columns: Columns | None,
    sizes: Sequence[int],
    policies: Sequence[tuple[AdmissionConfig, str]],
    *,
    max_object_bytes: int | None = None,
    entry_overhead: int,
    report: Callable[[int, int, SimResult], None] | None = None,
    connect_timeout: float = 10.0,
) -> list[SimResult]:
    """``sweep`` of the trace ``source`` (a file, or a workload to generate) over ``sizes`` x
    ``policies``, one task per policy on the Dask scheduler at ``address``. ConnectionError
    when it cannot be reached."""
    from distributed import Client, as_completed

    try:
        client = Client(address, timeout=connect_timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(f"no Dask scheduler answers at {address}: {exc}") from None
    named = source if isinstance(source, WorkloadSpec) else str(source.resolve())
    total = len(sizes) * len(policies)
    done: dict[tuple[int, int], SimResult] = {}
    try:
        futures = {
            client.submit(policy_cells, named, columns, list(sizes),
                          admission, eviction, max_object_bytes, entry_overhead,
                          pure=False, key=f"onehit-sim-{i}-{admission.label()}-{eviction}"): i
            for i, (admission, eviction) in enumerate(policies)
        }  # fmt: skip
        try:
            with client.as_current():  # what as_completed and result() find the client by
                for future in as_completed(futures):
                    for result in future.result():
                        done[(result.cache_bytes, futures[future])] = result
                        if report is not None:
                            report(len(done), total, result)
        except BaseException:
            client.cancel(list(futures))
            raise
    finally:
        client.close()
    return [done[(size, i)] for size in sizes for i in range(len(policies))]
