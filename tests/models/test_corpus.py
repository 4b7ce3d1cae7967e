"""The real-model corpus: ``transformers`` architectures, as the exporters write them, against PyTorch eager.

Every model of tests/support/corpus (BERT, DistilBERT, GPT-2, Llama, T5 encoder, ViT, DeiT, Swin,
ConvNeXt, MobileViT, Whisper encoder, wav2vec2: tiny configs, seeded random weights) reaches Cuvil by
three routes (Cuvil's PyTorch front end over ``torch.export``, the TorchScript ONNX exporter at opset
17, the dynamo ONNX exporter at opset 18), each with fixed shapes and with a symbolic batch (and
sequence, where the architecture allows one).  Each compiles on ``ref`` and ``native``, and the
dynamo exports with dynamic shapes on ``wasm32`` as well (every model on every target at least once,
in one build each).  A dynamic variant runs at the export's example shape and at two others, from
one build.

Tolerance, for every output at every shape, against PyTorch eager on the same inputs: relative L2
(``cuvil.metrics``) at most 1e-5, and elementwise ``|got - want| <= 1e-4 + 1e-3 |want|``.  The oracle
must be finite and not constant, so that a match means something.

A case known to fail is marked ``xfail(strict=True)`` with the error it fails with today and the work
that fixes it: it turns into a failure the day it passes.  The ONNX files are cached on disk by
package versions (tests/support/corpus/routes.py), and so are the C builds, which are
content-addressed.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import UnsupportedOpError
from cuvil.metrics import compare
from tests.support.corpus.models import MODELS
from tests.support.corpus.routes import ROUTES, VARIANTS, cache_root
from tests.support.corpus.store import Case, CorpusStore, shapes
from tests.support.targets import runnable

# whole models exported through torch.export and built in C: minutes in all, the slow tier
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning",
                                         "ignore::DeprecationWarning")]

REL_L2 = 1e-5
ATOL, RTOL = 1e-4, 1e-3

WASM32_CASES = [(name, "onnx_dynamo", "dynamic") for name in MODELS]

# (model, route, variant): (the exception it raises today, and what it says and which work fixes it)
KNOWN_FAILURES: dict[Case, tuple[type[BaseException], str]] = {
    ("swin", "torch_export", "dynamic"): (
        UnsupportedOpError,
        "UnsupportedOpError: aten.as_strided with symbolic sizes (the pooler's AdaptiveAvgPool1d over a dynamic "
        "batch: size [batch, 32, 1, 1], stride [32, 1, 32, 32]); as_strided is mapped for static sizes only"),
}


def _params() -> list[object]:
    out: list[object] = []
    for name in MODELS:
        for route in ROUTES:
            for variant in VARIANTS:
                case = (name, route, variant)
                targets = ["ref", *runnable("native"), *(runnable("wasm32") if case in WASM32_CASES else [])]
                for target in targets:
                    marks = list(getattr(target, "marks", ()))
                    target_name = getattr(target, "values", (target,))[0]
                    if case in KNOWN_FAILURES:
                        exc, reason = KNOWN_FAILURES[case]
                        marks.append(pytest.mark.xfail(strict=True, raises=exc, reason=reason))
                    out.append(pytest.param(case, target_name, marks=marks,
                                            id=f"{name}-{route}-{variant}-{target_name}"))
    return out


@pytest.fixture(scope="module")
def store() -> CorpusStore:
    return CorpusStore(cache_root() / "builds")


@pytest.mark.parametrize(("case", "target"), _params())
def test_corpus_model_matches_eager(store: CorpusStore, case: Case, target: str) -> None:
    name, _, variant = case
    m = store.compiled(case, target)
    for shape in shapes(MODELS[name], variant):
        where = f"{'-'.join(case)} on {target} at batch {shape.batch}, sequence {shape.seq}"
        got = m(*store.inputs(name, shape))
        want = store.expected(name, shape)
        assert len(got) == len(want), f"{where}: {len(got)} outputs, PyTorch gives {len(want)}"
        for out, g, w in zip(MODELS[name].outputs, got, want):
            g = np.asarray(g)
            assert g.dtype == w.dtype and g.shape == w.shape, \
                f"{where}: output {out} is {g.dtype}{list(g.shape)}, PyTorch gives {w.dtype}{list(w.shape)}"
            assert np.isfinite(w).all() and np.ptp(w) > 0, f"{where}: PyTorch's {out} is not an informative oracle"
            c = compare(g, w)
            assert c.ok and c.rel_l2 <= REL_L2, \
                f"{where}: output {out}: relative L2 {c.rel_l2:.3g} (max abs {c.max_abs:.3g}) {c.problem or ''}"
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{where}: output {out}")
