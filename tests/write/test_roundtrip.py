"""Writer -> tar + index -> readers, and other tools reading what the writer wrote."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import tarindex
from tarindex.format.index import decode_index
from tests.conftest import have

LONG_DIR = "d" * 120  # forces the ustar prefix split
NO_SLASH = "x" * 150  # a >100-byte basename: needs a pax path header
UNICODE = "données/éléphant_象"  # non-ASCII key


def write(pattern: str, samples: list[dict[str, object]], **kw: object) -> list[str]:
    with tarindex.ShardWriter(pattern, mtime=0, **kw) as w:  # type: ignore[arg-type]
        for s in samples:
            w.write(s)
    return w.paths


def test_many_shapes_roundtrip_byte_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arr = rng.standard_normal((3, 4)).astype(np.float32)
    img = Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8))
    samples: list[dict[str, object]] = [
        {"__key__": "empty", "bin": b""},
        {"__key__": "one", "bin": b"x"},
        {"__key__": "block", "bin": bytes(512)},
        {"__key__": "block1", "bin": bytes(513)},
        {"__key__": "big", "bin": rng.bytes(300_000)},
        {
            "__key__": "types",
            "txt": "héllo",
            "cls": 7,
            "json": {"a": [1, 2]},
            "npy": arr,
            "png": img,
        },
        {"__key__": f"{LONG_DIR}/long", "txt": "prefix"},
        {"__key__": NO_SLASH, "txt": "pax"},
        {"__key__": UNICODE, "txt": "unicode"},
        {"__key__": "multi", "seg.png": img, "a.b.c": b"abc"},
    ]
    paths = write(str(tmp_path / "s-%03d.tar"), samples, maxcount=4)
    assert len(paths) == 3
    ds = tarindex.ShardSet(str(tmp_path / "s-{000..002}.tar"))
    assert len(ds) == len(samples)
    for i, s in enumerate(samples):
        got = ds.sample(i)
        assert got["__key__"] == s["__key__"] and got["__index__"] == i
        want = {k: tarindex.codecs.encode_value(k, v) for k, v in s.items() if k != "__key__"}
        assert {k: v for k, v in got.items() if not k.startswith("__")} == want
    # decoded
    from tarindex.codecs.decode import ExtDecoder

    t = ExtDecoder("rgb8")(ds.sample(5))
    assert t["txt"] == "héllo" and t["cls"] == 7 and t["json"] == {"a": [1, 2]}
    np.testing.assert_array_equal(t["npy"], arr)
    np.testing.assert_array_equal(t["png"], np.asarray(img))
    assert ExtDecoder("l8")(ds.sample(5))["png"].shape == (6, 5)


def _all_names(samples: list[dict[str, object]]) -> dict[str, bytes]:
    return {
        f"{s['__key__']}.{k}": tarindex.codecs.encode_value(k, v)
        for s in samples
        for k, v in sorted(s.items())  # the writer sorts a sample's members, as webdataset's
        if k != "__key__"
    }


SAMPLES: list[dict[str, object]] = [
    {"__key__": "000", "txt": "a", "bin": bytes(range(256)) * 3},
    {"__key__": f"{LONG_DIR}/sub/k1", "txt": "long with prefix"},
    {"__key__": NO_SLASH, "txt": "long, needs pax"},
    {"__key__": UNICODE, "txt": "unicode name"},
    {"__key__": "z", "bin": b""},
]


def test_python_tarfile_reads_writer_output(tmp_path: Path) -> None:
    (p,) = write(str(tmp_path / "a.tar"), SAMPLES)
    with tarfile.open(p) as tf:
        got = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
    assert got == _all_names(SAMPLES)


@pytest.mark.parametrize("tool", ["tar", "bsdtar"])
def test_tar_tools_extract_writer_output(tmp_path: Path, tool: str) -> None:
    if not have(tool):
        pytest.skip(f"{tool} not installed (Debian: libarchive-tools provides bsdtar)")
    (p,) = write(str(tmp_path / "a.tar"), SAMPLES)
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run([tool, "-xf", p, "-C", str(out)], check=True, capture_output=True)
    for name, data in _all_names(SAMPLES).items():
        assert (out / name).read_bytes() == data, name
    # and the tool's listing is the member list, in order
    listing = subprocess.run([tool, "-tf", p], check=True, capture_output=True).stdout.decode()
    assert listing.splitlines() == list(_all_names(SAMPLES))


def test_webdataset_reads_writer_output(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    (p,) = write(str(tmp_path / "a.tar"), SAMPLES)
    got = {
        s["__key__"]: {k: v for k, v in s.items() if not k.startswith("__")}
        for s in wds.WebDataset(p, shardshuffle=False)
    }
    want = {
        s["__key__"]: {
            k: tarindex.codecs.encode_value(k, v) for k, v in s.items() if k != "__key__"
        }
        for s in SAMPLES
    }
    assert got == want


def test_writer_index_equals_rebuilt_index(tmp_path: Path) -> None:
    paths = write(str(tmp_path / "s-%02d.tar"), SAMPLES * 1, maxcount=2)
    for p in paths:
        written = decode_index(Path(p + ".tidx").read_bytes())
        rebuilt = tarindex.build_index(p, p + ".re")
        assert rebuilt.tables_bytes() == written.tables_bytes()
        assert (
            written.meta["producer"] == "tarindex.writer"
            and rebuilt.meta["producer"] == "tarindex.scan"
        )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["bin", "txt", "cls", "seg.bin", "x"]),
            st.binary(max_size=1500),
            min_size=1,
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 5),
)
def test_property_roundtrip_and_rebuild(
    tmp_path_factory: pytest.TempPathFactory, members: list[dict[str, bytes]], maxcount: int
) -> None:
    d = tmp_path_factory.mktemp("prop")
    samples: list[dict[str, object]] = [{"__key__": f"k{i}", **m} for i, m in enumerate(members)]
    paths = write(str(d / "p-%03d.tar"), samples, maxcount=maxcount)
    ss = tarindex.ShardSet(paths)
    assert len(ss) == len(samples)
    for i, s in enumerate(samples):
        got = ss.sample(i)
        assert {k: v for k, v in got.items() if not k.startswith("__")} == {
            k: v for k, v in s.items() if k != "__key__"
        }
    for p in paths:
        assert (
            tarindex.build_index(p, p + ".re").tables_bytes()
            == decode_index(Path(p + ".tidx").read_bytes()).tables_bytes()
        )


def test_maxsize_rolls_over(tmp_path: Path) -> None:
    samples: list[dict[str, object]] = [
        {"__key__": f"{i:03d}", "bin": bytes(4000)} for i in range(10)
    ]
    paths = write(str(tmp_path / "m-%02d.tar"), samples, maxsize=10_000)
    assert len(paths) > 3
    assert sum(tarindex.ShardReader(p).n_samples for p in paths) == 10


@pytest.mark.parametrize(
    "key, match",
    [
        ("a.b", "dot in its basename"),
        ("dir/x.y", "dot in its basename"),
        ("", "empty"),
        ("./a", "starts with"),
        ("a/", "ends with"),
    ],
)
def test_writer_refuses_bad_keys(tmp_path: Path, key: str, match: str) -> None:
    with pytest.raises(tarindex.errors.WriterError, match=match):
        with tarindex.ShardWriter(str(tmp_path / "k.tar")) as w:
            w.write({"__key__": key, "txt": "x"})
    assert not os.listdir(tmp_path)  # nothing that looks like a shard


def test_writer_refuses_repeated_key_and_bad_value(tmp_path: Path) -> None:
    with pytest.raises(tarindex.errors.WriterError, match="written twice"):
        with tarindex.ShardWriter(str(tmp_path / "k.tar")) as w:
            w.write({"__key__": "a", "txt": "x"})
            w.write({"__key__": "a", "txt": "y"})
    with pytest.raises(tarindex.errors.WriterError, match="cannot encode a object"):
        with tarindex.ShardWriter(str(tmp_path / "k.tar")) as w:
            w.write({"__key__": "a", "bin": object()})
    assert not os.listdir(tmp_path)


def test_exception_mid_shard_keeps_finished_shards_only(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with tarindex.ShardWriter(str(tmp_path / "w-%02d.tar"), maxcount=2) as w:
            for i in range(5):
                w.write({"__key__": f"{i}", "txt": "x"})
            raise RuntimeError("crash")
    assert sorted(os.listdir(tmp_path)) == [
        "w-00.tar",
        "w-00.tar.tidx",
        "w-01.tar",
        "w-01.tar.tidx",
    ]
    assert len(tarindex.ShardSet(str(tmp_path))) == 4


def test_key_rule_examples() -> None:
    from tarindex.format.keys import split_key

    assert split_key(b"a/22.05.png") == (b"a/22", b"05.png")
    assert split_key(b"./235342 Track 2.0.mp3") == (b"235342 Track 2", b"0.mp3")
    assert split_key(b"v1.2/img.seg.png") == (b"v1.2/img", b"seg.png")
    assert split_key(b"README") is None
    assert split_key(b"dir/.hidden") is None


def test_json_list_and_image_encoding(tmp_path: Path) -> None:
    img = Image.new("L", (3, 2), 7)
    (p,) = write(
        str(tmp_path / "j.tar"), [{"__key__": "a", "json": [1, "x"], "jpg": img.convert("RGB")}]
    )
    s = tarindex.ShardReader(p).sample(0)
    assert json.loads(s["json"]) == [1, "x"]
    assert Image.open(io.BytesIO(s["jpg"])).format == "JPEG"


def test_encoder_false_stores_compressed_values_as_they_are(tmp_path: Path) -> None:
    """Issue 19 item 5: ``encoder=False`` never compresses: a ``.zst``/``.gz`` value is the frame."""
    import gzip

    import zstandard

    frame = zstandard.ZstdCompressor().compress(b'{"a": 1}')
    gz = gzip.compress(b"hello", mtime=0)
    with tarindex.TarWriter(str(tmp_path / "raw.tar"), encoder=False) as w:
        w.write({"__key__": "z", "bin.zst": frame, "txt.gz": gz, "json.zst": frame})
    got = tarindex.ShardSet(str(tmp_path / "raw.tar")).sample(0)
    assert got["bin.zst"] == frame and got["json.zst"] == frame and got["txt.gz"] == gz
    dec = tarindex.codecs.decode.ExtDecoder()(got)
    assert dec["json"] == {"a": 1} and dec["txt.gz"] == "hello"  # .gz keeps its name (webdataset)

    # a compressed shard copied raw, sample by sample, keeps every member's bytes
    src = write(
        str(tmp_path / "src-%d.tar"),
        [{"__key__": f"{i:03d}", "json": {"i": i}, "cls": i} for i in range(20)],
        compress=("json",),
    )
    ss = tarindex.ShardSet(src)
    with tarindex.ShardWriter(str(tmp_path / "copy-%d.tar"), encoder=False, mtime=0) as w:
        for i in range(len(ss)):
            w.write(ss.sample(i))
    copy = tarindex.ShardSet(w.paths)
    for i in range(len(ss)):
        a, b = ss.sample(i), copy.sample(i)
        assert a["json.zst"] == b["json.zst"] and a["cls"] == b["cls"]
        assert tarindex.codecs.decode.ExtDecoder()(b)["json"] == {"i": i}

    # a frame made with a shard's dictionary cannot go into a shard that has none: refused
    dsrc = write(
        str(tmp_path / "dict-%d.tar"),
        [
            {"__key__": f"{i:03d}", "json": {"caption": f"caption number {i} " * 4}}
            for i in range(64)
        ],
        compress=("json",),
        zstd_dict=True,
    )
    framed = tarindex.ShardSet(dsrc).sample(0)
    with tarindex.ShardWriter(str(tmp_path / "dcopy-%d.tar"), encoder=False) as w:
        with pytest.raises(tarindex.errors.WriterError, match="compressed with dictionary .* never be"):
            w.write(framed)
        w.write({"__key__": "ok", "bin.zst": b"not a frame: stored as given"})

    # compressing and "as they are" contradict each other: refused before anything is written
    kws: list[dict[str, Any]] = [{"compress": ("json",)}, {"compress": True}, {"zstd_dict": True}]
    for kw in kws:
        with pytest.raises(tarindex.errors.WriterError, match="with encoder=False"):
            tarindex.ShardWriter(str(tmp_path / "no-%d.tar"), encoder=False, **kw)
    assert not list(tmp_path.glob("no-*"))
