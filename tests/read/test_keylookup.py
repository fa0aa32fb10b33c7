"""Key lookup (FORMAT.md §2.8.3, §8): the key hash, the KHSH key table, find_key, index_of, cat."""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tarindex
from tarindex.cli.main import main
from tarindex.errors import AmbiguousKeyError, ChecksumError, FormatError, KeyNotFoundError
from tarindex.format.index import IndexTables, decode_index, encode_index
from tarindex.format.keyhash import key_hash, key_hashes
from tarindex.format.keytable import check_key_table, key_table
from tarindex.format.spec import FOOTER, TAG_KEY_HASH

GOLDEN = Path(__file__).parents[1] / "golden"

M64 = (1 << 64) - 1


def spec_hash(key: bytes, seed: int) -> int:
    """FORMAT.md §8 written out again from the text, independently of tarindex.format.keyhash."""
    h = 14695981039346656037
    for byte in seed.to_bytes(8, "little") + key:
        h = ((h ^ byte) * 1099511628211) % 2**64
    for shift, mul in ((33, 0xFF51AFD7ED558CCD), (33, 0xC4CEB9FE1A85EC53)):
        h ^= h >> shift
        h = (h * mul) % 2**64
    return h ^ (h >> 33)


def test_key_hash_follows_the_spec_scalar_and_vectorised() -> None:
    rng = np.random.default_rng(0)
    keys = [b"", b"a", b"000001", "ключ/é".encode(), b"\xff\xfe\x00x", b"k" * 300]
    keys += [
        rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8).tobytes() for _ in range(500)
    ]
    blob = b"".join(keys)
    ptr = np.cumsum([0] + [len(k) for k in keys])
    for seed in (0, 1, 2**63 + 5, M64):
        want = [spec_hash(k, seed) for k in keys]
        assert [key_hash(k, seed) for k in keys] == want
        assert key_hashes(blob, ptr, seed).tolist() == want
    same = [f"{i:08d}".encode() for i in range(1000)]  # one length: the ungrouped path
    assert key_hashes(b"".join(same), np.arange(0, 8001, 8), 7).tolist() == [
        spec_hash(k, 7) for k in same
    ]
    assert len({key_hash(b"x", s) for s in range(100)}) == 100  # the seed matters
    with pytest.raises(ValueError, match="seed"):
        key_hash(b"x", -1)


def write_shards(root: Path, n: int, per: int, key: Any = None, name: str = "s") -> list[str]:
    key = key or (lambda i: f"{i:08d}")
    with tarindex.ShardWriter(str(root / f"{name}-%06d.tar"), maxcount=per, durable=False) as w:
        for i in range(n):
            w.write({"__key__": key(i), "cls": i, "txt": f"t{i}"})
    return list(w.paths)


def test_find_key_in_a_shard_with_and_without_the_record(tmp_path: Path) -> None:
    keys = [f"dir{i % 7}/{(i * 7919) % 5000:05d}" for i in range(5000)]
    (p,) = write_shards(tmp_path, 5000, 5000, keys.__getitem__)
    with tarindex.ShardReader(p) as r:
        assert r.index.key_hash is not None  # the writer's index has the key table (1.2)
        assert [r.find_key(k) for k in keys[::37]] == list(range(0, 5000, 37))
        assert r.find_key("./" + keys[5]) == 5  # FORMAT.md §4 normalisation, as before
        assert r.find_key("dir0/99999") is None and r.find_key("") is None
        assert r.find_key(keys[3][:-1]) is None  # a prefix of a key is not the key
    # the same shard with a format 1.1 index (no KHSH): the table is computed, same answers
    raw = Path(p + ".tidx").read_bytes()
    Path(p + ".tidx").write_bytes(encode_index(decode_index(raw), key_table=False))
    with tarindex.ShardReader(p) as r:
        assert r.index.key_hash is None
        assert [r.find_key(k) for k in keys[::37]] == list(range(0, 5000, 37))
        assert r.find_key("dir0/99999") is None


def test_golden_indexes_of_every_version_look_keys_up(tmp_path: Path) -> None:
    for v in ("v1", "v1.1", "v1.2", "v1.3"):
        d = tmp_path / v
        shutil.copytree(GOLDEN / v, d)
        with tarindex.ShardReader(str(d / "tiny.tar")) as r:
            assert (r.index.key_hash is not None) == (v in ("v1.2", "v1.3"))
            for j in range(r.n_samples):
                assert r.find_key(r.key(j)) == j
            assert r.find_key("s999") is None


