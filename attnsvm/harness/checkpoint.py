"""Resumable ``attnsvm reproduce`` runs: each finished experiment saved atomically, and a manifest.

A run's ``--out`` folder holds, besides the report, ::

    manifest.json                    {"format": 2, "settings": {...}, "finished": [experiment, ...]}
    experiments/<experiment>.json    one finished experiment's ExperimentResult, exactly (see below)

The settings are what the results depend on: ``size``, ``seed``, ``device``, the ``attnsvm``
version and the experiments selected (in report order, key ``"experiments"``). ``--jobs`` and
``--scheduler`` are not settings: the experiments are seeded on their own, so a run may be resumed
with other ones.

Format 1 (before the reproduce "families" were renamed "experiments") had the folder ``families/``,
the settings key ``"families"`` and the class name ``FamilyResult`` in each file; a format-1 folder
is not resumed (the message says so and what to do: start again with ``--force``), and ``--force``
clears it like a format-2 one.

Atomicity: an experiment's file is written to a temporary file in the same folder and moved into place
with :func:`os.replace` (atomic on POSIX and Windows), *then* the manifest is rewritten the same
way. A run killed at any instant leaves either the old or the new version of each file, and the
manifest names only experiments whose file is complete.

Exactness: the report of a resumed run must equal the uninterrupted one, so an experiment's result is
stored with its Python and NumPy types (``tuple``, ``numpy.ndarray`` with dtype and shape, NumPy
scalars, dicts with non-string keys, the report's dataclasses) and every float as its shortest
round-trip decimal (Python's ``repr``; non-finite values as ``NaN``/``Infinity``): decoding gives
back values equal in type and bits. A value of any other type raises :class:`CheckpointError`
rather than being stored approximately.

Saved: experiments that ran (``available``) and did not crash (no failed ``ran`` claim). An
experiment that is not available or raised is run again on resume: its cause (a missing module, memory, a
killed worker) may be gone.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AttnSVMError
from .results import ExperimentClaim, ExperimentResult, Figure, Panel, Series

__all__ = [
    "CheckpointError",
    "RunCheckpoint",
    "MANIFEST_FILE",
    "EXPERIMENTS_DIR",
    "LEGACY_EXPERIMENTS_DIR",
    "FORMAT",
    "encode_result",
    "decode_result",
    "run_settings",
]

MANIFEST_FILE = "manifest.json"
EXPERIMENTS_DIR = "experiments"
#: The checkpoint folder of format 1 (cleared by ``--force``, never resumed).
LEGACY_EXPERIMENTS_DIR = "families"
#: Version of the manifest and experiment-file layout; a folder of another version is not resumed.
#: 2: "families" renamed "experiments" (folder, settings key, result class); 1: the original layout.
FORMAT = 2
#: The dataclasses an experiment result is made of, by name (the only classes decoding constructs).
_CLASSES: dict[str, type] = {
    c.__name__: c for c in (ExperimentResult, ExperimentClaim, Figure, Panel, Series)
}
#: NumPy dtype kinds stored exactly through Python scalars (bool, signed/unsigned int, float ≤ 64 bit).
_KINDS = "biuf"


class CheckpointError(AttnSVMError):
    """A checkpoint cannot be written or read back exactly, or does not match the run's settings."""


# ------------------------------------------------------------------------------ codec
def _dtype_ok(dt: np.dtype[Any]) -> bool:
    # float128 / longdouble would lose digits through a Python float: refuse rather than round.
    return dt.kind in _KINDS and dt.itemsize <= 8


