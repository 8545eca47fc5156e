"""The ``reproduce`` experiments, one module each; importing a module registers its experiment with
:func:`attnsvm.harness.experiments.register_experiment` (the report orders them by their ``order``).

* :mod:`~attnsvm.harness.experiments.saturation`: the gradient at saturation (stable vs textbook form).
* :mod:`~attnsvm.harness.experiments.textbook_gd`: GD driven by the textbook gradient.
* :mod:`~attnsvm.harness.experiments.convergence`: normalized and plain GD against the Att-SVM direction.
* :mod:`~attnsvm.harness.experiments.local_global`: locally optimal token choices and where GD ends.
* :mod:`~attnsvm.harness.experiments.regpath`: the regularization path.
* :mod:`~attnsvm.harness.experiments.svm`: the SVM methods against each other and the certificate.
* :mod:`~attnsvm.harness.experiments.lipschitz`: Lipschitz bounds and estimates, softmax vs linear.
* :mod:`~attnsvm.harness.experiments.symbolic`: the SymPy proofs.
* :mod:`~attnsvm.harness.experiments.multitoken`: several optimal tokens per sequence.
* :mod:`~attnsvm.harness.experiments.toys`: the peer models' toy problems.
* :mod:`~attnsvm.harness.experiments.autograd_saturation`: torch autograd through SDPA at saturation.
* :mod:`~attnsvm.harness.experiments.seq2seq`: every token a query (causal or not), GD against W_mm(α_final).

:mod:`~attnsvm.harness.experiments._common` holds the helpers several experiments share.
"""

from __future__ import annotations

from . import autograd_saturation as autograd_saturation
from . import convergence as convergence
from . import lipschitz as lipschitz
from . import local_global as local_global
from . import multitoken as multitoken
from . import regpath as regpath
from . import saturation as saturation
from . import seq2seq as seq2seq
from . import svm as svm
from . import symbolic as symbolic
from . import textbook_gd as textbook_gd
from . import toys as toys

__all__ = [
    "autograd_saturation",
    "convergence",
    "lipschitz",
    "local_global",
    "multitoken",
    "regpath",
    "saturation",
    "seq2seq",
    "svm",
    "symbolic",
    "textbook_gd",
    "toys",
]
