"""The resize of ImageDecode: compiled (``_resample.c``) and its numpy twin, against Pillow.

Both must give Pillow's ``Image.resize(size, BILINEAR, box=box)`` pixels bit for bit (Pillow 13's
rule; an older Pillow resizes horizontally first always, and differs by 1 at most), on any box
(whole or fractional), any sizes (shrinking and growing, 1-pixel sides, both pass orders), any
output strides (a CHW slot, flipped), and refuse the same bad arguments with the same message.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import pytest
from PIL import Image

from tarindex.codecs import _resample_py, resample
from tarindex.codecs.resample import resample_kernel

from ..photos import photo_jpegs

FNS: dict[str, Callable[..., None]] = {"twin": _resample_py.resample}
if resample.compiled is not None:
    FNS["compiled"] = resample.compiled.resample
EXACT = 0 if int(PIL.__version__.split(".")[0]) >= 13 else 1


Box = tuple[float, float, float, float]


def _pillow(src: np.ndarray[Any, Any], box: Box, h: int, w: int) -> Any:
    im = Image.fromarray(src[:, :, 0] if src.shape[2] == 1 else src)
    return np.asarray(im.resize((w, h), Image.Resampling.BILINEAR, box=box)).reshape(h, w, -1)


def _cases(seed: int, n: int) -> list[tuple[np.ndarray[Any, Any], Box, int, int]]:
    rng = np.random.default_rng(seed)
    sizes = [((1, 1), (1, 1)), ((1, 1), (9, 13)), ((300, 3), (1, 1)), ((3, 300), (2, 7))]
    sizes += [((90, 4), (3, 60)), ((4, 90), (60, 3))]  # the vertical-first order, and not
    sizes += [tuple(map(tuple, rng.integers(1, 160, (2, 2)))) for _ in range(n)]  # type: ignore[misc]
    out = []
    for k, ((h, w), (oh, ow)) in enumerate(sizes):
        nc = (1, 3)[k % 2]
        src = rng.integers(0, 256, (h, w, nc), dtype=np.uint8)
        if k % 3 == 0:  # smooth content too: rounding shows there
            src = np.cumsum(src, axis=1, dtype=np.uint8)
        box: Box = (0.0, 0.0, float(w), float(h))
        if k % 2:
            x0, y0 = rng.uniform(0, w * 0.9), rng.uniform(0, h * 0.9)
            box = (x0, y0, rng.uniform(x0 + 1e-3, w), rng.uniform(y0 + 1e-3, h))
        out.append((src, box, int(oh), int(ow)))
    return out


@pytest.mark.parametrize("name", sorted(FNS))
def test_pillows_pixels_on_any_box_and_size(name: str) -> None:
    fn = FNS[name]
    orders = set()
    for src, box, oh, ow in _cases(0, 150):
        got = np.empty((oh, ow, src.shape[2]), np.uint8)
        fn(src, *box, got)
        want = _pillow(src, box, oh, ow)
        diff = np.abs(got.astype(np.int16) - want.astype(np.int16)).max()
        assert diff <= EXACT, (src.shape, box, oh, ow)
        h, w = src.shape[:2]
        orders.add(oh < h and h - oh > 2 * (w - ow))
    assert orders == {True, False}  # both pass orders were taken


@pytest.mark.skipif(len(FNS) < 2, reason="tarindex.codecs._resample is not built")
def test_compiled_and_twin_agree_on_every_channel_count_and_stride() -> None:
    rng = np.random.default_rng(1)
    for src, box, oh, ow in _cases(2, 60):
        nc = int(rng.integers(1, 5))
        src = np.ascontiguousarray(np.repeat(src[:, :, :1], nc, axis=2))
        src[..., nc - 1] = rng.integers(0, 256, src.shape[:2])
        want = np.empty((oh, ow, nc), np.uint8)
        FNS["twin"](src, *box, want)
        chw = np.zeros((nc, oh, ow), np.uint8)  # a CHW slot, flipped: negative column stride
        FNS["compiled"](src, *box, chw.transpose(1, 2, 0)[:, ::-1])
        np.testing.assert_array_equal(chw.transpose(1, 2, 0)[:, ::-1], want)
        wide = np.zeros((src.shape[0], src.shape[1] + 5, nc), np.uint8)  # rows with a stride
        wide[:, 2 : 2 + src.shape[1]] = src
        got = np.empty((oh, ow, nc), np.uint8)
        FNS["compiled"](wide[:, 2 : 2 + src.shape[1]], *box, got)
        np.testing.assert_array_equal(got, want)


def test_a_photo_box_into_a_flipped_chw_slot() -> None:
    """What ImageDecode does: a fractional box of a decoded region into slot b of a batch."""
    pytest.importorskip("sklearn")
    img = np.asarray(Image.open(io.BytesIO(photo_jpegs(1, (512, 384))[0])).convert("RGB"))
    batch = np.zeros((2, 3, 224, 224), np.uint8)
    box = (10.5, 7.25, 371.5, 300.75)
    want = _pillow(img, box, 224, 224)
    for fn in FNS.values():
        batch[1] = 0
        fn(img, *box, batch[1].transpose(1, 2, 0)[:, ::-1])
        got = batch[1].transpose(1, 2, 0)[:, ::-1]
        assert np.abs(got.astype(np.int16) - want.astype(np.int16)).max() <= EXACT
        assert not batch[0].any()  # nothing written outside the slot
    out = np.empty((224, 224, 3), np.uint8)
    resample.resample(np.asfortranarray(img), box, out)  # the wrapper takes any strides
    assert np.abs(out.astype(np.int16) - want.astype(np.int16)).max() <= EXACT


@pytest.mark.parametrize("name", sorted(FNS))
def test_bad_arguments_are_refused_alike(name: str) -> None:
    fn = FNS[name]
    src = np.zeros((10, 20, 3), np.uint8)
    out = np.empty((4, 5, 3), np.uint8)
    for box in [(-1, 0, 5, 5), (0, 0, 21, 5), (5, 0, 5, 5), (0, 6, 5, 5), (0, 0, float("nan"), 5)]:
        with pytest.raises(ValueError, match=r"box \(.*\) is not inside the 20x10 image"):
            fn(src, *box, out)
    with pytest.raises(ValueError, match="uint8 arrays of 3 dimensions"):
        fn(src.astype(np.float32), 0, 0, 5, 5, out)
    with pytest.raises(ValueError, match="uint8 arrays of 3 dimensions"):
        fn(src[:, :, 0], 0, 0, 5, 5, out)
    with pytest.raises(ValueError, match="the same 1 to 4 channels"):
        fn(src, 0, 0, 5, 5, np.empty((4, 5, 2), np.uint8))
    with pytest.raises(ValueError, match="the same 1 to 4 channels"):
        fn(np.zeros((3, 3, 5), np.uint8), 0, 0, 3, 3, np.empty((2, 2, 5), np.uint8))
    with pytest.raises(ValueError, match="contiguous within a row"):
        fn(np.zeros((10, 40, 3), np.uint8)[:, ::2], 0, 0, 5, 5, out)
    ro = np.empty((4, 5, 3), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is not a writable array"):
        fn(src, 0, 0, 5, 5, ro)


def test_which_loops_run_is_introspectable() -> None:
    code = "from tarindex.codecs.resample import resample_kernel; print(resample_kernel())"
    env = {**os.environ, "TARINDEX_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "python (TARINDEX_PURE_PYTHON is set)", out.stderr
    if resample.compiled is not None:
        assert resample_kernel() == "compiled"
    else:
        assert resample_kernel().startswith("python (")


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_plain_c_path_matches_the_twin(tmp_path: Path) -> None:
    """The loops other compilers build (no vector extension), built here with -DTARINDEX_PLAIN_C."""
    src = Path(resample.__file__).with_name("_resample.c")
    inc = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(inc, "Python.h")):
        pytest.skip(f"no Python.h in {inc}")
    so = tmp_path / f"_resample{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = ["cc", "-shared", "-fPIC", "-O2", "-fwrapv", "-ffp-contract=off", "-DTARINDEX_PLAIN_C"]
    subprocess.run([*cmd, f"-I{inc}", str(src), "-o", str(so)], check=True)
    spec = importlib.util.spec_from_file_location("_resample", so)
    assert spec is not None and spec.loader is not None
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    rng = np.random.default_rng(3)
    for src_img, box, oh, ow in _cases(4, 80):
        nc = int(rng.integers(1, 5))
        img = np.ascontiguousarray(np.repeat(src_img[:, :, :1], nc, axis=2))
        img[..., nc - 1] = rng.integers(0, 256, img.shape[:2])
        got, want = np.empty((oh, ow, nc), np.uint8), np.empty((oh, ow, nc), np.uint8)
        plain.resample(img, *box, got)
        _resample_py.resample(img, *box, want)
        np.testing.assert_array_equal(got, want)