def test_colliding_hashes_are_told_apart_by_the_key_bytes(tmp_path: Path) -> None:
    # find two keys whose 32-bit table hashes collide (birthday: ~5 pairs in 400k keys)
    cand = [f"k{i}".encode() for i in range(400_000)]
    h = key_hashes(b"".join(cand), np.cumsum([0] + [len(k) for k in cand])) >> np.uint64(32)
    order = np.argsort(h, kind="stable")
    at = int(np.flatnonzero(h[order][1:] == h[order][:-1])[0])
    a, b = cand[int(order[at])].decode(), cand[int(order[at + 1])].decode()
    keys = [f"x{i}" for i in range(50)] + [a] + [f"y{i}" for i in range(50)] + [b]
    (p,) = write_shards(tmp_path, len(keys), 1000, keys.__getitem__)
    with tarindex.ShardReader(p) as r:
        assert len(r.key_table().candidates(a.encode())) == 2
        assert r.find_key(a) == 50 and r.find_key(b) == 101


def test_key_lookup_over_a_million_samples() -> None:
    """1M keys in one index: the table from the record and the computed one find every key."""
    n = 1_000_000
    perm = np.random.default_rng(1).permutation(n)
    keys = [f"c{p % 13}/{p:07d}" for p in perm.tolist()]
    blob = "".join(keys).encode()
    kptr = np.zeros(n + 1, np.uint64)
    np.cumsum([len(k) for k in keys], out=kptr[1:])
    t = IndexTables(
        sample_ptr=np.arange(n + 1, dtype=np.uint64),
        offset=np.arange(1, n + 1, dtype=np.uint64) * np.uint64(1024),
        size=np.ones(n, np.uint64),
        ext_id=np.zeros(n, np.uint32),
        key_ptr=kptr,
        key_blob=blob,
        exts=[b"cls"],
        tar_size=(n + 2) * 1024,
        head_crc=0,
        tail_crc=0,
    )
    t0 = time.perf_counter()
    with_rec = decode_index(encode_index(t), check_crc=True)
    old = decode_index(encode_index(t, key_table=False))
    assert with_rec.key_hash is not None and old.key_hash is None
    check_key_table(with_rec)  # the record equals the table computed from the keys
    rng = np.random.default_rng(2)
    probe = rng.integers(0, n, 2000).tolist()
    for dec in (with_rec, old):
        kt = key_table(dec)
        kp, kb = dec.key_ptr, bytes(dec.key_blob)
        for j in probe:
            k = keys[j].encode()
            hits = [c for c in kt.candidates(k) if kb[kp[c] : kp[c + 1]] == k]
            assert hits == [j]
        for j in probe[:200]:  # absent keys: no candidate survives the byte comparison
            k = f"c{j % 13}/{n + j:07d}".encode()
            assert [c for c in kt.candidates(k) if kb[kp[c] : kp[c + 1]] == k] == []
    assert time.perf_counter() - t0 < 60  # a hang guard, not a benchmark


def test_a_corrupt_key_table_is_refused(tmp_path: Path) -> None:
    (p,) = write_shards(tmp_path, 300, 1000)
    ip = Path(p + ".tidx")
    raw = bytearray(ip.read_bytes())
    at = raw.find(TAG_KEY_HASH)
    assert at > 0
    data = at + 16
    struct.pack_into("<I", raw, data + 4 * 300 + 8, 10**6)  # a sample number past the shard
    ip.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError):  # the index crc32 covers the record
        tarindex.ShardReader(p)
    import zlib

    struct.pack_into("<I", raw, len(raw) - FOOTER.size, zlib.crc32(raw[: -FOOTER.size]))
    ip.write_bytes(bytes(raw))
    with tarindex.ShardReader(p) as r:
        assert r.sample(3)["__key__"] == "00000003"  # reads by number do not need the table
        with pytest.raises(FormatError, match="KHSH"):
            r.find_key("00000003")
    with pytest.raises(FormatError, match="KHSH"):
        tarindex.ShardReader(p, full_check=True)  # verify's check: record vs keys


