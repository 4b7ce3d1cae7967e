"""Calibration data: what users give ``calibration_dataset=`` and the model calls Cuvil makes of it.

Accepted forms, each item of which is one call of the model (a *feed*):

1. A ``torch.utils.data.DataLoader`` or any iterable of samples.  A sample is a tuple or
   list of arrays (the model's inputs in order), a dict keyed by input name, or, for a
   model with one input, a single array.  Arrays are NumPy arrays or CPU torch tensors;
   their element types must be the model's (nothing is converted silently).  A sample
   with more items than the model has inputs (a ``(x, label)`` pair) is refused, not cut.
2. A folder of ``.npz`` files (``cuvil compile --calibration DIR``), read in name order:
   one file per sample, its arrays keyed by input name or ``arr_0``, ``arr_1``... in
   input order (what ``np.savez(path, *arrays)`` writes).

**Batches.**  The model's *batch axis* is axis 0 of its inputs when every input has
rank >= 1 and the same axis-0 dim, which is either a symbol or the number 1 (a model
exported at batch 1), and, for a symbol, when examples along it run independently: a
sequence-first model (``[seq, batch, d]``, ``[seq, d]``) also has a symbolic axis 0, so
calibration checks it on the first samples before it counts or merges anything along it
(``cuvil.quant.calibrate.confirm_batch_axis``; without a batch axis every sample is one
example).  With a batch axis, a sample counts as many examples as its
axis-0 extent, and a batch larger than the model takes is split along axis 0 into
the largest pieces it accepts (a model of batch 1 is fed one example at a time; a
symbolic batch of at most ``M`` in pieces of ``M``).  Splitting never changes what
calibration sees: statistics are per element, and the histogram bins are fixed
before anything is counted.  Without a batch axis every sample is one example.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import Dim, DimExpr
from cuvil.runtime.torch_io import is_torch_tensor, tensor_to_numpy


class CalibrationDataError(CuvilError):
    """Calibration data that is missing, malformed or does not fit the model."""


@dataclass(frozen=True)
class CalibrationSet:
    """The model calls calibration makes (arrays in graph-input order) and how many examples they hold."""

    feeds: tuple[tuple[np.ndarray, ...], ...]
    examples: int
    batch_axis: bool  # whether examples were counted along a batch axis (else one per feed)
    pieces: tuple[int, ...] = ()  # the feeds each sample was split into, in order (empty: one each)

    @property
    def examples_settled(self) -> bool:
        """Whether ``examples`` holds whatever the batch-axis probe decides: counted one per feed
        already, or one row per feed (``without_batch_axis`` would count the same)."""
        return not self.batch_axis or self.examples == len(self.feeds)

    def without_batch_axis(self) -> CalibrationSet:
        """The same samples, each one example of one feed: for a model whose axis 0 turned out not to
        be a batch (``cuvil.quant.calibrate.confirm_batch_axis``)."""
        if any(k > 1 for k in self.pieces):
            i = next(i for i, k in enumerate(self.pieces) if k > 1)
            raise CalibrationDataError(
                f"calibration sample {i} was split along axis 0 to fit the model, but axis 0 is not a batch "
                "axis (examples along it do not run independently): give samples the model takes whole")
        return CalibrationSet(self.feeds, len(self.feeds), False)


def batch_dim(graph: Graph) -> Dim | None:
    """The model's batch dim (see the module docstring), or None when it has no batch axis."""
    if not graph.inputs or any(v.type.rank == 0 for v in graph.inputs):
        return None
    first = graph.inputs[0].type.shape[0]
    if any(v.type.shape[0] != first for v in graph.inputs):
        return None
    if isinstance(first, int):
        return first if first == 1 else None
    if isinstance(first, DimExpr) and first == DimExpr.symbol(next(iter(first.symbols()), "")):
        return first
    return None


def calibration_items(dataset: Any, graph: Graph) -> list[Any]:
    """The samples of ``dataset`` (any form of the module docstring), read once into a list."""
    return list(_samples(dataset, graph))


def _samples(dataset: Any, graph: Graph) -> Iterable[Any]:
    if isinstance(dataset, str | os.PathLike):
        return npz_samples(Path(dataset), [v.name for v in graph.inputs])
    if isinstance(dataset, Iterable) and not isinstance(dataset, bytes | Mapping) and not hasattr(dataset, "shape"):
        return dataset
    raise CalibrationDataError(
        f"calibration_dataset must be a DataLoader, an iterable of input tuples or dicts, or a folder of .npz "
        f"files; got {type(dataset).__name__}")


