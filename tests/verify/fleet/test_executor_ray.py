"""What a Ray task asks for and how it finds its model; runs without Ray (the sweep on a Ray cluster
is in test_sweep.py)."""

from __future__ import annotations

from pathlib import Path

from cuvil.backends.registry import backends, get_backend
from cuvil.verify.fleet.executor_ray import local_source, node_resources, task_options
from cuvil.verify.fleet.jobs import Job, digest_of


def test_tasks_declare_cpus_gpus_and_the_cpu_features_of_their_target() -> None:
    avx512 = task_options("x86_avx512", {})
    assert avx512["num_cpus"] == 1.0 and "num_gpus" not in avx512
    assert set(avx512["resources"]) == set(get_backend("x86_avx512").required_features()) >= {"avx512f"}
    assert "resources" not in task_options("generic", {})  # runs on any node of its kind
    gpu = task_options("native", {"native": {"num_gpus": 1, "num_cpus": 2, "resources": {"big_memory": 1}}})
    assert (gpu["num_cpus"], gpu["num_gpus"], gpu["resources"]) == (2.0, 1.0, {"big_memory": 1.0})
    # a node advertises only features some target needs, and each in an amount many tasks share
    needed = {f for b in backends() for f in b.required_features()}
    assert set(node_resources()) <= needed and all(v >= 1 for v in node_resources().values())


def test_a_node_without_the_model_file_gets_the_drivers_bytes(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"onnx bytes")
    job = Job("m.onnx", str(model), "native", "compat", "k" * 24, digest_of([model], str(model)), 60.0, None, {})
    assert local_source(job, b"onnx bytes", tmp_path / "copy") == job  # a shared file system: read in place
    elsewhere = Job(job.model, "/nowhere/m.onnx", job.target, job.checks, job.key, job.digest, 60.0, None, {})
    moved = local_source(elsewhere, b"onnx bytes", tmp_path / "copy")
    assert moved.source == str(tmp_path / "copy" / "m.onnx") and Path(moved.source).read_bytes() == b"onnx bytes"
    factory = Job("f", "/nowhere/nets.py:tiny", "ref", "compat", "k" * 24, "d", 60.0, None, {})
    assert local_source(factory, b"def tiny(): ...", tmp_path / "f").source == f"{tmp_path / 'f' / 'nets.py'}:tiny"


def test_a_gpu_target_asks_for_a_gpu_and_its_emulation_does_not() -> None:
    assert task_options("cuda", {})["num_gpus"] == 1.0
    assert task_options("cuda:sm_90", {})["num_gpus"] == 1.0
    assert "num_gpus" not in task_options("cuda-sim", {})
    assert task_options("cuda", {"cuda": {"num_gpus": 2}})["num_gpus"] == 2.0  # the fleet file's word wins
