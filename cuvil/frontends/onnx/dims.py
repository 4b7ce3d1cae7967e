"""What the dims an ONNX file declares mean, as Cuvil dims.

Exporters write an extent they do not know in several ways (paddle2onnx and
some tf2onnx versions write ``-1``, others leave the field empty or write an
expression of the names they do know).  One dim of a declared shape
(``TensorShapeProto.Dimension``) reads, by these rules:

1. ``dim_value`` n > 0: the static extent n.
2. ``dim_value`` 0: unknown, like rule 3.  Some exporters write 0 for an
   extent they did not know.  A model input declared with a 0 dim becomes a
   symbol, so it still runs when given an empty array (the symbol is then 0),
   and also when given the non-empty one the exporter meant (onnxruntime
   refuses that; Cuvil accepts both).  A tensor the model really holds empty
   (an initializer, a ``Constant``) never goes through these rules: its shape
   is its data's, and zero-size tensors computed from it stay static.
3. ``dim_value`` < 0, neither field set, or an empty ``dim_param``: unknown.
   On an input each becomes a fresh symbol, ``<input>_dim<axis>`` (a name no
   ``dim_param`` of the model uses: a numbered suffix is added when one does).
4. A ``dim_param`` that is an expression: names, integer literals, ``+``,
   ``-``, ``*`` and parentheses, with at least one operator (``"batch*2"``,
   ``"seq+1"``, ``"2*N"``, ``"(a+1)*2"``), is that polynomial over the names
   it uses.  The text is checked against that alphabet and then parsed by
   :func:`cuvil.ir.symbolic.parse_dim` (so ``?``, quoted names, ``floordiv``
   and ``bcast`` calls cannot be reached from a file); it is never evaluated
   as code (text over 200 characters, with more than 8 parentheses or an
   integer above 2**31 is a plain name).  An expression that comes out as a
   constant below 1 is unknown.
   On an input, an expression whose names no input dim determines (``a*b``
   where neither ``a`` nor ``b`` is an input dim of its own, nor ``k*a + c``)
   would leave a size nothing binds: it becomes the one symbol its text names.
5. Any other ``dim_param`` is the symbol of that name.  Whatever the text
   holds, it is only ever a name: the IR text quotes it, the C backend gives
   each symbol a generated identifier and writes names only inside escaped
   string literals.

A declared shape that is not an input's is never trusted: :func:`disagreement`
compares a graph output's declaration with the type inference derived, dim by
dim where the declaration says something (a static extent, or a symbol or
expression over symbols the inputs use), and the importer warns and keeps the
inferred type.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence

import onnx

from cuvil.errors import ModelError
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import Dim, DimExpr, free_symbols, is_unknown, linear_form, parse_dim
from cuvil.ir.types import TensorType

_log = logging.getLogger(__name__)

# The alphabet of an expression dim_param (rule 4): names, integers, + - * and parentheses.
_EXPR_TEXT = re.compile(r"[A-Za-z0-9_\s+\-*()]+\Z")
_OPERATOR = re.compile(r"[+\-*()]")


# Bounds on what rule 4 reads as an expression, so hostile text cannot make the polynomial explode
# ((a+b)*(c+d)*... doubles its terms with every factor) or write integers C cannot hold.
_MAX_TEXT = 200
_MAX_PARENS = 8
_MAX_INT = 1 << 31


def expression(text: str) -> Dim | None:
    """The dim a ``dim_param`` expression denotes (rule 4), or None when the text is a plain name."""
    if len(text) > _MAX_TEXT or not _EXPR_TEXT.match(text) or not _OPERATOR.search(text):
        return None
    if text.count("(") > _MAX_PARENS or any(int(n) > _MAX_INT for n in re.findall(r"\d+", text)):
        return None
    try:
        d = parse_dim(text)
    except (ValueError, RecursionError):
        return None
    return d


Declared = Dim | None  # None: the file does not say


def declared_dim(d: onnx.TensorShapeProto.Dimension) -> Declared:
    """What one declared dim says (rules 1-5); None for an unknown extent."""
    which = d.WhichOneof("value")
    if which == "dim_value":
        return int(d.dim_value) if d.dim_value > 0 else None
    if which == "dim_param" and d.dim_param:
        e = expression(d.dim_param)
        if e is None:
            return DimExpr.symbol(d.dim_param)
        if isinstance(e, int):
            return e if e > 0 else None
        return e
    return None


def declared_shape(vi: onnx.ValueInfoProto) -> list[Declared] | None:
    """The declared dims of a tensor value (None: no shape declared)."""
    if vi.type.WhichOneof("value") != "tensor_type" or not vi.type.tensor_type.HasField("shape"):
        return None
    return [declared_dim(d) for d in vi.type.tensor_type.shape.dim]


def dim_params(g: onnx.GraphProto) -> set[str]:
    """Every name the ``dim_param`` fields of ``g`` and its subgraphs use (expressions: their names)."""
    out: set[str] = set()
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.WhichOneof("value") == "dim_param" and d.dim_param:
                    out.add(d.dim_param)
                    e = expression(d.dim_param)
                    out |= free_symbols(e) if e is not None else set()
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out |= dim_params(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    out |= dim_params(sub)
    return out


def bindable(shapes: Iterable[Sequence[Dim]]) -> set[str]:
    """The symbols the given input shapes determine from the arrays a caller passes.

    The same rule as the input guard (cuvil/runtime/guards.py) and the C backend's input binding:
    a dim that is one symbol binds it; a dim ``k*s + c`` binds ``s`` when nothing bound it before.
    Order does not matter for which symbols end up bound."""
    shapes = [list(s) for s in shapes]
    bound: set[str] = set()
    for s in shapes:
        for d in s:
            if isinstance(d, DimExpr) and len(d.symbols()) == 1 and d == DimExpr.symbol(next(iter(d.symbols()))):
                bound |= d.symbols()
    for s in shapes:
        for d in s:
            lin = linear_form(d)
            if lin is not None:
                bound.add(lin[0])
    return bound


def format_declared(dims: Sequence[Declared], texts: Sequence[str]) -> str:
    """A declared shape as the file writes it: ``[batch*2, ?, 3]`` (``?``: unknown)."""
    parts = [t if t else ("?" if d is None else str(d)) for d, t in zip(dims, texts)]
    return f"[{', '.join(parts)}]"


def dim_texts(vi: onnx.ValueInfoProto) -> list[str]:
    """Each declared dim's ``dim_param`` text, or ``""`` (for messages)."""
    return [d.dim_param if d.WhichOneof("value") == "dim_param" else ""
            for d in vi.type.tensor_type.shape.dim]


