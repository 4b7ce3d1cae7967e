"""``python -m tests.support.corpus [MODEL ...]``: export the corpus's ONNX files into the cache and list them.

One line per file: model, route, variant and path (tab-separated), for tools that take a model
path (``python -m cuvil verify`` on real models, onnxruntime).  With no argument, every model.
"""

from __future__ import annotations

import sys

from tests.support.corpus.models import MODELS
from tests.support.corpus.routes import ONNX_ROUTES, VARIANTS, onnx_file


def main(argv: list[str]) -> int:
    names = argv or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"unknown models: {', '.join(unknown)} (the corpus has {', '.join(MODELS)})", file=sys.stderr)
        return 2
    for name in names:
        for route in ONNX_ROUTES:
            for variant in VARIANTS:
                print(f"{name}\t{route}\t{variant}\t{onnx_file(MODELS[name], route, variant)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
