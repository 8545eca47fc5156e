"""Hypothesis profiles, sharding and per-test timeouts for the property suites.

Profiles (choose with ``ATTNSVM_HYPOTHESIS_PROFILE``; see ``properties/README.md``):

* ``dev``   — fast local runs: few examples, random seeds, example database on;
* ``ci``    — what ``tox -e properties`` runs: derandomized (every test's examples are a
  function of the test's code only, so the outcome is the same serially and under
  ``-n 2``), no deadline, reproduction blobs printed, no database;
* ``sweep`` — what ``tox -e sweep`` runs: thousands of examples per test, random seeds
  (or a given sweep seed, see sharding), example database on: this machine's
  ``.hypothesis/examples``, or one every machine of the sweep reaches, named by
  ``ATTNSVM_EXAMPLE_DB`` (``redis://host:port/db`` or ``dir:/shared/path``; see
  :func:`example_database`).

Relation to Hypothesis's built-in ``ci`` profile. Hypothesis registers a profile named
``ci`` and loads it at import when it sees ``CI`` (or a vendor CI variable) in the
environment. We register *our* ``ci`` under the same name with the built-in one as parent,
so it replaces it: whatever loads ``ci`` (Hypothesis itself under ``CI=true``, or this
file) gets ours. Then this file loads the profile named by
``ATTNSVM_HYPOTHESIS_PROFILE``; when that variable is unset it loads ``ci`` on a CI machine
and ``dev`` elsewhere. So ``CI=true`` alone gives our ``ci``; ``CI=true`` with
``ATTNSVM_HYPOTHESIS_PROFILE=sweep`` gives the sweep (the variable wins).

Sharding (``ATTNSVM_SHARD=k/N``, ``0 ≤ k < N``). A sweep is the set of *items*
``(test, round)`` for every collected property test and ``round < ATTNSVM_SWEEP_ROUNDS``
(default 1); item ``j`` of the list sorted by ``(nodeid, round)`` runs Hypothesis with
seed ``H(ATTNSVM_SWEEP_SEED, nodeid, round)``. Shard ``k`` keeps the items with
``j mod N = k``. The shards are a partition of the items and an item's seed does not depend
on the shard, so the union of the N shard runs is exactly the unsharded sweep with the same
sweep seed. ``ATTNSVM_SWEEP_SEED`` is required with ``ATTNSVM_SHARD`` (all machines must
agree on it); without either, the sweep draws fresh random seeds.

Threads: the root ``conftest.py`` sets one BLAS/OpenMP thread and ``torch.set_num_threads(1)``
per process; xdist starts one process per worker, so each worker uses one thread. The
check below fails loudly if that ever stops being true.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase


def _register_helper(name: str) -> None:
    """Make ``properties/<name>.py`` importable as ``<name>`` by the property files.

    Under ``--import-mode=importlib`` (pyproject.toml) pytest puts no test folder on ``sys.path``, so
    a test file cannot import a sibling module. This conftest is imported before any test file of this
    folder (and in each xdist worker), so it loads the helper once under its own name; only that name
    is added, nothing else of this folder becomes importable.
    """
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


# The bounded-discard helper (properties/_discards.py) shared by the property files.
_register_helper("_discards")

PROFILE_ENV = "ATTNSVM_HYPOTHESIS_PROFILE"
SHARD_ENV = "ATTNSVM_SHARD"
SWEEP_SEED_ENV = "ATTNSVM_SWEEP_SEED"
SWEEP_ROUNDS_ENV = "ATTNSVM_SWEEP_ROUNDS"
TIMEOUT_ENV = "ATTNSVM_PROPERTY_TIMEOUT"

#: Examples per property test in each profile (costly tests use a fraction, see the tests).
MAX_EXAMPLES = {"dev": 20, "ci": 100, "sweep": 2000, "mutation": 25}
#: Per-test timeout in seconds (pytest-timeout): a guard against hangs, not a speed assertion.
#: Generous: the slowest ci property takes well under a minute on one core.
TIMEOUTS = {"dev": 300, "ci": 300, "sweep": 7200, "mutation": 300}

settings.register_profile(
    "dev",
    max_examples=MAX_EXAMPLES["dev"],
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    settings.get_profile("ci"),  # Hypothesis's built-in ci: derandomize, no deadline/database, print_blob
    max_examples=MAX_EXAMPLES["ci"],
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# Mutation testing (tools/mutation.py): the ci profile with a quarter of its examples, so a
# mutant's run is short; derandomized, so a mutant's outcome does not depend on the run; no
# shrinking (a kill needs one failing example, not the smallest: shrinking made failing runs outlast
# mutmut's timeout, 55 s against an expected 0.6 s) and no example database (no example carried from
# one mutant to the next, so outcomes do not depend on the order mutants run in).
settings.register_profile(
    "mutation",
    settings.get_profile("ci"),
    max_examples=MAX_EXAMPLES["mutation"],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    database=None,
)
EXAMPLE_DB_ENV = "ATTNSVM_EXAMPLE_DB"
#: The sweep's example database when ``ATTNSVM_EXAMPLE_DB`` is unset: this machine's folder.
LOCAL_EXAMPLE_DB = ".hypothesis/examples"


def example_database(spec: str | None) -> ExampleDatabase:
    """The sweep profile's example database, from ``ATTNSVM_EXAMPLE_DB`` (``spec``).

    * unset or empty: ``DirectoryBasedExampleDatabase(".hypothesis/examples")`` (this machine only);
    * ``redis://host:port/db`` (or ``rediss://``, ``unix://``: any URL redis-py reads): a
      ``RedisExampleDatabase`` every machine of a sweep can reach, so a counterexample found on one
      is replayed first on all (needs ``pip install 'attnsvm[distributed]'``); the server is asked
      once here, so an unreachable one stops the run before any test;
    * ``dir:/shared/path``: a ``DirectoryBasedExampleDatabase`` on a filesystem the machines share.
    """
    spec = (spec or "").strip()
    if not spec:
        return DirectoryBasedExampleDatabase(LOCAL_EXAMPLE_DB)
    if spec.startswith("dir:"):
        path = spec[len("dir:") :]
        if not path:
            raise pytest.UsageError(f"{EXAMPLE_DB_ENV}=dir:PATH needs a folder; got {spec!r}")
        return DirectoryBasedExampleDatabase(path)
    if spec.split("://", 1)[0] in ("redis", "rediss", "unix"):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as exc:
            raise pytest.UsageError(
                f"{EXAMPLE_DB_ENV}={spec}: the redis client is not installed ({exc}): "
                "pip install 'attnsvm[distributed]'"
            ) from None
        client = redis.Redis.from_url(spec)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise pytest.UsageError(
                f"{EXAMPLE_DB_ENV}={spec}: the redis server does not answer ({exc})"
            ) from None
        return RedisExampleDatabase(client)
    raise pytest.UsageError(
        f"{EXAMPLE_DB_ENV}={spec!r}: use redis://host:port/db (a redis server every machine reaches) or "
        "dir:/shared/path (a folder on a shared filesystem)"
    )


settings.register_profile(
    "sweep",
    max_examples=MAX_EXAMPLES["sweep"],
    derandomize=False,
    deadline=None,
    # This machine's folder; replaced below by the one ATTNSVM_EXAMPLE_DB names when the sweep runs.
    database=DirectoryBasedExampleDatabase(LOCAL_EXAMPLE_DB),
    print_blob=True,
    verbosity=Verbosity.normal,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _profile_name() -> str:
    name = os.environ.get(PROFILE_ENV, "").strip()
    if not name:
        return "ci" if settings.get_current_profile_name() == "ci" else "dev"
    if name not in MAX_EXAMPLES:
        raise pytest.UsageError(f"{PROFILE_ENV}={name!r} is not a profile; use one of {sorted(MAX_EXAMPLES)}")
    return name


PROFILE = _profile_name()
if PROFILE == "sweep":
    # Built only for a sweep (a redis URL is pinged): shared across machines when the variable is set.
    settings.register_profile(
        "sweep", settings.get_profile("sweep"), database=example_database(os.environ.get(EXAMPLE_DB_ENV))
    )
settings.load_profile(PROFILE)


def _parse_shard() -> tuple[int, int] | None:
    raw = os.environ.get(SHARD_ENV, "").strip()
    if not raw:
        return None
    try:
        k_s, n_s = raw.split("/")
        k, n = int(k_s), int(n_s)
    except ValueError:
        raise pytest.UsageError(f"{SHARD_ENV} must look like k/N (e.g. 0/4); got {raw!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise pytest.UsageError(f"{SHARD_ENV}={raw!r}: need N ≥ 1 and 0 ≤ k < N")
    if not os.environ.get(SWEEP_SEED_ENV, "").strip():
        raise pytest.UsageError(
            f"{SHARD_ENV} needs {SWEEP_SEED_ENV} (the same integer on every shard) so that the shards "
            "partition one sweep"
        )
    return k, n


SHARD = _parse_shard()
SWEEP_ROUNDS = int(os.environ.get(SWEEP_ROUNDS_ENV, "1"))
if SWEEP_ROUNDS < 1:
    raise pytest.UsageError(f"{SWEEP_ROUNDS_ENV} must be ≥ 1; got {SWEEP_ROUNDS}")
_seed_raw = os.environ.get(SWEEP_SEED_ENV, "").strip()
SWEEP_SEED = int(_seed_raw) if _seed_raw else None


def item_seed(sweep_seed: int, nodeid: str, rnd: int) -> int:
    """Seed of one sweep item: a 64-bit hash of (sweep seed, test id, round)."""
    h = hashlib.sha256(f"{sweep_seed}|{nodeid}|{rnd}".encode()).digest()
    return int.from_bytes(h[:8], "big")


def pytest_report_header(config: pytest.Config) -> list[str]:
    shard = f"{SHARD[0]}/{SHARD[1]}" if SHARD else "none"
    return [
        f"attnsvm properties: hypothesis profile {PROFILE!r} (max_examples={settings.default.max_examples}), "
        f"sweep seed {SWEEP_SEED}, rounds {SWEEP_ROUNDS}, shard {shard}, torch threads {torch.get_num_threads()}",
        f"attnsvm properties: example database {settings.default.database!r}"
        + (
            f" ({EXAMPLE_DB_ENV} is used by the sweep profile only)"
            if os.environ.get(EXAMPLE_DB_ENV, "").strip() and PROFILE != "sweep"
            else ""
        ),
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Sweep rounds: each property test is repeated ATTNSVM_SWEEP_ROUNDS times with different seeds.
    if "_sweep_round" in metafunc.fixturenames and SWEEP_ROUNDS > 1:
        metafunc.parametrize("_sweep_round", range(SWEEP_ROUNDS), ids=lambda r: f"round{r}", indirect=True)


def _here(item: pytest.Item) -> bool:
    return os.path.dirname(str(item.path)) == os.path.dirname(__file__)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timeout = int(os.environ.get(TIMEOUT_ENV, TIMEOUTS[PROFILE]))
    mine = [it for it in items if _here(it)]
    for it in mine:
        if it.get_closest_marker("timeout") is None:
            it.add_marker(pytest.mark.timeout(timeout))
    if SHARD is None:
        return
    k, n = SHARD
    order = {it.nodeid: j for j, it in enumerate(sorted(mine, key=lambda it: it.nodeid))}
    keep = [it for it in items if not _here(it) or order[it.nodeid] % n == k]
    dropped = [it for it in items if it not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


@pytest.fixture(autouse=True)
def _sweep_round(request: pytest.FixtureRequest) -> object:
    """Give a Hypothesis test its sweep-item seed when a sweep seed is set (no-op otherwise)."""
    fn = request.function
    if SWEEP_SEED is None or not hasattr(fn, "hypothesis"):
        yield None
        return
    rnd = getattr(request, "param", 0)
    nodeid = request.node.nodeid
    # The attribute hypothesis.seed() sets; set directly so the sweep keeps its example database.
    old = getattr(fn, "_hypothesis_internal_use_seed", None)
    fn._hypothesis_internal_use_seed = item_seed(SWEEP_SEED, nodeid, rnd)
    try:
        yield rnd
    finally:
        fn._hypothesis_internal_use_seed = old


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> None:
    """Each process (xdist worker) computes with one thread."""
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        assert os.environ.get(var) == "1", f"{var} must be 1 for property runs (set by the root conftest.py)"