def disagreement(declared: Sequence[Declared], inferred: TensorType, known: set[str]) -> bool:
    """Whether a declared output shape contradicts the inferred type.

    A declared dim is compared when it says something: a static extent, or a symbol or
    expression over ``known`` symbols (the model's input symbols); a dim naming symbols the
    inputs never use is only a name an exporter gave an unknown extent."""
    if len(declared) != inferred.rank:
        return True
    for d, got in zip(declared, inferred.shape):
        if d is None or not free_symbols(d) <= known or is_unknown(got):
            continue
        if d != got:
            return True
    return False


def check_region_output(vi: onnx.ValueInfoProto, v: Value, prefix: str) -> None:
    """A region's output crosses into its parent with the type computed for it; a rank or static
    dim its declaration contradicts is a malformed model, refused here rather than trusted later.

    Only static extents are compared (an unknown one, ``-1`` or ``0`` included, says nothing)."""
    declared = declared_shape(vi)
    if declared is None:
        return
    t = v.type
    if len(declared) != t.rank or any(
            isinstance(d, int) and isinstance(c, int) and d != c for d, c in zip(declared, t.shape)):
        raise ModelError(f"region {prefix.rstrip('/')!r}: output {vi.name!r} is declared "
                         f"{format_declared(declared, dim_texts(vi))} but computes {t}")


def check_model_output(vi: onnx.ValueInfoProto, v: Value, known: set[str]) -> None:
    """A model output's declared shape is not trusted: one that contradicts the inferred type
    (:func:`disagreement`) is replaced by the inferred one, with a warning naming both."""
    declared = declared_shape(vi)
    if declared is None or not disagreement(declared, v.type, known):
        return
    _log.warning("graph output %r is declared %s, but its inferred type is %s: the inferred shape is used",
                 vi.name, format_declared(declared, dim_texts(vi)), v.type)