def _enc(obj: Any, path: str) -> Any:
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, np.generic):  # before int/float: np.float64 is a float subclass
        if not _dtype_ok(obj.dtype):
            raise CheckpointError(f"{path}: NumPy scalar of dtype {obj.dtype} cannot be stored exactly")
        return {"__np__": obj.dtype.str, "v": obj.item()}
    if isinstance(obj, (int, float)):
        return obj
    if isinstance(obj, np.ndarray):
        if not _dtype_ok(obj.dtype):
            raise CheckpointError(f"{path}: array of dtype {obj.dtype} cannot be stored exactly")
        return {"__nd__": obj.dtype.str, "shape": list(obj.shape), "data": obj.ravel().tolist()}
    if isinstance(obj, tuple):
        return {"__tuple__": [_enc(v, f"{path}/{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_enc(v, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _enc(v, f"{path}/{k}") for k, v in obj.items()}
        # keys that JSON cannot hold as they are (non-strings) or that look like our type tags
        return {"__dict__": [[_enc(k, f"{path}/<key>"), _enc(v, f"{path}/{k}")] for k, v in obj.items()]}
    if is_dataclass(obj) and not isinstance(obj, type) and type(obj).__name__ in _CLASSES:
        if _CLASSES[type(obj).__name__] is not type(obj):
            raise CheckpointError(f"{path}: {type(obj).__qualname__} is not the report's dataclass")
        return {
            "__dc__": type(obj).__name__,
            "fields": {f.name: _enc(getattr(obj, f.name), f"{path}/{f.name}") for f in fields(obj)},
        }
    raise CheckpointError(
        f"{path}: a value of type {type(obj).__qualname__} cannot be stored exactly in a checkpoint "
        "(use lists, dicts, numbers, strings or NumPy arrays in experiment results)"
    )


def _hook(d: dict[str, Any]) -> Any:
    if "__np__" in d:
        return np.dtype(d["__np__"]).type(d["v"])
    if "__nd__" in d:
        return np.array(d["data"], dtype=np.dtype(d["__nd__"])).reshape(d["shape"])
    if "__tuple__" in d:
        return tuple(d["__tuple__"])
    if "__dict__" in d:
        return {(tuple(k) if isinstance(k, list) else k): v for k, v in d["__dict__"]}
    if "__dc__" in d:
        return _CLASSES[d["__dc__"]](**d["fields"])
    return d


def encode_result(result: ExperimentResult) -> str:
    """The exact JSON text of an experiment's result (see the module docstring)."""
    return json.dumps(_enc(result, result.name), ensure_ascii=False, allow_nan=True)


def decode_result(text: str) -> ExperimentResult:
    """The :class:`ExperimentResult` that :func:`encode_result` wrote, equal in types and bits."""
    res = json.loads(text, object_hook=_hook)
    if not isinstance(res, ExperimentResult):
        raise CheckpointError("not an experiment result")
    return res


# --------------------------------------------------------------------------- manifest
def run_settings(*, size: str, seed: int, device: str, experiments: Sequence[str]) -> dict[str, Any]:
    """The settings a run's results depend on (recorded in the manifest, compared on resume)."""
    from .. import __version__

    return {
        "size": size,
        "seed": int(seed),
        "device": device,
        "attnsvm": __version__,
        "experiments": list(experiments),
    }


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader (or a killed writer) sees the old or the new file only."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # atomic: the old file or the new one, never a half-written one
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class RunCheckpoint:
    """The manifest and experiment files of one run folder.

    Use :meth:`start` (a new run: writes an empty manifest) or :meth:`resume` (an earlier run with
    the same settings: returns its finished results); then :meth:`save` each finished experiment.
    """

    def __init__(self, out_dir: str | Path, settings: Mapping[str, Any]) -> None:
        self.out_dir = Path(out_dir)
        self.settings = dict(settings)
        self.finished: list[str] = []

    @property
    def manifest_path(self) -> Path:
        return self.out_dir / MANIFEST_FILE

    def _write_manifest(self) -> None:
        doc = {"format": FORMAT, "settings": self.settings, "finished": self.finished}
        _atomic_write(self.manifest_path, json.dumps(doc, indent=1, ensure_ascii=False))

    def start(self) -> None:
        """Begin a new run: the experiments folder and a manifest with nothing finished."""
        (self.out_dir / EXPERIMENTS_DIR).mkdir(parents=True, exist_ok=True)
        self.finished = []
        self._write_manifest()

    def resume(self) -> dict[str, ExperimentResult]:
        """Load the finished experiments of the run in the folder (its manifest must have our settings).

        Raises:
          CheckpointError: no manifest, an unreadable one, one of another format (format 1: written
            before the rename to experiments), other settings (the message lists each difference), or a
            finished experiment whose file is missing or unreadable.
        """
        try:
            doc = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(
                f"{self.out_dir} holds no {MANIFEST_FILE}: there is no run to resume"
            ) from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"{self.manifest_path}: unreadable ({exc}); start again with --force"
            ) from None
        if isinstance(doc, dict) and doc.get("format") == 1:
            raise CheckpointError(
                f"{self.manifest_path}: a run of checkpoint format 1, written before the reproduce "
                f"'families' were renamed 'experiments'; this attnsvm resumes format {FORMAT} only: start "
                "again there with --force (it clears the old run), or choose another --out"
            )
        if (
            not isinstance(doc, dict)
            or doc.get("format") != FORMAT
            or not isinstance(doc.get("settings"), dict)
        ):
            raise CheckpointError(
                f"{self.manifest_path}: not a manifest of format {FORMAT}; start again with --force"
            )
        theirs = doc["settings"]
        diffs = [
            f"{k}: {theirs.get(k)!r} there, {self.settings.get(k)!r} now"
            for k in sorted(set(theirs) | set(self.settings))
            if theirs.get(k) != self.settings.get(k)
        ]
        if diffs:
            raise CheckpointError(
                f"--resume: the run in {self.out_dir} has other settings ({'; '.join(diffs)}); resume it with "
                "its settings, or start again there with --force, or choose another --out"
            )
        done: dict[str, ExperimentResult] = {}
        for name in doc.get("finished", []):
            path = self.out_dir / EXPERIMENTS_DIR / f"{name}.json"
            try:
                res = decode_result(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                raise CheckpointError(
                    f"{path}: the manifest lists {name!r} as finished but its result cannot be read ({exc}); "
                    "start again with --force"
                ) from None
            if res.name != name:
                raise CheckpointError(
                    f"{path}: holds experiment {res.name!r}, not {name!r}; start again with --force"
                )
            done[name] = res
        self.finished = list(done)
        (self.out_dir / EXPERIMENTS_DIR).mkdir(parents=True, exist_ok=True)
        return done

    @staticmethod
    def saveable(result: ExperimentResult) -> bool:
        """Whether a result is kept for resuming: it ran and did not crash (see the module docstring)."""
        return result.available and not any(c.name == "ran" and not c.passed for c in result.claims)

    def save(self, result: ExperimentResult) -> bool:
        """Save a finished experiment (atomically) and record it in the manifest; ``False`` if not kept."""
        if not self.saveable(result):
            return False
        text = encode_result(result)
        _atomic_write(self.out_dir / EXPERIMENTS_DIR / f"{result.name}.json", text)
        if result.name not in self.finished:
            self.finished.append(result.name)
        self._write_manifest()  # after the experiment's file: the manifest names only complete files
        return True
