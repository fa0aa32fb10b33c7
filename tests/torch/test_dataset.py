"""TarDataset (map-style) with a real DataLoader and worker processes."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

import tarindex  # noqa: E402
from tests.conftest import MakeShards  # noqa: E402


def test_len_getitem_negative_and_out_of_range(make_shards: MakeShards) -> None:
    paths = make_shards([5, 0, 7, 3])
    ds = tarindex.TarDataset(paths)
    assert len(ds) == 15
    s = ds[6]
    assert s["__key__"] == "00000006" and s["__index__"] == 6 and s["__shard__"] == paths[2]
    assert s["txt"] == b"sample 6" and s["cls"] == b"6"
    assert ds[-1]["__key__"] == "00000014" and ds[-15]["__key__"] == "00000000"
    for bad in (15, -16, 10**9):
        with pytest.raises(IndexError):
            ds[bad]


def test_sources_forms(make_shards: MakeShards) -> None:
    paths = make_shards([2, 3, 4])
    d = str(Path(paths[0]).parent)
    forms = [paths, d, d + "/train-*.tar", d + "/train-{000000..000002}.tar", paths[1]]
    lens = [len(tarindex.TarDataset(f)) for f in forms]
    assert lens == [9, 9, 9, 9, 3]
    with pytest.raises(FileNotFoundError, match="no shard matches"):
        tarindex.TarDataset(d + "/nothing-*.tar")


def test_decode_and_transform(make_shards: MakeShards) -> None:
    paths = make_shards([4])
    ds = tarindex.TarDataset(paths, decode="pil", transform=lambda s: (s["cls"], s["txt"]))
    assert ds[3] == (3, "sample 3")
    with pytest.raises(ValueError, match="decode="):
        tarindex.TarDataset(paths, decode="bogus")


def test_pickle_is_small_and_drops_handles(make_shards: MakeShards) -> None:
    paths = make_shards([50] * 20)
    ds = tarindex.TarDataset(paths)
    for i in range(0, 1000, 37):
        ds[i]
    assert len(ds.shards._readers) == 20
    blob = pickle.dumps(ds)
    named = sum(3 * len(p) + 5 for p in map(str, paths))  # each tar path twice, its index once
    assert len(blob) < named + 3000  # paths and counts, nothing per sample
    ds2 = pickle.loads(blob)
    assert ds2.shards._readers == {} and ds2[999]["__key__"] == "00000999"


def test_open_shard_bound(make_shards: MakeShards) -> None:
    paths = make_shards([3] * 10)
    ds = tarindex.TarDataset(paths, options=tarindex.OpenOptions(max_open=2))
    for i in range(len(ds)):
        assert ds[i]["__key__"] == f"{i:08d}"
        assert len(ds.shards._readers) <= 2


def _keys(loader: DataLoader[Any]) -> list[str]:
    return [k for batch in loader for k in batch["__key__"]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_dataloader_exactly_once(make_shards: MakeShards, ctx: str) -> None:
    paths = make_shards([40, 13, 27])
    ds = tarindex.TarDataset(paths)
    ds[5]  # read in the parent first: open handles must not leak into workers
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=ctx,
        generator=torch.Generator().manual_seed(0),
    )
    keys = _keys(loader)
    assert sorted(keys) == [f"{i:08d}" for i in range(80)]
    assert keys != sorted(keys)  # actually shuffled


def test_stale_index_raises_on_read(make_shards: MakeShards) -> None:
    (p,) = make_shards([3])
    ds = tarindex.TarDataset(p)
    with open(p, "ab") as f:
        f.write(bytes(10240))
    with pytest.raises(tarindex.StaleIndexError, match="appended"):
        ds[0]


def test_truncated_tar_refused_by_build_index(make_shards: MakeShards, tmp_path: Path) -> None:
    (p,) = make_shards([5])
    data = Path(p).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(tarindex.errors.TruncatedError, match=rf"{cut}: byte \d+"):
        tarindex.build_index(cut)
    assert not Path(str(cut) + ".tidx").exists()


def test_import_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch hidden for this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import tarindex, tarindex.cli.main\n"
        "assert 'torch' not in sys.modules\n"
        "with tarindex.ShardWriter(sys.argv[1] + '/a.tar') as w:\n"
        "    w.write({'__key__': 'k', 'txt': 'v'})\n"
        "assert tarindex.ShardSet(sys.argv[1] + '/a.tar').sample(0)['txt'] == b'v'\n"
        "try:\n"
        "    tarindex.TarDataset\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _child_reads(ds: tarindex.TarDataset, q: mp.Queue[object]) -> None:
    ds[0]
    q.put([getattr(r, "opened_in", "child") for r in ds.shards._readers.values()])


@pytest.mark.timeout(60)
def test_forked_child_opens_its_own_readers(make_shards: MakeShards) -> None:
    """A ShardSet inherited through fork drops the parent's readers (mmaps, fds) and reopens."""
    ds = tarindex.TarDataset(make_shards([3, 3]))
    ds[0], ds[4]
    for r in ds.shards._readers.values():
        r.opened_in = "parent"
    ctx = mp.get_context("fork")
    q: mp.Queue[object] = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(ds, q))
    p.start()
    got = q.get(timeout=30)
    p.join(30)
    assert got == ["child"]  # only shard 0, opened anew in the child
    assert [getattr(r, "opened_in", None) for r in ds.shards._readers.values()] == ["parent"] * 2
