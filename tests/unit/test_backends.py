"""The backend interface (backends/base.py) and registry: every backend implements it, the default backend is set
by patch() and read through one function, and a backend without qgZ hands it over by the documented rule."""
import importlib
import warnings

import pytest
import torch

import deepspeed_zeropp
from deepspeed_zeropp import backends, qgz
from deepspeed_zeropp.backends import base

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def unpatched_afterwards():
    yield
    deepspeed_zeropp.unpatch()


@pytest.mark.parametrize("name", [n for n in backends.BACKENDS if n != "auto"])
def test_every_backend_implements_the_interface(name):
    module = backends.resolve_backend(name, CPU)
    assert base.missing(module) == [] and isinstance(module, base.Backend)
    assert module.NAME == name and backends.serving_name(name, CPU) == name


def test_patch_sets_the_default_backend_and_unpatch_resets_it():
    assert backends.default() == "auto"
    deepspeed_zeropp.patch(backend="torch")
    assert backends.default() == "torch" and qgz.codec(CPU).NAME == "torch"
    deepspeed_zeropp.unpatch()
    assert backends.default() == "auto"
    with pytest.raises(ValueError, match="unknown backend 'fast'; choose one of auto, torch, cuda, deepspeed"):
        backends.set_default("fast")


def test_deepspeed_backend_leaves_qgz_to_auto_warned_once_and_reported(monkeypatch):
    """DeepSpeed's op has no qgZ: patch(backend="deepspeed") says so in its report, and qgZ runs on auto (pure
    torch on CPU) with one warning, not silently."""
    monkeypatch.setattr(backends, "_warned_qgz", set())
    report = deepspeed_zeropp.patch(backend="deepspeed")
    assert report.qgz_backend == "auto" and "(backend: deepspeed; qgZ: auto)" in str(report)
    assert "qgZ" not in str(deepspeed_zeropp.patch(backend="torch")).splitlines()[0]
    deepspeed_zeropp.patch(backend="deepspeed")
    with pytest.warns(UserWarning, match="backend 'deepspeed' does not implement qgZ.*uses backend 'auto'"):
        assert qgz.codec(CPU).NAME == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert qgz.codec(CPU).NAME == "torch"
    with pytest.raises(NotImplementedError, match="does not implement qgZ"):
        backends.resolve_backend("deepspeed", CPU).qgz_decode_sum(None, 0, 0, 1.0, torch.float32)


def test_doctor_reports_where_qgz_runs(capsys):
    from deepspeed_zeropp import cli
    cli.main(["doctor", "--backend", "deepspeed"])
    assert "backend deepspeed has no qgZ: zero_quantized_gradients (and LoCo) run on backend auto" in (
        capsys.readouterr().out)


def test_resolving_a_loaded_backend_imports_nothing(monkeypatch):
    """resolve_backend runs on every quantize/dequantize: once a backend is loaded, a lookup is a dict read."""
    for name in ("torch", "deepspeed"):
        backends.resolve_backend(name, CPU)
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: pytest.fail("import machinery on the hot path"))
    for name in ("torch", "deepspeed", "auto"):
        assert backends.resolve_backend(name, CPU) is not None
