"""tarindex/_extensions.py: the one rule that loads a compiled extension or says why not."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
from pathlib import Path

import pytest

from tarindex._extensions import load_extension
from tarindex.codecs import resample
from tarindex.read import kernel


@pytest.fixture
def not_pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TARINDEX_PURE_PYTHON", raising=False)


@pytest.mark.parametrize("value", ["1", "yes"])
def test_the_environment_asks_for_the_twins(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TARINDEX_PURE_PYTHON", value)
    got = load_extension("tarindex.read._kernel", "not built", "big-endian host")
    assert got == (None, "python (TARINDEX_PURE_PYTHON is set)")  # before the caller's own
    got = load_extension("tarindex.read._kernel", "not built", form="{}")
    assert got == (None, "TARINDEX_PURE_PYTHON is set")


@pytest.mark.usefixtures("not_pure")
def test_the_callers_condition_then_a_missing_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TARINDEX_PURE_PYTHON", "0")  # "0" asks for nothing
    got = load_extension("tarindex.read._kernel", "not built", "big-endian host")
    assert got == (None, "python (big-endian host)")
    got = load_extension("tarindex.read._not_there", "not built: use gcc", form="{}")
    assert got == (None, "not built: use gcc")


@pytest.mark.usefixtures("not_pure")
def test_a_damaged_build_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "extpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (pkg / f"_loops{suffix}").write_bytes(b"not an ELF file\0" * 8)  # a build cut short
    monkeypatch.syspath_prepend(str(tmp_path))
    mod, why = load_extension("extpkg._loops", "not built")
    assert mod is None
    assert why.startswith("python (extpkg._loops failed to load: "), why
    assert why.endswith("; reinstall it)"), why


@pytest.mark.usefixtures("not_pure")
def test_a_built_extension_loads() -> None:
    if kernel.compiled is None:
        pytest.skip(f"not built: {kernel.read_kernel()}")
    mod, why = load_extension("tarindex.read._kernel", "not built")
    assert (mod, why) == (kernel.compiled, "compiled")


def test_the_introspection_strings() -> None:
    """read_kernel(), resample_kernel() and the JPEG backend say the reason in their forms."""
    code = (
        "import tarindex, tarindex.codecs as c, tarindex.codecs.resample as r;"
        "print(tarindex.read_kernel()); print(r.resample_kernel()); print(c.image_backend())"
    )
    env = {"TARINDEX_PURE_PYTHON": "1", "TARINDEX_JPEG_BACKEND": "libjpeg"}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**_env(), **env}, capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    assert lines[:2] == ["python (TARINDEX_PURE_PYTHON is set)"] * 2, out.stderr
    assert lines[2].endswith("TARINDEX_PURE_PYTHON is set)"), lines
    if kernel.compiled is not None:
        assert kernel.read_kernel() == "compiled"
    if resample.compiled is not None:
        assert resample.resample_kernel() == "compiled"


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("TARINDEX_")}