def test_shardset_and_dataset_index_of_get_and_duplicates(tmp_path: Path) -> None:
    a = write_shards(tmp_path, 250, 100, name="a")  # keys 00000000..00000249
    b = write_shards(tmp_path, 30, 100, lambda i: f"{i * 10:08d}", name="b")  # 0, 10, .. 290
    ss = tarindex.ShardSet(a + b)
    assert ss.index_of("00000123") == 123
    assert ss.indices_of("00000260") == [250 + 26]
    assert ss.indices_of("00000020") == [20, 252]
    with pytest.raises(AmbiguousKeyError, match=r"00000020.*a-000000\.tar.*b-000000\.tar"):
        ss.index_of("00000020")
    with pytest.raises(KeyNotFoundError, match="no sample with key 'zz'") as e:
        ss.index_of("zz")
    assert isinstance(e.value, KeyError)
    got = ss.index_of_many(["00000123", "zz", "00000260", "./00000007", "00000000x"])
    assert got.tolist() == [123, -1, 276, 7, -1]
    with pytest.raises(AmbiguousKeyError, match="00000020"):
        ss.index_of_many(["00000001", "00000020"])
    want = [i for i in range(0, 250, 3) if i % 10]  # b holds the multiples of 10
    assert ss.index_of_many([f"{i:08d}" for i in want]).tolist() == want
    assert ss.index_of_many([]).tolist() == []
    one = tarindex.ShardSet(a[1])
    assert one.index_of_many(["00000150", "00000050"]).tolist() == [50, -1]
    assert one.index_of("00000150") == 50 and one.indices_of("00000050") == []
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(a, decode=True)
    assert ds.index_of("00000201") == 201
    got = ds.get("00000201")
    assert got["__key__"] == "00000201" and got["cls"] == 201 and got["txt"] == "t201"
    with pytest.raises(KeyError):
        ds.get("nope")
    import pickle

    ds2 = pickle.loads(pickle.dumps(ds))  # the joined table stays behind (per process)
    assert "_keyidx" not in ds2.shards.__dict__ and ds2.index_of("00000007") == 7


def test_get_is_a_key_lookup_everywhere_and_sample_reads_an_index(tmp_path: Path) -> None:
    """Issue 18: ``get(key)`` looks a key up on every reader of samples; ``sample(i)`` reads
    index ``i``. An index passed to ``get`` (the old ``ShardSet.get(i)``) is a TypeError that
    names ``sample(i)``, never a silent read of another sample."""
    paths = write_shards(tmp_path, 250, 100)
    ss = tarindex.ShardSet(paths)
    got = ss.get("00000123", ("cls",))
    assert got == ss.sample(123, ("cls",)) and got["__index__"] == 123
    assert ss.get("./00000007")["__key__"] == "00000007"  # the key rule of index_of
    sub = tarindex.read.subset.ShardSubset(ss, [5, 123, 200])
    assert sub.get("00000200")["__index__"] == 200 == sub.sample(2)["__index__"]
    with pytest.raises(KeyNotFoundError):
        sub.get("00000006")  # in the dataset, not in the view
    for src in (ss, sub):
        for bad in (3, np.int64(3), b"00000003", None):
            with pytest.raises(TypeError, match=r"sample\(i\)"):
                src.get(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"sample\(i\)"):
            src.index_of(3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"sample\(i\)"):
            src.index_of_many(["00000001", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"sample\(i\)"):
        ss.reader(0).find_key(3)  # type: ignore[arg-type]
    pytest.importorskip("torch")
    ds = tarindex.TarDataset(paths)
    assert ds.get("00000042") == ds[42]
    with pytest.raises(TypeError, match=r"sample\(i\)"):
        ds.get(42)


def cli(capsysbinary: pytest.CaptureFixture[bytes], *argv: str) -> tuple[int, bytes, str]:
    code = main(list(argv))
    got = capsysbinary.readouterr()
    return code, got.out, got.err.decode()


def test_cat_by_key_uses_the_lookup(
    tmp_path: Path, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    cap = capsysbinary
    a = write_shards(tmp_path, 250, 100, name="a")
    write_shards(tmp_path, 30, 100, lambda i: f"{i * 10:08d}", name="b")
    assert cli(cap, "cat", str(tmp_path / "a-*.tar"), "00000142", "txt")[:2] == (0, b"t142")
    assert cli(cap, "cat", a[2], "00000242", "cls")[:2] == (0, b"242")
    code, _, err = cli(cap, "cat", str(tmp_path / "*.tar"), "00000020", "txt", "--key")
    assert code == 1 and "a-000000.tar" in err and "b-000000.tar" in err
    code, _, err = cli(cap, "cat", str(tmp_path / "a-*.tar"), "nokey", "txt", "--key")
    assert code == 1 and "no sample with key 'nokey'" in err
    assert cli(cap, "cat", str(tmp_path / "a-*.tar"), "7", "txt")[:2] == (0, b"t7")  # an index
