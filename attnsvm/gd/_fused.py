"""The batched engine's fused CPU kernel: the log-domain GD direction in one pass per instance.

The engine's eager paths (:mod:`attnsvm.gd._torch_engine`) spend a step on ~100 tensor operations, each a
pass over ``(T, B, n)`` or ``(d, B, n)`` arrays, and two batched products of tiny matrices; on the CPU
that is several times the memory-bandwidth floor of reading ``X`` once. This kernel
(``_fused.c``, shipped with the package) computes, per instance and sequence, the logits
``l_it = x_itᵀ W z_i``, the log-domain weights and ``G = Σ_i (Σ_t w_it x_it) z_iᵀ`` with ``W``, ``z_i``
and the sequence in cache, reading ``X`` once:

    w_it = −A_i c_it,   log A_i = log|ℓ'(Y_i f_i)| + m_i,   c_it = E_it (e^{m_i} ψ_i − δ_it),
    D = G/||G||,        log||∇L|| = max_i log A_i + log||G|| − log n

(the engine's :meth:`~attnsvm.gd.BatchEngine._direction_log`, exact under underflow at any ``||W||``; log
weights beyond ``LOG_WEIGHT_SPLIT`` combined by parts, as there). Instances it cannot decide as cheaply (a
token tied in score with the selected one, a non-finite logit or loss derivative, a gradient below
``G_TINY`` or not clearing the cheap cancellation bound) are flagged and recomputed by the eager
log-domain path, which decides them exactly.

The shared library is compiled on first use, once per feature dimension ``d`` (the d-long loops then
unroll: about twice as fast as with ``d`` a variable; ~2 s of compiling), with the system's C compiler
(``$CC``, else Python's ``sysconfig`` compiler, else ``cc``) into a cache folder (``$ATTNSVM_CACHE_DIR``,
else ``$XDG_CACHE_HOME/attnsvm`` or ``~/.cache/attnsvm``), named by a hash of the source, the flags and
``d``, written atomically (parallel test workers share it). Without a compiler the engine runs its eager paths
(:func:`kernel_status` says why). No fast-math: IEEE inf/NaN semantics are relied on.

Threads: built with OpenMP (gcc on Linux), the kernel shares its blocks of 16 instances out over torch's
own OpenMP threads (``torch.set_num_threads``; the library links the ``libgomp.so.1`` torch loaded, so one
thread team serves both and none spins against the other: with a second runtime, or Python threads, the
two-thread step was slower than the one-thread step). Without OpenMP the batch is split between Python
threads in whole blocks (ctypes releases the GIL). Each instance is computed by one thread in one fixed
order, at a place in its block that depends on the batch alone: results do not depend on the threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_SOURCE = Path(__file__).with_name("_fused.c")
#: The ABI version the source declares (``attnsvm_fused_abi()``): a stale library is rebuilt, never used.
_ABI = 8
#: ``(flags, libraries)`` tried in order: the first that compiles and links is used. The first two vectorize
#: the loops over a block's sequences with glibc's vector ``exp``/``log`` (libmvec: x86-64 Linux), the first
#: also shares the blocks out over OpenMP threads: the library links ``libgomp.so.1``, which resolves to the
#: copy torch already loaded (one OpenMP runtime, one thread team: torch's threads run the kernel, none
#: spins against it); without OpenMP the batch is split between Python threads. The last call the scalar
#: functions (``-march=native`` is not known to every compiler).
#: ``-fno-math-errno`` (``sqrt`` inlines) and ``-fno-trapping-math`` (comparisons that may meet a NaN
#: become vector selects) change no value: errno and the floating-point exception flags are never read.
#: Never fast-math: IEEE inf/NaN semantics and the order of every sum are relied on.
_IEEE = ("-fno-math-errno", "-fno-trapping-math")
_FLAG_SETS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("-O3", "-march=native", "-fopenmp", "-DATTNSVM_MVEC", *_IEEE), ("-lmvec", "-lm")),
    (("-O3", "-march=native", "-fopenmp-simd", "-DATTNSVM_MVEC", *_IEEE), ("-lmvec", "-lm")),
    (("-O3", "-march=native", *_IEEE), ("-lm",)),
    (("-O3", *_IEEE), ("-lm",)),
)

_lock = threading.Lock()
_libs: dict[int, Any] = {}  # d -> the library compiled for it
_errors: dict[int, str] = {}  # d -> why it could not be built or loaded
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def _cache_dir() -> Path:
    env = os.environ.get("ATTNSVM_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnsvm"


def _build(source: bytes, cache: Path, d: int) -> Path:
    """Compile ``source`` for feature dimension ``d`` into ``cache`` (once per source, flags and ``d``);
    returns the library's path."""
    cc = _compiler()
    if shutil.which(cc[0]) is None:
        raise OSError(f"no C compiler found (tried {cc[0]!r}; set CC to one)")
    errors = []
    for flags, libs in _FLAG_SETS:
        key = hashlib.sha256(source + repr((cc, flags, libs, d, platform.machine())).encode()).hexdigest()[
            :16
        ]
        lib = cache / f"attnsvm_fused_d{d}_{key}.so"
        if lib.exists():
            return lib
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            cmd = [*cc, *flags, f"-DFUSED_D={d}", "-fPIC", "-shared", "-o", tmp, str(_SOURCE), *libs]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                os.replace(tmp, lib)  # atomic: a parallel worker sees the whole library or none
                return lib
            errors.append(f"{' '.join(flags)}: {proc.stderr.strip()[-400:]}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError("the C compiler failed: " + " | ".join(errors))


def _load(d: int) -> Any:
    """The library compiled for feature dimension ``d`` (built on first use, a few seconds), or ``None`` with
    :data:`_errors` saying why."""
    with _lock:
        if d in _libs or d in _errors:
            return _libs.get(d)
        try:
            source = _SOURCE.read_bytes()
            try:
                path = _build(source, _cache_dir(), d)
            except PermissionError:
                path = _build(source, Path(tempfile.gettempdir()) / f"attnsvm-{os.getuid()}", d)
            lib = ctypes.CDLL(str(path))
            if lib.attnsvm_fused_abi() != _ABI or lib.attnsvm_fused_d() != d:
                raise OSError(
                    f"{path} declares ABI {lib.attnsvm_fused_abi()} for d = {lib.attnsvm_fused_d()}"
                )
            f = lib.attnsvm_fused_log_direction
            f.restype = ctypes.c_int
            f.argtypes = [ctypes.c_int64] * 6 + [ctypes.c_void_p] * 8 + [ctypes.c_int] + [ctypes.c_double] * 5
            f.argtypes += [ctypes.c_void_p] * 6
            _libs[d] = lib
        except OSError as exc:
            _errors[d] = str(exc)
        return _libs.get(d)


def kernel_status(d: int) -> tuple[bool, str]:
    """``(available, detail)``: whether the fused kernel runs here for feature dimension ``d`` (compiling it
    on first use), and the library or the reason not."""
    lib = _load(d)
    if lib is None:
        return False, f"fused kernel unavailable: {_errors[d]}"
    return True, f"fused kernel: {lib._name}"


def _threads() -> int:
    import torch

    return max(1, int(torch.get_num_threads()))


def _executor(size: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size != size:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="attnsvm-fused")
            _pool_size = size
        return _pool


class FusedLogDirection:
    """The kernel bound to one engine's constant data (CPU float64 tensors, contiguous, kept alive here).

    ``X`` ``(B, n, T, d)``, ``z`` ``(B, n, d)``, ``gammaT`` and ``xzT`` ``(T, B, n)`` (the engine's layout),
    ``xz_max``, ``log_ve`` and ``ve_c`` ``(B, n)``; ``loss`` 0 (logistic) or 1 (exponential); the scalars as
    the engine's (see ``_fused.c``).
    """

    _ORDER = ("X", "z", "gammaT", "xzT", "xz_max", "log_ve", "ve_c")

    def __init__(self, lib: Any, arrays: dict[str, Any], loss: int, scalars: dict[str, float]) -> None:
        import torch

        self._f = lib.attnsvm_fused_log_direction
        self._block = int(lib.attnsvm_fused_block())
        self._openmp = bool(lib.attnsvm_fused_openmp())
        self._a = {k: arrays[k].contiguous() for k in self._ORDER}
        B, n, T, d = self._a["X"].shape
        self.B, self.n, self.T, self.d = B, n, T, d
        self._loss = loss
        self._s = scalars
        #: logits of the last call, ``(T, B, n)`` (the engine's layout, as :meth:`BatchEngine.logits`)
        self.logits = torch.empty((T, B, n), dtype=torch.float64)
        #: 1 where the last call handed the instance back to the eager path
        self.flag = torch.empty((B,), dtype=torch.int8)
        #: the margins ``Y_i f_i`` (cancellation-free: ``γ_ir + e^{m_i} ψ_i``) and the selected tokens ``r`` (the
        #: first maximisers of the logits) of the last call, ``(B, n)``; meaningful where :attr:`flag` is 0
        self.margin = torch.empty((B, n), dtype=torch.float64)
        self.token = torch.empty((B, n), dtype=torch.int64)

    def __call__(self, W: Any, D: Any) -> Any:
        """Write the unit directions into ``D`` ``(B, d, d)``; returns ``log||∇L(W_b)||`` (a new ``(B,)``
        tensor; unset where :attr:`flag` is 1)."""
        import torch

        if not (W.is_contiguous() and D.is_contiguous()):
            raise ValueError("the fused kernel takes contiguous W and D")
        a, s = self._a, self._s
        log_norm = torch.empty((self.B,), dtype=torch.float64)
        ptrs = [a[k].data_ptr() for k in self._ORDER]
        tail = (
            self._loss,
            s["cancel_rtol"],
            s["cancel_factor"],
            s["log_n"],
            s["g_tiny"],
            s["split"],
            D.data_ptr(),
            log_norm.data_ptr(),
            self.logits.data_ptr(),
            self.flag.data_ptr(),
            self.margin.data_ptr(),
            self.token.data_ptr(),
        )
        B, n, T, d = self.B, self.n, self.T, self.d

        def run(b0: int, b1: int) -> int:
            return int(self._f(b0, b1, B, n, T, d, *ptrs[:-1], ptrs[-1], W.data_ptr(), *tail))

        blocks = -(-B // self._block)
        k = 1 if self._openmp else min(_threads(), blocks)
        if k == 1:  # one call: OpenMP (torch's threads) shares the blocks out, or one thread
            codes = [run(0, B)]
        else:
            # whole blocks per thread: the arithmetic of an instance does not depend on the split
            cuts = [min(B, self._block * (blocks * j // k)) for j in range(k + 1)]
            codes = list(_executor(k).map(run, cuts[:-1], cuts[1:]))
        if any(codes):
            raise MemoryError("the fused kernel could not allocate its scratch memory")
        return log_norm
