"""Mutators of ONNX models: structured mutations that keep the file parseable but break what it says, and
byte-level mutations of its serialized form.

Structured mutations (each picks its target with the case's own seeded generator, and describes what it did):

1. an attribute given another type (INT as FLOAT, INTS as a STRING, a graph as an INT ...);
2. an attribute given an extreme value (0, -1, 2**40, -2**63, an empty or a 10,000-long list);
3. a dim of a graph input or output set to 0, -1, 2**40, an empty name or hostile text;
4. an initializer whose data length disagrees with its dims (truncated, extended, dims changed);
5. a node input renamed to a name nothing defines (dangling), or two nodes writing one name;
6. a cycle: a node reads a value that a later node writes;
7. a wrong opset: version 1, 10,000, or an unknown domain on a node;
8. a region body that disagrees with its node: a body input's type or dims changed, an output dropped;
9. a node's op type swapped for another op type, an input dropped or an extra one added;
10. an element type changed to one Cuvil has no kernels for, or to an undefined number.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import onnx
from onnx import AttributeProto, TensorProto, helper

HOSTILE = ['a"b', "x\\n#include <stdio.h>", "*/ int evil; /*", "\u202e", "../../etc/passwd", "%s%n", "é" * 3]
EXTREME_INTS = [0, -1, 1, 2**31, 2**40, -(2**63), 2**63 - 1]
OP_TYPES = ["Relu", "Add", "MatMul", "Conv", "Reshape", "Concat", "Gather", "Softmax", "Transpose", "Slice",
            "Loop", "If", "Resize", "Pad", "TopK", "NonZero", "Expand", "Tile", "Split", "ReduceSum", "Cast",
            "NoSuchOp", ""]
ELEM_TYPES = [TensorProto.STRING, TensorProto.COMPLEX64, TensorProto.UNDEFINED, TensorProto.FLOAT8E4M3FN,
              TensorProto.UINT4, 999, TensorProto.BOOL, TensorProto.DOUBLE]


def graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``g`` and every region body inside it, depth first."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                yield from graphs(a.g)
            for sub in a.graphs:
                yield from graphs(sub)


def _nodes(m: onnx.ModelProto) -> list[tuple[onnx.GraphProto, onnx.NodeProto]]:
    return [(g, n) for g in graphs(m.graph) for n in g.node]


def _attr_type(m: onnx.ModelProto, rng: random.Random) -> str:
    attrs = [(n, a) for _, n in _nodes(m) for a in n.attribute]
    if not attrs:
        return _op_type(m, rng)
    n, a = rng.choice(attrs)
    kind = rng.choice(["float", "string", "ints", "int", "tensor", "floats"])
    i = list(n.attribute).index(a)
    name = a.name
    new = {
        "float": lambda: helper.make_attribute(name, 1.5),
        "string": lambda: helper.make_attribute(name, b"\xff\xfe" + rng.choice(HOSTILE).encode()),
        "ints": lambda: helper.make_attribute(name, [rng.choice(EXTREME_INTS) for _ in range(rng.randint(0, 4))] or [0]),
        "int": lambda: helper.make_attribute(name, rng.choice(EXTREME_INTS)),
        "tensor": lambda: helper.make_attribute(name, helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0])),
        "floats": lambda: helper.make_attribute(name, [float("nan"), float("inf")]),
    }[kind]()
    n.attribute[i].CopyFrom(new)
    return f"attribute {name!r} of {n.op_type} {n.name!r} given a {kind}"


def _attr_value(m: onnx.ModelProto, rng: random.Random) -> str:
    attrs = [(n, a) for _, n in _nodes(m) for a in n.attribute if a.type in (AttributeProto.INT, AttributeProto.INTS,
                                                                             AttributeProto.FLOAT)]
    if not attrs:
        return _dims(m, rng)
    n, a = rng.choice(attrs)
    if a.type == AttributeProto.INT:
        a.i = rng.choice(EXTREME_INTS)
        what = str(a.i)
    elif a.type == AttributeProto.FLOAT:
        a.f = rng.choice([0.0, -1.0, float("nan"), float("inf"), 3.4e38])
        what = str(a.f)
    else:
        del a.ints[:]
        count = rng.choice([0, 1, 3, 10_000])
        a.ints.extend(rng.choice(EXTREME_INTS) for _ in range(count))
        what = f"{count} values"
    return f"attribute {a.name!r} of {n.op_type} {n.name!r} set to {what}"


def _dims(m: onnx.ModelProto, rng: random.Random) -> str:
    vis = [vi for vi in [*m.graph.input, *m.graph.output] if vi.type.tensor_type.shape.dim]
    if not vis:
        return _init_data(m, rng)
    vi = rng.choice(vis)
    dims = vi.type.tensor_type.shape.dim
    d = rng.choice(list(dims))
    values = {"0": 0, "-1": -1, "2**40": 2**40}
    choice = rng.choice([*values, "empty", "hostile", "expr"])
    if choice in values:
        d.dim_value = values[choice]
    elif choice == "empty":
        d.dim_param = ""
    elif choice == "hostile":
        d.dim_param = rng.choice(HOSTILE)
    else:
        d.dim_param = rng.choice(["n*2", "n+1", "2*(n", "n//0", "n-n"])
    return f"a dim of {vi.name!r} set to {choice}"


def _init_data(m: onnx.ModelProto, rng: random.Random) -> str:
    inits = [t for g in graphs(m.graph) for t in g.initializer]
    if not inits:
        return _dangling(m, rng)
    t = rng.choice(inits)
    if not t.raw_data:
        arr = onnx.numpy_helper.to_array(t)
        t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    how = rng.choice(["truncate", "extend", "dims", "negative dim", "huge dim"])
    if how == "truncate":
        t.raw_data = t.raw_data[: len(t.raw_data) // 2]
    elif how == "extend":
        t.raw_data = t.raw_data + b"\x00" * 12
    elif how == "dims":
        t.dims.append(3)
    elif how == "negative dim":
        if t.dims:
            t.dims[0] = -2
        else:
            t.dims.append(-2)
    else:
        t.dims.insert(0, 2**40)
    return f"initializer {t.name!r}: {how}"


def _dangling(m: onnx.ModelProto, rng: random.Random) -> str:
    g, n = rng.choice(_nodes(m))
    if rng.random() < 0.5 and n.input:
        i = rng.randrange(len(n.input))
        n.input[i] = "no_such_value_" + rng.choice(HOSTILE)
        return f"input {i} of {n.op_type} {n.name!r} names nothing"
    others = [o for o in g.node if o is not n and o.output]
    if not others or not n.output:
        return _cycle(m, rng)
    n.output[0] = rng.choice(others).output[0]
    return f"{n.op_type} {n.name!r} writes a name another node writes"


def _cycle(m: onnx.ModelProto, rng: random.Random) -> str:
    g = rng.choice([g for g in graphs(m.graph) if len(g.node) >= 2] or [m.graph])
    if len(g.node) < 2:
        return _opset(m, rng)
    i = rng.randrange(len(g.node) - 1)
    later = g.node[rng.randrange(i + 1, len(g.node))]
    if not g.node[i].input or not later.output:
        return _opset(m, rng)
    g.node[i].input[0] = later.output[0]
    return f"{g.node[i].op_type} reads {later.output[0]!r}, which a later node writes"


def _opset(m: onnx.ModelProto, rng: random.Random) -> str:
    how = rng.choice(["1", "10000", "domain", "none"])
    if how == "domain":
        _, n = rng.choice(_nodes(m))
        n.domain = rng.choice(["com.evil", "ai.onnx.ml", "com.microsoft"])
        return f"{n.op_type} moved to domain {n.domain!r}"
    if how == "none":
        del m.opset_import[:]
        return "no opset imports"
    m.opset_import[0].version = int(how)
    return f"default opset {how}"


def _region(m: onnx.ModelProto, rng: random.Random) -> str:
    bodies = [(n, a) for _, n in _nodes(m) for a in n.attribute if a.type == AttributeProto.GRAPH]
    if not bodies:
        return _op_type(m, rng)
    n, a = rng.choice(bodies)
    body = a.g
    how = rng.choice(["input type", "input dims", "drop output", "extra output", "drop input", "not a graph"])
    if how == "not a graph":
        i = list(n.attribute).index(a)
        n.attribute[i].CopyFrom(helper.make_attribute(a.name, 7))
    elif how in ("input type", "input dims") and body.input:
        vi = rng.choice(list(body.input))
        if how == "input type":
            vi.type.tensor_type.elem_type = rng.choice([TensorProto.INT64, TensorProto.DOUBLE, TensorProto.BOOL])
        else:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for v in rng.choice([[1], [2**28], [7, 7], []]):
                shape.dim.add().dim_value = v
    elif how == "drop output" and body.output:
        body.output.pop()
    elif how == "drop input" and body.input:
        body.input.pop()
    else:
        body.output.add().CopyFrom(helper.make_tensor_value_info("extra_out", TensorProto.FLOAT, [1]))
    return f"body {a.name!r} of {n.op_type}: {how}"


def _op_type(m: onnx.ModelProto, rng: random.Random) -> str:
    _, n = rng.choice(_nodes(m))
    how = rng.choice(["swap", "drop input", "extra input"])
    if how == "swap":
        old, n.op_type = n.op_type, rng.choice(OP_TYPES)
        return f"{old} {n.name!r} became {n.op_type!r}"
    if how == "drop input" and n.input:
        n.input.pop()
    else:
        n.input.append(n.input[0] if n.input else "x")
    return f"{n.op_type} {n.name!r}: {how}"


def _elem_type(m: onnx.ModelProto, rng: random.Random) -> str:
    vis = [*m.graph.input, *m.graph.output, *(t for g in graphs(m.graph) for t in g.value_info)]
    inits = [t for g in graphs(m.graph) for t in g.initializer]
    if inits and (not vis or rng.random() < 0.3):
        t = rng.choice(inits)
        t.data_type = rng.choice(ELEM_TYPES)
        return f"initializer {t.name!r} given element type {t.data_type}"
    if not vis:
        return _dims(m, rng)
    vi = rng.choice(vis)
    vi.type.tensor_type.elem_type = rng.choice(ELEM_TYPES)
    return f"{vi.name!r} given element type {vi.type.tensor_type.elem_type}"


STRUCTURED: tuple[Callable[[onnx.ModelProto, random.Random], str], ...] = (
    _attr_type, _attr_value, _dims, _init_data, _dangling, _cycle, _opset, _region, _op_type, _elem_type,
)


def structured(seed_model: onnx.ModelProto, rng: random.Random, count: int = 1) -> tuple[bytes, str]:
    """``seed_model`` with ``count`` structured mutations, serialized, and what they were."""
    m = onnx.ModelProto()
    m.CopyFrom(seed_model)
    done = [rng.choice(STRUCTURED)(m, rng) for _ in range(count)]
    return m.SerializeToString(), "; ".join(done)


def byte_level(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """``data`` with a few random byte changes: flips, overwrites with boundary values, inserts, deletes, a cut."""
    buf = bytearray(data)
    done = []
    for _ in range(rng.randint(1, 8)):
        if not buf:
            break
        i = rng.randrange(len(buf))
        how = rng.choice(["flip", "boundary", "insert", "delete", "cut"])
        if how == "flip":
            buf[i] ^= 1 << rng.randrange(8)
        elif how == "boundary":
            buf[i] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
        elif how == "insert":
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif how == "delete":
            del buf[i:i + rng.randint(1, 4)]
        else:
            del buf[i:]
        done.append(f"{how}@{i}")
    return bytes(buf), "bytes " + ",".join(done)
