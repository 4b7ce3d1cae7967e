"""Where the tests find the repository and the data laid beside it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the ONNX node conformance cases, beside the repository (absent on a plain clone: tests skip)
NODE_TESTS = REPO.parent / "shared" / "onnx-node-tests" / "node"
