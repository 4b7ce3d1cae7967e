"""Symbolic dims: canonical forms, arithmetic, parsing."""

from __future__ import annotations

import pytest

from cuvil.ir.symbolic import UNKNOWN, broadcast_dim, ceildiv, evaluate, floordiv, parse_dim, product, sym

h, w, b = sym("h"), sym("w"), sym("b")


def test_constants_collapse_to_int() -> None:
    assert h - h == 0
    assert isinstance(h * 0 + 3, int)
    assert (2 * h) // h == 2


def test_polynomial_canonical_form() -> None:
    assert h + w == w + h
    assert 2 * (h + 1) == 2 * h + 2
    assert str(3 * h * w + 1) == "3*h*w + 1"


def test_conv_output_size_is_exact() -> None:
    out = (h + 2 * 1 - 3) // 2 + 1
    for v in range(1, 300):
        assert evaluate(out, {"h": v}) == (v + 2 - 3) // 2 + 1


def test_exact_division_of_monomials() -> None:
    assert product([b, 3, h, w]) // b == 3 * h * w
    assert (6 * h * w) // (3 * h) == 2 * w


def test_floordiv_and_ceildiv_evaluate_like_python() -> None:
    for expr, fn in [(floordiv(h + 5, 4), lambda v: (v + 5) // 4), (ceildiv(h, 3), lambda v: -(-v // 3))]:
        for v in range(0, 50):
            assert evaluate(expr, {"h": v}) == fn(v)
    assert evaluate((h + 3) % 4, {"h": 10}) == 1


def test_nested_floor_divisions_merge() -> None:
    # strided convolutions in a row (wav2vec2's feature extractor): torch writes s // 10 where the layers give
    # (s // 5) // 2, and the two forms must be one dim
    assert floordiv(floordiv(h, 5), 2) == floordiv(h, 10)
    assert floordiv(floordiv(h, 5) - 1, 2) == floordiv(h - 5, 10)
    cases = [(floordiv(floordiv(h - 10, 5) + 1, 2), lambda v: ((v - 10) // 5 + 1) // 2),
             (floordiv(floordiv(3 * h + 1, 4) - 3, 3), lambda v: ((3 * v + 1) // 4 - 3) // 3),
             (floordiv(floordiv(h, 4) + w, 2), lambda v: (v // 4 + 7) // 2)]
    for expr, fn in cases:
        for v in range(-40, 80):
            assert evaluate(expr, {"h": v, "w": 7}) == fn(v), (expr, v)


def test_broadcast() -> None:
    assert broadcast_dim(1, h) == h
    assert broadcast_dim(h, h) == h
    both = broadcast_dim(h, w)
    assert evaluate(both, {"h": 1, "w": 5}) == 5
    with pytest.raises(ValueError):
        evaluate(both, {"h": 2, "w": 5})
    with pytest.raises(ValueError):
        broadcast_dim(2, 3)


def test_unknown_absorbs() -> None:
    assert h * UNKNOWN == UNKNOWN
    assert str(UNKNOWN + 1) == "?"


@pytest.mark.parametrize("text", ["h", "3", "2*h + 1", "floordiv(h + 1, 2) + 3*w", "bcast(h, w)", '"batch size"*2', "?"])
def test_parse_print_round_trip(text: str) -> None:
    d = parse_dim(text)
    assert parse_dim(str(d)) == d
    assert str(parse_dim(str(d))) == str(d)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_dim("h +")
    with pytest.raises(ValueError):
        parse_dim("floordiv(h)")
