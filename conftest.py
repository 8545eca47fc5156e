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

import torch  # noqa: E402

import attnsvm  # noqa: E402

torch.set_num_threads(1)

for _mod in pkgutil.walk_packages(attnsvm.__path__, prefix="attnsvm."):
    importlib.import_module(_mod.name)
