"""The six-model fleet of the fleet tests, built here: three models that pass, one that fails a
check (a threshold no float32 run meets), one whose C build crashes and one whose C build hangs
(the planted faults native-crash and native-hang, cuvil/faults.py), on ref and native."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.verify.models import f32, onnx_model

HANG_TIMEOUT = 4  # seconds: the hanging job's time limit (the others keep the default)


def _scaled(op: str, scale: float, seed: int) -> onnx.ModelProto:
    """y = op(x * w) + x on x[2, 16], with seeded weights w."""
    w = numpy_helper.from_array(np.random.default_rng(seed).uniform(0.5, scale, (1, 16)).astype(np.float32), "w")
    nodes = [helper.make_node("Mul", ["x", "w"], ["m"], name="scale"),
             helper.make_node(op, ["m"], ["a"], name="act"),
             helper.make_node("Add", ["a", "x"], ["y"], name="residual")]
    return onnx_model(nodes, [f32("x", [2, 16])], [f32("y", [2, 16])], [w])


MODELS = {"ok_tanh": ("Tanh", 1.5), "ok_sigmoid": ("Sigmoid", 2.0), "ok_relu": ("Relu", 1.0),
          "fails": ("Tanh", 3.0), "crashes": ("Sigmoid", 1.2), "hangs": ("Tanh", 0.9)}

FLEET = f"""
[defaults]
targets = ["ref", "native"]
checks = ["precision"]

[defaults.thresholds.precision]
precisions = ["fp32"]

[[model]]
path = "models/ok_*.onnx"

[[model]]
path = "models/fails.onnx"
[model.thresholds.precision]
max_rel_l2 = 1e-30             # no float32 run is that close to the float64 reference: fails,
floor_multiple = 0             # with no allowance for the model's own float32 error

[[model]]
path = "models/crashes.onnx"
faults = ["native-crash"]

[[model]]
path = "models/hangs.onnx"
faults = ["native-hang"]
timeout = {HANG_TIMEOUT}
"""

#: (model, target) -> the status and signature each job must end with.
EXPECTED = {
    **{(f"models/ok_{n}.onnx", t): ("pass", None) for n in ("tanh", "sigmoid", "relu") for t in ("ref", "native")},
    ("models/fails.onnx", "ref"): ("fail", None), ("models/fails.onnx", "native"): ("fail", None),
    ("models/crashes.onnx", "ref"): ("pass", None), ("models/crashes.onnx", "native"): ("crash", "SIGSEGV"),
    ("models/hangs.onnx", "ref"): ("pass", None),
    ("models/hangs.onnx", "native"): ("timeout", f"timeout after {HANG_TIMEOUT} s"),
}


def write_fleet(folder: Path) -> Path:
    """The fleet file and its six models under ``folder``; returns the fleet file."""
    (folder / "models").mkdir(parents=True, exist_ok=True)
    for i, (name, (op, scale)) in enumerate(MODELS.items()):
        onnx.save(_scaled(op, scale, seed=i), folder / "models" / f"{name}.onnx")
    path = folder / "fleet.toml"
    path.write_text(FLEET)
    return path


def edit_model(folder: Path, name: str = "ok_relu") -> None:
    """Change one model's weights (its bytes, so its digest and its jobs' keys)."""
    op, scale = MODELS[name]
    onnx.save(_scaled(op, scale, seed=99), folder / "models" / f"{name}.onnx")