def calibration_set(dataset: Any, graph: Graph) -> CalibrationSet:
    """The feeds of ``dataset`` (any form of the module docstring) for ``graph``'s inputs."""
    names = [v.name for v in graph.inputs]
    samples = _samples(dataset, graph)
    bdim = batch_dim(graph)
    feeds: list[tuple[np.ndarray, ...]] = []
    pieces: list[int] = []
    examples = 0
    for i, sample in enumerate(samples):
        arrays = _sample_arrays(sample, graph, i)
        if bdim is None:
            feeds.append(arrays)
            examples += 1
            continue
        n = int(arrays[0].shape[0])
        if n == 0:
            raise CalibrationDataError(f"calibration sample {i} holds no examples: input {names[0]!r} has 0 rows "
                                       "along the batch axis")
        for k, a in enumerate(arrays[1:], 1):
            if a.shape[0] != n:
                raise CalibrationDataError(
                    f"calibration sample {i}: input {names[k]!r} has {a.shape[0]} rows along the batch axis, "
                    f"input {names[0]!r} has {n}")
        examples += n
        piece = _piece(graph, bdim, n)
        feeds.extend(tuple(a[s:s + piece] for a in arrays) for s in range(0, n, piece))
        pieces.append(-(-n // piece))
    if not feeds:
        raise CalibrationDataError("the calibration dataset holds no samples")
    return CalibrationSet(tuple(feeds), examples, bdim is not None, tuple(pieces))


def _piece(graph: Graph, bdim: Dim, n: int) -> int:
    """The largest batch (at most ``n``) the model takes in one call."""
    if isinstance(bdim, int):
        return bdim
    (sym,) = bdim.symbols() if isinstance(bdim, DimExpr) else ()
    info = graph.symbols.get(sym)
    if info is None or info.max is None or n <= info.max:
        return n
    return info.max


def _sample_arrays(sample: Any, graph: Graph, index: int) -> tuple[np.ndarray, ...]:
    names = [v.name for v in graph.inputs]
    where = f"calibration sample {index}"
    if isinstance(sample, Mapping):
        missing = [n for n in names if n not in sample]
        extra = [str(k) for k in sample if k not in names]
        if missing or extra:
            parts = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + \
                    ([f"unknown {', '.join(map(repr, extra))}"] if extra else [])
            raise CalibrationDataError(f"{where}: its keys do not match the model's inputs ({'; '.join(parts)}); "
                                       f"expected {names}")
        items = [sample[n] for n in names]
    elif isinstance(sample, tuple | list):
        items = list(sample)
        if len(items) != len(names):
            hint = (" (a dataset of (input, label) pairs? give the inputs only)" if len(items) > len(names) else "")
            raise CalibrationDataError(f"{where} has {len(items)} items, the model takes {len(names)} inputs "
                                       f"{names}{hint}")
    elif len(names) == 1:
        items = [sample]
    else:
        raise CalibrationDataError(f"{where} is one {type(sample).__name__}, the model takes {len(names)} inputs "
                                   f"{names}: give a tuple or a dict of them")
    out = []
    for v, item in zip(graph.inputs, items):
        what = f"{where}, input {v.name!r}"
        a = np.array(tensor_to_numpy(item, what)) if is_torch_tensor(item) else np.asarray(item)
        try:
            dt = DType.from_np(a.dtype)
        except TypeError:
            dt = None
        if dt is not v.type.dtype:
            raise CalibrationDataError(f"{what}: element type {a.dtype}, the model takes {v.type.dtype}")
        if a.ndim != v.type.rank:
            raise CalibrationDataError(f"{what}: shape {list(a.shape)} (rank {a.ndim}), the model takes {v.type}")
        out.append(a)
    return tuple(out)


def npz_samples(folder: Path, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    """The samples of a folder of ``.npz`` files, in file-name order, keyed by input name."""
    if not folder.is_dir():
        raise CalibrationDataError(f"calibration folder {str(folder)!r} does not exist or is not a folder")
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise CalibrationDataError(f"calibration folder {str(folder)!r} holds no .npz files (one file per sample, "
                                   f"keyed by input name: {list(names)})")
    return [npz_sample(f, names) for f in files]


def npz_sample(path: Path, names: Sequence[str], what: str = "calibration file") -> dict[str, np.ndarray]:
    """One sample's ``.npz`` file, keyed by input name (its arrays named so, or ``arr_0``, ``arr_1``...
    in input order); ``what`` names the file in errors."""
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:
        raise CalibrationDataError(f"{what} {str(path)!r} is not a readable .npz: {exc}") from None
    positional = [f"arr_{i}" for i in range(len(names))]
    if set(data) == set(positional) and set(data) != set(names):
        data = {n: data[p] for n, p in zip(names, positional)}
    elif set(data) != set(names):
        raise CalibrationDataError(f"{what} {str(path)!r} holds {sorted(data)}; expected the model's "
                                   f"inputs {list(names)} (or arr_0..arr_{len(names) - 1} in input order)")
    return data
