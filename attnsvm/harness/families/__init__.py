"""The ``reproduce`` experiment families, one module each; importing a module registers its family with
:func:`attnsvm.harness.experiments.register_family` (the report orders them by their ``order``).

* :mod:`~attnsvm.harness.families.saturation`: the gradient at saturation (stable vs textbook form).
* :mod:`~attnsvm.harness.families.textbook_gd`: GD driven by the textbook gradient.
* :mod:`~attnsvm.harness.families.convergence`: normalized and plain GD against the Att-SVM direction.
* :mod:`~attnsvm.harness.families.local_global`: locally optimal token choices and where GD ends.
* :mod:`~attnsvm.harness.families.regpath`: the regularization path.
* :mod:`~attnsvm.harness.families.svm`: the SVM methods against each other and the certificate.
* :mod:`~attnsvm.harness.families.lipschitz`: Lipschitz bounds and estimates, softmax vs linear.
* :mod:`~attnsvm.harness.families.symbolic`: the SymPy proofs.
* :mod:`~attnsvm.harness.families.multitoken`: several optimal tokens per sequence.
* :mod:`~attnsvm.harness.families.toys`: the peer models' toy problems.
* :mod:`~attnsvm.harness.families.autograd_saturation`: torch autograd through SDPA at saturation.
* :mod:`~attnsvm.harness.families.seq2seq`: every token a query (causal or not), GD against W_mm(α_final).

:mod:`~attnsvm.harness.families._common` holds the helpers several families share.
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
