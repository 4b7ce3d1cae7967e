"""report.json: the full result objects; each result's tensors beside it as ``tensors/CHECK.TARGET.npz``.

A result with tensors gets ``"tensors_file"``: the .npz path relative to the JSON file, whose
arrays are named as in ``"tensors"``.  Text attachments (``details["attachments"]``, a mapping of
file name to text, such as the IR before and after a pass) are also written as files,
``attachments/CHECK.TARGET/NAME``, listed in ``"attachment_files"`` (name to relative path).
Non-finite numbers are written as the strings "NaN", "Infinity" and "-Infinity", so the file
is strict JSON any parser reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.verify.report import Report


def _file_stem(check: str, target: str | None, taken: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{check}.{target or 'all'}")
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}.{n}"
    taken.add(name)
    return name


def _write_attachments(root: Path, check: str, target: str | None, attachments: dict[str, Any],
                       taken: set[str]) -> dict[str, str]:
    folder = Path("attachments") / _file_stem(check, target, taken)
    (root / folder).mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for name, text in attachments.items():
        rel = folder / (re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).lstrip(".") or "attachment")
        (root / rel).write_text(str(text), encoding="utf-8")
        written[str(name)] = rel.as_posix()
    return written


def write_json(report: Report, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = report.to_json()
    taken: set[str] = set()
    folders: set[str] = set()
    for entry, result in zip(data["results"], report.results):
        attachments = result.details.get("attachments")
        if isinstance(attachments, dict) and attachments:
            entry["attachment_files"] = _write_attachments(p.parent, result.check, result.target, attachments, folders)
        if not result.tensors:
            continue
        rel = Path("tensors") / f"{_file_stem(result.check, result.target, taken)}.npz"
        (p.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in result.tensors.items()}
        np.savez_compressed(p.parent / rel, **arrays)
        entry["tensors_file"] = rel.as_posix()
    p.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    return p
