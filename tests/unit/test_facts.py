"""Facts stated in several files agree with their one source: the DeepSpeed range and release facts of
``patching/sites.py`` (README, requirements, the compatibility run's releases, doctor), qgZ's wire constants
(``formats/int4.py`` and ``csrc/wire_formats.h``), the agreement check's default bound (``agreement.py``), site names
(``patching/sites.py``) and the version (``_version.py``)."""
import re
import sys
from pathlib import Path

import pytest

import deepspeed_zeropp
from deepspeed_zeropp import _env, _version, agreement, doctor
from deepspeed_zeropp.formats import int4
from deepspeed_zeropp.patching import sites
from deepspeed_zeropp.patching.seams import partitions

ROOT = Path(__file__).resolve().parents[2]


def text(path):
    return (ROOT / path).read_text()


def test_readme_states_the_supported_range_and_release_facts():
    readme = text("README.md")
    assert f"{sites.OLDEST_SUPPORTED} to {sites.NEWEST_KNOWN}" in readme
    assert f"DeepSpeed {sites.OLDEST_SUPPORTED} or newer" in readme
    assert f"DeepSpeed {sites.UPSTREAM_DTYPE_FIX} (" in readme  # the release that added upstream's fp16 detour
    assert f"{sites.LOCO_SINCE}–{sites.LOCO_UNTIL}" in readme


def test_readme_states_the_agreement_bound():
    assert f"`{_env.AGREEMENT_TIMEOUT_ENV}` seconds (default {agreement.TIMEOUT:g})" in text("README.md")


def test_requirements_and_compat_releases_match_the_supported_range():
    assert re.findall(r"^deepspeed>=(\S+)$", text("requirements/deepspeed.txt"), re.M) == [sites.OLDEST_SUPPORTED]
    assert re.findall(r"^deepspeed==(\S+)$", text("requirements/ci.txt"), re.M) == [sites.NEWEST_KNOWN]
    releases = [line.strip() for line in text("tests/compat/versions.txt").splitlines() if line[:1].isdigit()]
    assert releases[0] == sites.OLDEST_SUPPORTED and releases[-1] == sites.NEWEST_KNOWN


@pytest.mark.parametrize("installed, expected", [(None, "deepspeed>={oldest}"), ("0.14.3", "older than the oldest"),
                                                 ("99.0.0", "newer than the newest release tested ({newest})"),
                                                 ("{fix_before}", "has the dtype bug"),
                                                 ("{fix}", "casts bf16/fp32 through fp16")])
def test_doctor_reads_the_facts_from_the_site_table(monkeypatch, installed, expected):
    facts = {"oldest": sites.OLDEST_SUPPORTED, "newest": sites.NEWEST_KNOWN, "fix": sites.UPSTREAM_DTYPE_FIX}
    major, minor, micro = sites.UPSTREAM_DTYPE_FIX.split(".")
    facts["fix_before"] = f"{major}.{minor}.{int(micro) - 1}"
    monkeypatch.setattr(doctor, "_version", lambda package: installed and installed.format(**facts))
    # Stop after the version lines: "--backend" check ends the generator before patching.
    lines = [message for _, message in doctor.checks(backend="no-such-backend")]
    assert any(expected.format(**facts) in line for line in lines), lines


def test_qgz_constants_agree_with_the_kernels_header():
    header = text("csrc/wire_formats.h")

    def constant(name):
        return re.search(rf"constexpr \w+ {name} = ([^;]+);", header).group(1)

    assert int(constant("kGroup")) == int4.GROUP
    assert int(constant("kLevels")) == int4.LEVELS
    assert float.fromhex(constant("kMinScale").rstrip("f")) == int4.MIN_SCALE
    assert int(constant("kScaleBytes")) == int4.SCALE_BYTES


def test_site_names_used_elsewhere_are_rows_of_the_table():
    rows = {site.name: site for site in sites.SITES}
    assert sites.FETCH_SITE in rows
    seam = sys.modules[rows[sites.FETCH_SITE].factory.__module__]
    assert seam.FETCH_SITE == sites.FETCH_SITE  # the seam's own copy of its row's name: sites.py imports the seams
    # the fetch protocol's copies of the rows it keeps packets by: the engine's forward and backward, the rewrite
    assert rows[seam.FORWARD_SITE].factory is seam.forward_pass
    assert rows[seam.BACKWARD_SITE].factory is seam.backward_pass
    assert rows[seam.REWRITE_SITE].factory is partitions.partition_param


def test_the_version_is_written_once():
    assert deepspeed_zeropp.__version__ == agreement.__version__ == _version.__version__
    pyproject = text("pyproject.toml")
    assert 'version = { attr = "deepspeed_zeropp._version.__version__" }' in pyproject
    assert re.search(r'^dynamic = \[.*"version"', pyproject, re.M) and not re.search(r'^version = "', pyproject, re.M)
