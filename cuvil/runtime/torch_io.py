"""PyTorch tensors in and out of a compiled model, without copying where the layout allows.

A compiled model runs on NumPy arrays.  A caller who hands it ``torch.Tensor``
inputs gets ``torch.Tensor`` outputs back.  Both directions go through DLPack,
so a contiguous CPU tensor is read in place and every output is shared with
the array the backend produced; a strided tensor is viewed as a strided
array, and the backend makes it contiguous if its kernels need that.  A tensor
with its negative or conjugate bit set is resolved (copied) first.

This module never imports torch: a caller can only hold a torch tensor if
torch is already loaded, so the module is looked up in ``sys.modules``.
That keeps the runtime free of a torch dependency (only ``cuvil.frontends``
imports it) while models compiled from ONNX still accept torch tensors.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import InputError


def _torch() -> Any:
    return sys.modules.get("torch")


def is_torch_tensor(x: object) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def tensor_to_numpy(t: Any, what: str = "input") -> np.ndarray:
    """A NumPy view of a CPU torch tensor (no copy); other devices are refused, not moved."""
    torch = _torch()
    if t.device.type != "cpu":
        raise InputError(f"{what} is a torch tensor on {t.device}; compiled models run on the CPU: pass it with .cpu()")
    if t.requires_grad:
        # inference only: the graph of the tensor's history is not needed, and DLPack refuses it
        t = t.detach()
    if t.is_neg() or t.is_conj():
        # a lazy negation or conjugation is a bit beside the data, which DLPack shares without it:
        # materialise it (a copy) so the model reads the values the caller sees
        t = t.resolve_neg().resolve_conj()
    if t.dtype is torch.bfloat16:
        # DLPack in NumPy has no bfloat16: share the bits as int16 and reinterpret them
        import ml_dtypes

        return np.from_dlpack(t.view(torch.int16)).view(ml_dtypes.bfloat16)
    try:
        return np.from_dlpack(t)
    except (BufferError, RuntimeError, TypeError) as exc:
        raise InputError(f"{what}: a torch tensor of type {t.dtype} cannot be read: {exc}") from None


def numpy_to_tensor(a: np.ndarray) -> Any:
    """A torch tensor sharing ``a``'s memory (which it keeps alive)."""
    torch = _torch()
    if a.dtype.name == "bfloat16":
        return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def inputs_to_numpy(values: Sequence[Any], names: Sequence[str]) -> tuple[list[np.ndarray], bool]:
    """The inputs as arrays, and whether any was a torch tensor (then outputs are returned as tensors)."""
    arrays: list[np.ndarray] = []
    any_torch = False
    for i, v in enumerate(values):
        if is_torch_tensor(v):
            any_torch = True
            what = f"input {names[i]!r}" if i < len(names) else f"input {i}"
            arrays.append(tensor_to_numpy(v, what))
        else:
            try:
                arrays.append(np.asarray(v))
            except (ValueError, TypeError) as exc:  # a ragged nested list, or objects NumPy cannot hold
                what = f"input {names[i]!r}" if i < len(names) else f"input {i}"
                raise InputError(f"{what} cannot be read as an array: {exc}") from None
    return arrays, any_torch


def outputs_as(arrays: Sequence[np.ndarray], torch_out: bool) -> list[Any]:
    """The outputs as torch tensors when the call was given torch tensors, else as they are."""
    if not torch_out:
        return list(arrays)
    return [numpy_to_tensor(a) for a in arrays]
