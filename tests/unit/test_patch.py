"""patch() / unpatch(): every site wrapped and marked, idempotent, exactly undone, loud when a seam is missing."""
import subprocess
import sys

import pytest
import torch

import deepspeed_zeropp
from deepspeed_zeropp.patching import PatchError, sites
from deepspeed_zeropp.patching.seams.common import MARKER


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
    ghost = sites.Site("AllGatherHandle", "no_such_method", lambda original: original)
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


def _broken_site(name="no_such_method"):
    return sites.Site("AllGatherHandle", name, lambda original: original)


def test_failed_patch_changes_nothing(pp, monkeypatch):
    """All or nothing: a missing site (or any error) after others were replaced restores them all and keeps the
    backend; after a successful patch a failed second call leaves that patch as it was."""
    from deepspeed_zeropp import backends
    before = {s.name: current(pp, s) for s in sites.SITES}

    def explode(original):
        raise RuntimeError("factory failed")

    for extra in (_broken_site(), sites.Site("AllGatherHandle", "__init__", explode)):
        monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (extra, ))
        with pytest.raises((PatchError, RuntimeError)):
            deepspeed_zeropp.patch(backend="torch")
        assert {s.name: current(pp, s) for s in sites.SITES} == before and backends.default() == "auto"
        monkeypatch.undo()
    deepspeed_zeropp.patch(backend="torch")
    wrappers = {s.name: current(pp, s) for s in sites.SITES}
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (_broken_site(), ))
    with pytest.raises(PatchError):
        deepspeed_zeropp.patch(backend="auto")
    assert {s.name: current(pp, s) for s in sites.SITES} == wrappers and backends.default() == "torch"
    monkeypatch.undo()
    assert deepspeed_zeropp.patch(backend="torch").patched and {
        s.name: current(pp, s)
        for s in sites.SITES
    } == wrappers


def _python(code, **env):
    """Run ``code`` in a fresh interpreter, as the installed .pth would start it (the package from this checkout)."""
    import os
    from pathlib import Path
    root = str(Path(__file__).resolve().parents[2])
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEEPSPEED_ZEROPP")}
    environ.update(env, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    pth = (Path(root) / "deepspeed_zeropp.pth").read_text()
    return subprocess.run([sys.executable, "-c", f"{pth}\n{code}"], env=environ, capture_output=True, text=True)


def test_activation_that_cannot_patch_fails_every_deepspeed_import():
    code = ("for attempt in range(2):\n"
            "    try:\n"
            "        import deepspeed\n"
            "        print('imported unpatched')\n"
            "    except RuntimeError as error:\n"
            "        print('refused:', error)\n")
    proc = _python(code, DEEPSPEED_ZEROPP="1", DEEPSPEED_ZEROPP_BACKEND="bogus")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("refused", "imported"))]
    assert len(lines) == 2 and all("unknown backend 'bogus'" in line for line in lines), proc.stdout + proc.stderr


def test_unrecognised_activation_value_warns_once_and_imports_nothing_when_unset():
    probe = "import sys; print(sorted(m for m in sys.modules if m.startswith('deepspeed')))"
    garbage = _python(probe, DEEPSPEED_ZEROPP="garbage")
    assert garbage.stderr.count("DEEPSPEED_ZEROPP='garbage' is not understood") == 1, garbage.stderr
    assert "1, true, yes, on" in garbage.stderr and "deepspeed_zeropp._autoactivate" in garbage.stdout
    unset = _python(probe)
    assert unset.stdout.strip() == "[]" and unset.stderr == "", unset.stdout + unset.stderr
