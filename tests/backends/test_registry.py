"""The backend table: every built-in target is one registered backend, and a new target is one more.

The test backend (tests/backends/echo_backend.py, the example of docs/adding-a-target.md) is
registered, compiled for through ``cuvil.compile``, seen by the CLI and by ``cuvil verify``, and
gone once unregistered."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.backends.registry import (
    Backend,
    backend_names,
    backends,
    find_backend,
    get_backend,
    register_backend,
    unregister_backend,
)
from cuvil.cli import main
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.verify.runner import available_targets, resolve_targets, target_unavailable
from tests.backends.echo_backend import NAME, EchoRefBackend, echo_backend
from tests.support.ir_text import CHAIN


def test_the_built_in_targets_are_registered_backends() -> None:
    assert backend_names()[:6] == ("ref", "generic", "x86_avx2", "x86_avx512", "native", "wasm32")
    assert [b.name for b in backends() if b.is_c] == ["generic", "x86_avx2", "x86_avx512", "native"]
    ref, native, wasm = get_backend("ref"), get_backend("native"), get_backend("wasm32")
    assert not ref.builds and ref.kernel_ops() is None and ref.default_pipeline() == ""
    assert native.supports_threads and native.uses_system_cc and native.saves_artifacts
    assert not wasm.supports_threads and not wasm.uses_system_cc and wasm.saves_artifacts
    assert wasm.chooses_conv_algorithm and not ref.chooses_conv_algorithm
    assert get_backend("x86_avx2").required_features() >= {"avx2", "fma"}
    assert native.required_features() == frozenset()  # this machine's own
    assert "conv" in native.kernel_ops() and native.kernel_ops() == wasm.kernel_ops()
    assert find_backend("onnxruntime") is None
    with pytest.raises(cuvil.CuvilError, match="unknown target 'nope'; choose one of ref, generic"):
        get_backend("nope")
    with pytest.raises(cuvil.CuvilError, match="unknown target 'nope'"):
        cuvil.compile(parse_graph(CHAIN), target="nope")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(cuvil.CuvilError, match="'ref' is already registered"):
        register_backend(Backend("ref"))
    with pytest.raises(cuvil.CuvilError, match="no backend named 'nope'"):
        unregister_backend("nope")


def test_a_registered_backend_is_a_target_everywhere(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    g = parse_graph(CHAIN)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (want,) = cuvil.compile(g, target="ref")(x)
    with echo_backend() as backend:
        assert NAME in backend_names() and get_backend(NAME) is backend
        m = cuvil.compile(g, target=NAME, precision_samples=3)
        assert m.target == NAME and m.info.cached is None  # nothing is built
        (got,) = m(x)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        # its own pipeline ran (cse merged the two adds), and the backend got the options
        assert m.graph is not None and [n.op for n in m.graph.nodes].count("add") == 1
        assert len(backend.built) == 1 and backend.built[0].precision.samples == 3
        # the options' checks read its capabilities: it builds nothing, so cc= means nothing to it
        with pytest.raises(cuvil.CuvilError, match=f"num_threads applies to the native C targets; {NAME} runs one"):
            cuvil.compile(g, target=NAME, num_threads=2)
        with pytest.raises(cuvil.CuvilError, match="conv_algorithm applies to the C and wasm32 targets"):
            cuvil.compile(g, target=NAME, conv_algorithm="im2col")
        # the CLI knows it
        path = tmp_path / "chain.cir"  # type: ignore[operator]
        path.write_text(CHAIN)
        assert main(["opt", str(path), "--target", NAME]) == 0
        assert capsys.readouterr().out == print_graph(m.graph)
        # and so does cuvil verify
        assert target_unavailable(NAME) is None and NAME in available_targets()
        assert resolve_targets(["ref", NAME]) == (["ref", NAME], {})
    assert NAME not in backend_names() and find_backend(NAME) is None
    with pytest.raises(cuvil.CuvilError, match=f"unknown target '{NAME}'"):
        cuvil.compile(g, target=NAME)
    with pytest.raises(SystemExit):
        main(["opt", str(path), "--target", NAME])
    with pytest.raises(cuvil.CuvilError, match=f"unknown target '{NAME}'"):
        target_unavailable(NAME)


def test_a_backend_that_cannot_run_here_says_why() -> None:
    class Missing(EchoRefBackend):
        def unavailable(self) -> str | None:
            return "needs the Python package nothing-here"

    register_backend(Missing("missing-here"))
    try:
        assert resolve_targets(["ref", "missing-here"]) == (["ref"], {"missing-here": "needs the Python package "
                                                                                        "nothing-here"})
        assert "missing-here" not in available_targets()
    finally:
        unregister_backend("missing-here")


def test_every_backend_has_a_kernel_for_every_op() -> None:
    """The completeness test of the table: per backend, the declared ops it has no kernel for (the
    code generator emits constants, If and Loop itself)."""
    import cuvil.ops

    inline = {"constant", "if", "loop"}
    declared = set(cuvil.ops.all_ops())
    missing = {b.name: sorted(declared - ops - inline - b.unsupported_ops())
               for b in backends() if (ops := b.kernel_ops()) is not None}
    assert set(missing) >= {"generic", "native", "wasm32"}
    assert not any(missing.values()), missing
    # a backend's listed not-yet-supported ops are exactly those it lacks: a kernel added takes its op off
    for b in backends():
        if (ops := b.kernel_ops()) is not None:
            assert not (b.unsupported_ops() & ops), (b.name, sorted(b.unsupported_ops() & ops))
            assert b.unsupported_ops() <= declared, (b.name, sorted(b.unsupported_ops() - declared))
