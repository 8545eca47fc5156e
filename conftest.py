"""Shared pytest setup: one BLAS/torch thread per process (xdist runs one process per core), and
every attnsvm module imported up front.

Why the imports: Hypothesis (≥ 6.131) mixes constants found in the loaded *local* modules into the
values it draws, so the examples of a derandomized (``ci``) run depend on which attnsvm modules
happen to be loaded when a test starts — that is, on test order, which differs between a serial run,
``-n 2`` and a single test. Importing them all before any test runs fixes the constant pool and
keeps "same seed, same examples" true serially and under xdist.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import attnsvm  # noqa: E402

torch.set_num_threads(1)

for _mod in pkgutil.walk_packages(attnsvm.__path__, prefix="attnsvm."):
    importlib.import_module(_mod.name)


# Test ids are ASCII: pytest escapes other characters in node ids (``\u2265``), and an escaped id
# passed back to an in-process ``pytest.main`` after a first collection is not found (a usage error),
# which is how mutmut reruns the tests that cover a mutant. Parameter strings are transliterated;
# explicit ids must be ASCII (checked at collection).
_ASCII = {"≥": ">=", "≤": "<=", "½": "1/2", "Δ": "Delta", "·": "*", "−": "-", "×": "x", "α": "alpha"}


def pytest_make_parametrize_id(config, val, argname):  # noqa: ARG001 - pytest hook signature
    if isinstance(val, str) and not val.isascii():
        return "".join(_ASCII.get(ch, ch if ch.isascii() else "?") for ch in val)
    return None


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest hook signature
    import re

    escaped = [item.nodeid for item in items if re.search(r"\\[ux][0-9a-f]{2}", item.nodeid)]
    if escaped:
        raise pytest.UsageError(
            f"{len(escaped)} test ids are not ASCII (pytest escapes them and cannot select them again by "
            f"id), e.g. {escaped[0]!r}: give the parameter an ASCII id"
        )
