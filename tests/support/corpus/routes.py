"""The three ways a corpus model reaches Cuvil, and the on-disk cache of its ONNX exports.

Routes
    * ``torch_export``: ``cuvil.compile(module, input_spec=..., dynamic_shapes=...)``, Cuvil's PyTorch
      front end over ``torch.export``;
    * ``onnx_torchscript``: ``torch.onnx.export(..., dynamo=False, opset_version=17)``, the TorchScript
      exporter most ONNX files in the wild come from;
    * ``onnx_dynamo``: ``torch.onnx.export(..., dynamo=True, opset_version=18)``, the exporter torch
      recommends today.

Each in a ``fixed`` variant (every dim as in the example inputs) and a ``dynamic`` one (the model's
``dynamic`` axes symbolic: ``torch.export.Dim`` objects for the torch.export-based routes,
``dynamic_axes`` names for the TorchScript exporter).

The TorchScript exporter cannot trace the ``torch.vmap`` with which ``transformers`` builds the
attention masks of its decoders (gpt2, llama: "RuntimeError: unordered_map::at"); for it, such a
model (``CorpusModel.vmap_masks``) builds its masks with ``transformers``' own vmap-free function for exporters (``sdpa_without_vmap``,
from ``transformers.integrations.executorch``), the same boolean masks with the same attention.

Exporting to ONNX takes seconds per model, so the files are kept in
``~/.cache/cuvil-corpus/<key>/``, where the key hashes the versions of torch, transformers, onnx
and onnxscript and the source of this package (the configs, seeds and export arguments): a change
to any of them exports afresh.  Each file is written at most once, even by several pytest-xdist
workers at a time, under the build cache's lock (:func:`cuvil.backends.c.cache.get_or_build`).
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path
from typing import Any

import onnx
import onnxscript
import torch
import transformers

from cuvil.backends.c.cache import get_or_build
from tests.support.corpus.models import CorpusModel

ROUTES = ("torch_export", "onnx_torchscript", "onnx_dynamo")
VARIANTS = ("fixed", "dynamic")
ONNX_ROUTES = {"onnx_torchscript": (False, 17), "onnx_dynamo": (True, 18)}  # route: (dynamo, opset)


@functools.cache
def cache_key() -> str:
    """What the exported files depend on: the package versions and this package's source (read once, so
    that one test run keeps one key)."""
    h = hashlib.sha256()
    for part in (torch.__version__, transformers.__version__, onnx.__version__, onnxscript.__version__):
        h.update(part.encode() + b"\0")
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    return Path.home() / ".cache" / "cuvil-corpus" / cache_key()


def torch_dynamic_shapes(model: CorpusModel) -> tuple[tuple[dict[int, Any], ...]]:
    """``dynamic_shapes`` for torch.export: one ``Dim`` per symbol name, shared by the inputs that use it,
    nested as the wrapper's one ``*args`` parameter is."""
    dims: dict[str, Any] = {}
    out = []
    for name in model.inputs:
        axes = model.dynamic.get(name, {})
        out.append({axis: dims.setdefault(sym, _dim(model, sym)) for axis, sym in axes.items()})
    return (tuple(out),)


def _dim(model: CorpusModel, symbol: str) -> Any:
    lo, hi = model.ranges.get(symbol, (None, None))
    kwargs = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
    return torch.export.Dim(symbol, **kwargs)


def onnx_file(model: CorpusModel, route: str, variant: str, root: Path | None = None) -> Path:
    """The model exported by ``route`` in ``variant``, from the cache (exported into it when absent)."""
    if route not in ONNX_ROUTES:
        raise ValueError(f"{route} is not an ONNX route ({', '.join(ONNX_ROUTES)})")
    key = f"{model.name}-{route}-{variant}"
    folder, _ = get_or_build(root or cache_root(), key, lambda f: export_onnx(model, route, variant, f / "model.onnx"))
    return folder / "model.onnx"


def export_onnx(model: CorpusModel, route: str, variant: str, path: Path) -> None:
    dynamo, opset = ONNX_ROUTES[route]
    module = model.build()
    if not dynamo and model.vmap_masks:
        _masks_without_vmap(module)
    example = model.sample(model.example)
    kwargs: dict[str, Any] = {"input_names": list(model.inputs), "output_names": list(model.outputs)}
    if variant == "dynamic":
        if dynamo:
            kwargs["dynamic_shapes"] = torch_dynamic_shapes(model)
        else:
            kwargs["dynamic_axes"] = {name: dict(axes) for name, axes in model.dynamic.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' deprecation and tracer chatter
        if dynamo:
            # one self-contained file: the weights inline rather than as external data
            program = torch.onnx.export(module, example, dynamo=True, opset_version=opset, **kwargs)
            assert program is not None
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(module, example, str(path), dynamo=False, opset_version=opset, **kwargs)
    onnx.checker.check_model(str(path))


def _masks_without_vmap(module: torch.nn.Module) -> None:
    from transformers.integrations.executorch import sdpa_mask_without_vmap
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = module.model.config
    assert config._attn_implementation == "sdpa", config._attn_implementation
    ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa_without_vmap", sdpa_mask_without_vmap)
    ALL_ATTENTION_FUNCTIONS.register("sdpa_without_vmap", ALL_ATTENTION_FUNCTIONS["sdpa"])
    config._attn_implementation = "sdpa_without_vmap"
