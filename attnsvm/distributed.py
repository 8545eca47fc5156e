"""Experiment families as Dask tasks: ``attnsvm reproduce --scheduler dask | tcp://host:port``.

``scheduler="dask"`` starts an in-process :class:`distributed.LocalCluster` of ``jobs`` worker
*processes* with one thread each; ``scheduler="tcp://host:port"`` connects a
:class:`distributed.Client` to a running scheduler (``dask scheduler`` on one machine,
``dask worker tcp://host:port --nthreads 1`` on each of the others, every machine with the same
attnsvm installed). Each family is one task, submitted with the arguments the serial run gives
:func:`attnsvm.experiments.run_family` (``jobs = 1``); the families are seeded on their own and
each worker computes with one torch thread, as the serial run does, so the results are bitwise
those of the serial run (tested in ``tests/test_distributed.py``).

Progress: each task sends its family's ``progress(done, total)`` through a Dask queue (at most
every :data:`PROGRESS_INTERVAL_S` seconds), and a family's bar completes when its task does.
Needs the ``distributed`` extra: ``pip install 'attnsvm[distributed]'``.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import AttnSVMError

__all__ = ["DistributedError", "SCHEDULERS", "check_scheduler", "run_families_dask"]

#: The ``--scheduler`` values besides a ``tcp://host:port`` address.
SCHEDULERS = ("local", "dask")
#: Seconds to wait for an existing scheduler (``tcp://``) to answer before giving up.
CONNECT_TIMEOUT_S = 30
INSTALL_HINT = "pip install 'attnsvm[distributed]'"
#: Seconds between two progress messages of one family's task (the bars need no more).
PROGRESS_INTERVAL_S = 0.5


class DistributedError(AttnSVMError):
    """The Dask scheduler cannot be used: dask is not installed, or the scheduler cannot be reached."""


def check_scheduler(scheduler: str) -> str:
    """Validate a ``--scheduler`` value: ``local``, ``dask`` or ``tcp://host:port``; returns it.

    Raises:
      DistributedError: any other value, or ``dask``/``tcp://`` without dask.distributed installed.
    """
    if scheduler == "local":
        return scheduler
    host, _, port = scheduler.removeprefix("tcp://").rpartition(":")
    if scheduler == "dask" or (scheduler.startswith("tcp://") and host and port.isdigit()):
        _import_distributed()  # before any work: a missing extra is named now, not after the first family
        return scheduler
    raise DistributedError(
        f"--scheduler must be local, dask or tcp://host:port (an existing Dask scheduler); got {scheduler!r}"
    )


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise DistributedError(
            f"--scheduler dask needs dask.distributed, which is not installed ({exc}): {INSTALL_HINT}"
        ) from None
    return distributed


def _family_task(module: str, name: str, size: str, seed: int, device: str, queue: str | None = None) -> Any:
    """One family on a Dask worker: what the serial run computes, with one torch thread; its progress
    goes to the Dask queue named ``queue`` (at most every :data:`PROGRESS_INTERVAL_S` seconds)."""
    import torch

    from . import experiments as E

    # One torch thread, as the serial run and the --jobs pool: the same arithmetic, bitwise.
    torch.set_num_threads(1)
    importlib.import_module(module)  # registers the family (a built-in or an ATTNSVM_EXTRA_FAMILIES one)
    progress = None
    if queue is not None:
        q = _import_distributed().Queue(queue)
        last = [-math.inf]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S:  # throttled: one message per interval at most
                last[0] = now
                q.put((name, done, total))

    return E.run_family(E.FAMILY_REGISTRY[name], size, seed, 1, device, progress)


def run_families_dask(
    specs: Sequence[Any],
    size: str,
    seed: int,
    device: str,
    *,
    scheduler: str,
    jobs: int,
    progress: Mapping[str, Callable[[int, int], None]],
    on_result: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Run the families ``specs`` as Dask tasks; returns ``{name: FamilyResult}``.

    Args:
      specs: the :class:`~attnsvm.experiments.FamilySpec` to run.
      size, seed, device: as :func:`attnsvm.experiments.run_family`.
      scheduler: ``"dask"`` (a LocalCluster of ``jobs`` processes) or ``"tcp://host:port"``.
      jobs: worker processes of the LocalCluster (ignored for an existing scheduler).
      progress: each family's ``progress(done, total)``, fed from the tasks; ``(1, 1)`` when it finishes.
      on_result: called in this process with each result as it arrives (e.g. to checkpoint it).

    Raises:
      DistributedError: dask missing, the scheduler unreachable, or a task lost (a worker died).
    """
    distributed = _import_distributed()
    cluster = None
    try:
        if scheduler == "dask":
            cluster = distributed.LocalCluster(
                n_workers=jobs,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = distributed.Client(cluster)
        else:
            try:
                client = distributed.Client(scheduler, timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:  # includes TimeoutError: nothing answers at the address
                raise DistributedError(
                    f"--scheduler {scheduler}: no Dask scheduler answers there within {CONNECT_TIMEOUT_S} s "
                    f"({exc}); start one (`dask scheduler`) or use --scheduler dask"
                ) from None
        try:
            run_id = uuid.uuid4().hex[:12]  # keys unique per run: a shared scheduler may hold others' tasks
            queue = distributed.Queue(f"attnsvm-progress-{run_id}", client=client)
            results: dict[str, Any] = {}

            def drain() -> None:
                for name, done, total in queue.get(batch=True):
                    if name not in results:  # a late message must not undo a finished bar
                        progress[name](done, total)

            futures = {
                client.submit(
                    _family_task,
                    s.run.__module__,
                    s.name,
                    size,
                    seed,
                    device,
                    queue.name,
                    pure=False,
                    key=f"attnsvm-{s.name}-{run_id}",
                ): s.name
                for s in specs
            }
            pending = set(futures)
            while pending:
                try:
                    distributed.wait(
                        list(pending), timeout=PROGRESS_INTERVAL_S, return_when="FIRST_COMPLETED"
                    )
                except TimeoutError:
                    pass
                drain()
                for fut in [f for f in pending if f.done()]:
                    pending.discard(fut)
                    name = futures[fut]
                    try:
                        res = fut.result()
                    except (
                        Exception
                    ) as exc:  # a task lost with its worker; run_family catches the family's own
                        raise DistributedError(
                            f"family {name!r} was lost on the Dask cluster ({type(exc).__name__}: {exc}); "
                            "finished families are saved: rerun with --resume"
                        ) from None
                    results[name] = res
                    if on_result is not None:
                        on_result(res)
                    progress[name](1, 1)
            return results
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
