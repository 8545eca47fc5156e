"""The batched engine's input side: the torch device check and the stacking of validated instances.

:meth:`attnsvm.gd.BatchEngine.from_instances` (hence :func:`attnsvm.gd.run_gd_batch`) is the one caller:
the instances are checked (a sequence of :class:`~attnsvm.Instance` of one shape ``(n, T, d)``), stacked
into ``(B, n, T, d)``, ``(B, n)``, ``(B, n, d)``, ``(B, d)`` arrays, each rescaled by exact powers of two
as :mod:`attnsvm.gd._scaled` gives it (``X' = X·2^−ex``, ``z' = z·2^−ez``, ``v' = v·2^ex``; the logits of
``W`` are those of ``W' = W·2^k`` on ``X'``, ``z'``, ``k = ex + ez``), and the token masks stacked beside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._types import FloatArray
from ..errors import AttnSVMError
from ..model._instance import Instance
from ._scaled import _rescale, _Scaled


def _torch_device(device: Any) -> Any:
    """``device`` (``None``, ``"cpu"``, ``"cuda"``, ``"cuda:i"`` or a ``torch.device``) as a checked
    ``torch.device``; raises :class:`~attnsvm.AttnSVMError` saying what to use instead."""
    import torch

    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise AttnSVMError(
            f"device {device!r} is not a torch device name; use 'cpu' or 'cuda' ({exc})"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise AttnSVMError(
                f"device {device!r} was requested but CUDA is not available to torch on this machine "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use device='cpu'"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise AttnSVMError(
                f"device {device!r} does not exist; torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
    elif dev.type != "cpu":
        raise AttnSVMError(f"device {device!r} is not supported; use 'cpu' or 'cuda'")
    return dev


#: Data whose largest entries lie within 2^±_MODERATE need no rescaling in the batched engine.
_MODERATE = 64


def _max_magnitude(A: FloatArray) -> FloatArray:
    """``max_j |A_bj|`` per row of a 2-D array with at least one column, as ``max(max A, −min A)`` (no temporary
    of ``A``'s size)."""
    return np.maximum(A.max(axis=1), -A.min(axis=1))


def _stack_instances(
    instances: Sequence[Instance],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, NDArray[np.int64], NDArray[np.bool_] | None]:
    """``(X, Y, z, v, k, allowed)``: the instances checked, rescaled and stacked (``W'_b = W_b·2^k_b``).

    Each instance as :func:`attnsvm.gd._scaled._rescale` gives it, and its exponent ``k_b``; when every
    instance's keys and queries lie within ``2^±_MODERATE`` the data are stacked as they are (``k = 0``:
    the common case runs without any per-step rescaling of ``W``). ``X`` holds the keys
    (:attr:`Instance.keys`: the masked tokens zeroed), ``allowed`` the token masks, a boolean
    ``(B, n, T)`` array (``True`` = the token takes part; all ``True`` rows for an unmasked instance), or
    ``None`` when no instance has a mask.

    An instance whose normal token values ``v·2^ex`` cannot carry is rescaled as ``run_gd`` rescales it,
    :func:`attnsvm.gd._scaled._rescale` with ``shift=True`` (``v·2^c``, ``X·2^−c``, ``z·2^(c−ex−ez)``, each
    exact, ``k`` the same), and the batch then never takes the moderate-data shortcut (its raw ``v`` is the
    one the engine cannot carry). Every other instance is stacked bit for bit as before.

    Raises :class:`~attnsvm.AttnSVMError` for anything but a non-empty sequence of instances of one
    shape, and :class:`~attnsvm.NumericalError` (from the rescaling) where an instance's token values
    are not normal doubles (:meth:`attnsvm.Instance.values`).
    """
    if isinstance(instances, Instance):
        raise AttnSVMError("instances must be a sequence of Instance; wrap a single Instance in a list")
    try:
        items = list(instances)
    except TypeError:
        raise AttnSVMError(
            f"instances must be a sequence of Instance; got {type(instances).__name__}"
        ) from None
    if not items:
        raise AttnSVMError("instances is empty; pass at least one Instance")
    for i, it in enumerate(items):
        if not isinstance(it, Instance):
            raise AttnSVMError(f"instances[{i}] is a {type(it).__name__}, not an attnsvm Instance")
    shape = items[0].X.shape  # (n, T, d), as Instance.shape (read from X: the property costs 5× more)
    for i, it in enumerate(items):
        if it.X.shape != shape:
            raise AttnSVMError(
                f"instances must share one shape (n, T, d) to be batched; instances[0] has {items[0].shape}, "
                f"instances[{i}] has {it.shape}. "
                "Group the instances by shape and batch each group on its own."
            )
    B = len(items)
    allowed = np.stack([it.allowed for it in items]) if any(it.mask is not None for it in items) else None

    def stacked(arrays: list[FloatArray]) -> FloatArray:
        # np.stack, by one concatenation along the existing first axis (a third of np.stack's time)
        return np.concatenate(arrays).reshape((B, *arrays[0].shape))

    X = stacked([it.keys for it in items])  # (B, n, T, d)
    Y = stacked([it.Y for it in items])
    z = stacked([it.z for it in items])
    v = stacked([it.v for it in items])
    # _rescale of every instance, vectorised: ex, ez = pow2_exponent of its keys and queries (frexp of the
    # largest magnitude; frexp(0) = (0, 0)) and v' = v·2^ex, exact where it comes back bit for bit. The
    # other instances go through _rescale itself, in order (its finer test, or the contract's error).
    ex = np.frexp(_max_magnitude(X.reshape(B, -1)))[1]
    ez = np.frexp(_max_magnitude(z.reshape(B, -1)))[1]
    with np.errstate(over="ignore"):
        vs = np.ldexp(v, ex[:, None])
        exact = np.isfinite(vs).all(axis=1) & (np.ldexp(vs, -ex[:, None]) == v).all(axis=1)
    # The other instances: _rescale(shift=True), as run_gd: its finer test (v·2^ex rounds harmlessly: the
    # same arrays as above), or normal values carried at another exponent c (X·2^−c, z·2^(c−ex−ez), v·2^c,
    # each exact, k the same), or the contract's error where the token values are not normal doubles.
    shifted: dict[int, _Scaled] = {}
    for b in (int(b) for b in np.flatnonzero(~exact)):
        sc = _rescale(items[b], shift=True)
        if not np.array_equal(sc.v, vs[b]):
            shifted[b] = sc
    if not shifted and np.all(np.abs(ex) <= _MODERATE) and np.all(np.abs(ez) <= _MODERATE):
        # moderate data (entries within 2^±64): the engine's own ranges suffice; no per-step
        # rescaling of W (the throughput of the common case is unchanged)
        return X, Y, z, v, np.zeros(B, dtype=np.int64), allowed
    Xs, zs = np.ldexp(X, -ex[:, None, None, None]), np.ldexp(z, -ez[:, None, None])
    for b, sc in shifted.items():  # a carried exponent other than ex: never the moderate shortcut
        Xs[b], zs[b], vs[b] = sc.X, sc.z, sc.v
    return Xs, Y, zs, vs, (ex + ez).astype(np.int64), allowed
