"""Recognising a file PyTorch wrote, without importing torch or the torch front end.

``torch.jit.save`` and ``torch.save`` both write a zip archive whose entries sit
in one top folder.  A TorchScript archive holds the model's code
(``<top>/code/...``) and its constants (``<top>/constants.pkl``); what
``torch.save`` writes (a pickled module or a state dict) has neither.  A file is
taken for a PyTorch file when it is a zip archive or is named ``.pt``/``.pth``;
ONNX files are protobuf messages, which never start with a zip header.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from cuvil.errors import ModelError

TORCH_SUFFIXES = (".pt", ".pth")
_ZIP_MAGIC = b"PK\x03\x04"


def is_torch_file(model: object) -> bool:
    """Whether ``model`` is the path of a file to read as a PyTorch file (it need not be a valid one)."""
    if not isinstance(model, str | os.PathLike):
        return False
    path = Path(model)
    if path.suffix.lower() in TORCH_SUFFIXES:
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def check_torchscript_archive(path: str | os.PathLike[str]) -> None:
    """Refuse, in one sentence, a file that is not a TorchScript archive (``torch.jit.save``'s)."""
    where = os.fspath(path)
    if not os.path.isfile(where):
        raise ModelError(f"{where}: no such file")
    if not zipfile.is_zipfile(where):
        raise ModelError(f"{where} is not a TorchScript archive (not a zip file): Cuvil reads .pt/.pth files "
                         "written by torch.jit.save")
    try:
        with zipfile.ZipFile(where) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelError(f"{where} is not a readable zip archive ({exc})") from None
    parts = [n.split("/") for n in names]
    has_code = any(len(p) > 2 and p[1] == "code" for p in parts)
    has_constants = any(len(p) == 2 and p[1] == "constants.pkl" for p in parts)
    if has_code and has_constants:
        return
    if any(len(p) == 2 and p[1] == "data.pkl" for p in parts):
        raise ModelError(f"{where} was written by torch.save (a pickled module or state dict), not torch.jit.save: "
                         "it holds no TorchScript code. Load the module in Python and pass it to cuvil.compile, or "
                         "save it with torch.jit.save(torch.jit.script(model), path)")
    raise ModelError(f"{where} is a zip archive but not a TorchScript archive (no code/ and constants.pkl): Cuvil "
                     "reads .pt/.pth files written by torch.jit.save")
