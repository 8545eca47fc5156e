"""Experiment families kept outside :mod:`attnsvm.harness.experiments`; importing a module registers its
family with :func:`attnsvm.harness.experiments.register_family`.

* :mod:`attnsvm.harness.families.autograd_saturation`: torch autograd through SDPA against
  ``normalized_risk_grad`` and an mpmath oracle, over the runner-up weight (issue 15 §3).
"""

from __future__ import annotations

from . import autograd_saturation as autograd_saturation

__all__ = ["autograd_saturation"]
