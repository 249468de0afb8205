"""patch() / unpatch(): every site wrapped and marked, idempotent, exactly undone, loud when a seam is missing."""
import subprocess
import sys

import pytest
import torch

import deepspeed_zeropp
from deepspeed_zeropp.patching import PatchError, sites
from deepspeed_zeropp.patching.seams import MARKER


@pytest.fixture
def pp():
    from deepspeed.runtime.zero import partition_parameters
    yield partition_parameters
    deepspeed_zeropp.unpatch()


def current(pp, site):
    import importlib
    module = importlib.import_module(site.module)
    return vars(module if site.owner is None else getattr(module, site.owner)).get(site.attr)


def test_patch_reports_every_site(pp):
    report = deepspeed_zeropp.patch()
    assert [s.name for s in report.sites] == [s.name for s in sites.SITES]
    for site, line in zip(sites.SITES, report.sites):
        if line.status == "patched":
            wrapper = current(pp, site)
            assert getattr(wrapper, MARKER) and "Why this seam" in wrapper.__doc__
            assert wrapper.__wrapped__ is not None or site.adds
        else:
            assert line.status == "absent in this release" and current(pp, site) is None
    import deepspeed
    assert report.deepspeed_version == deepspeed.__version__ and deepspeed.__version__ in str(report)


def test_idempotent_and_exactly_undone(pp):
    before = {s.name: current(pp, s) for s in sites.SITES}
    first = deepspeed_zeropp.patch()
    wrappers = {s.name: current(pp, s) for s in sites.SITES}
    second = deepspeed_zeropp.patch(backend="torch")
    assert {s.name: current(pp, s) for s in sites.SITES} == wrappers
    assert first.patched == second.patched and second.backend == "torch"
    deepspeed_zeropp.unpatch()
    assert {s.name: current(pp, s) for s in sites.SITES} == before
    deepspeed_zeropp.unpatch()  # harmless when nothing is patched


def test_strict_names_missing_site_and_version(pp, monkeypatch):
    import deepspeed
    ghost = sites.Site("AllGatherHandle", "no_such_method", lambda original: original, "test")
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (ghost, ))
    with pytest.raises(PatchError, match=rf"AllGatherHandle\.no_such_method.*DeepSpeed {deepspeed.__version__}"):
        deepspeed_zeropp.patch(strict=True)
    deepspeed_zeropp.unpatch()
    with pytest.warns(UserWarning, match="no_such_method"):
        report = deepspeed_zeropp.patch(strict=False)
    assert report.sites[-1].status == "missing (not patched)"


def test_version_outside_supported_range(pp, monkeypatch):
    import deepspeed
    monkeypatch.setattr(deepspeed, "__version__", "0.9.0")
    with pytest.raises(PatchError, match=r"0\.9\.0 is older than the oldest release"):
        deepspeed_zeropp.patch()
    monkeypatch.setattr(deepspeed, "__version__", "9.0.0")
    with pytest.warns(UserWarning, match=r"9\.0\.0 is newer than the newest release"):
        deepspeed_zeropp.patch(strict=False)


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="unknown backend 'gpu'.*auto, torch, cuda, deepspeed"):
        deepspeed_zeropp.patch(backend="gpu")


def test_patched_quantizer_keeps_dtype_and_builds_nothing(pp):
    deepspeed_zeropp.patch()
    quantizer = pp.CUDAQuantizer()  # unpatched, this loads the CUDA op and fails on CPU
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(257, dtype=dtype)
        codes, scales = quantizer.quantize(x)
        assert codes.dtype == torch.int8 and scales.dim() == 1
        assert quantizer.dequantize(codes, scales, dtype=dtype).dtype == dtype
        assert quantizer.dequantize(codes, scales).dtype == torch.float16  # upstream's default


def test_lean_import():
    code = ("import sys, deepspeed_zeropp; heavy = {'torch', 'deepspeed'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)
