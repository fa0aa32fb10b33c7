"""tarindex against its peers, in one run: random access (per item, batches of 64, labels only),
DataLoader, streaming, index build, write, memory, scale, and the machine's physical limits.

    python benchmarks/run.py --quick     # ~2-3 minutes on 2 cores, 10k samples (~190 MB)
    python benchmarks/run.py             # full: 100k samples (~1.9 GB per format), ~12 min

Peers: loose files, tarfile, webdataset, wids, MDS, litdata, ratarmountcore, GNU tar, and the
record formats users pick instead of tar: ArrayRecord, Lance, tfrecord. One seeded dataset
(see benchmarks/common.py) is written in every contender's format under ``benchmarks/_data/``.
Each measurement runs in its own subprocess (so peak RSS is isolated and one contender's
failure cannot take the run down); a contender that cannot be imported or fails is reported
with the reason. Writes ``benchmarks/results/results-<mode>.{json,md,png}`` and prints the
table (``--update-readme``: also benchmarks/README.md's results and ``benchmarks/chart.png``).
Cache state: warm (every format was just written, and the machine has more RAM than the
data), so these are page-cache figures, not disk ones; random-access rows first make their
accesses once untimed (``WARM_S``), as the page cache does not hold every format at once.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import (  # noqa: E402
    Payloads,
    Result,
    Spec,
    children_peak_rss_mb,
    du_bytes,
    dump_json,
    dup_missing,
    key,
    label,
    now,
    peak_rss_mb,
    rss_anon_mb,
)

BATCH = 64
WORKERS = 2
WDS_BUFFER = 1000
MB = 1e6

# --------------------------------------------------------------------------------------------
# paths of each format


def fmt_dir(spec: Spec, fmt: str) -> str:
    return os.path.join(spec.root, fmt)


def tarindex_paths(spec: Spec) -> list[str]:
    return sorted(glob.glob(os.path.join(fmt_dir(spec, "tarindex"), "*.tar")))


def wds_paths(spec: Spec) -> list[str]:
    return sorted(glob.glob(os.path.join(fmt_dir(spec, "wds"), "*.tar")))


def ar_paths(spec: Spec) -> list[str]:
    return sorted(glob.glob(os.path.join(fmt_dir(spec, "arrayrecord"), "*.array_record")))


def tfr_paths(spec: Spec) -> list[str]:
    return sorted(glob.glob(os.path.join(fmt_dir(spec, "tfrecord"), "*.tfrecord")))


# ArrayRecord stores one opaque bytes record per sample: the same sample framed as
# key (8 ASCII bytes) + cls (uint32 little-endian) + payload. Reading it back (``_unrec``) is
# part of every ArrayRecord row: the payload is a memoryview of the record (no second copy).
REC_HEAD = 12


def _rec(P: Payloads, i: int) -> bytes:
    return key(i).encode() + label(i).to_bytes(4, "little") + P.payload(i)


def _unrec(rec: bytes) -> tuple[bytes, int, memoryview]:
    mv = memoryview(rec)
    return rec[:8], int.from_bytes(mv[8:12], "little"), mv[REC_HEAD:]


def _stub_torchvision() -> None:
    """MDS imports torchvision at ``import streaming`` (for streaming.vision only).

    PyPI's torchvision wheel fails to import beside the CPU torch wheel this project pins
    ("operator torchvision::nms does not exist"); MDS's StreamingDataset and MDSWriter do not
    use it, so a stub module lets them import. Reported in the table notes.
    """
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        pass
    import types

    for name in list(sys.modules):
        if name == "torchvision" or name.startswith("torchvision."):
            del sys.modules[name]
    tv = types.ModuleType("torchvision")
    ds = types.ModuleType("torchvision.datasets")
    tr = types.ModuleType("torchvision.transforms")
    fn = types.ModuleType("torchvision.transforms.functional")

    class VisionDataset:  # noqa: D401 - stub
        pass

    ds.VisionDataset = VisionDataset  # type: ignore[attr-defined]
    ds.CIFAR10 = VisionDataset  # type: ignore[attr-defined]
    fn.to_tensor = lambda x: x  # type: ignore[attr-defined]
    tv.datasets, tv.transforms, tr.functional = ds, tr, fn  # type: ignore[attr-defined]
    import importlib.machinery

    for m in (tv, ds, tr, fn):
        m.__spec__ = importlib.machinery.ModuleSpec(m.__name__, None)
    tv.__version__ = "0.0-stub"  # type: ignore[attr-defined]
    sys.modules.update({"torchvision": tv, "torchvision.datasets": ds,
                        "torchvision.transforms": tr, "torchvision.transforms.functional": fn})
    os.environ["TARINDEX_BENCH_TV_STUB"] = "1"


def import_streaming() -> Any:
    _stub_torchvision()
    import streaming

    return streaming


# --------------------------------------------------------------------------------------------
# writers: each writes the whole dataset, returns extra info


def write_tarindex(spec: Spec, P: Payloads) -> dict[str, Any]:
    import tarindex

    with tarindex.ShardWriter(os.path.join(fmt_dir(spec, "tarindex"), "ti-%06d.tar"),
                              maxcount=spec.per_shard, mtime=0) as w:
        for i in range(spec.n):
            w.write(P.sample(i))
    return {}


def write_loose(spec: Spec, P: Payloads) -> dict[str, Any]:
    d = fmt_dir(spec, "loose")
    os.makedirs(d, exist_ok=True)
    for i in range(spec.n):
        k = key(i)
        with open(os.path.join(d, k + ".bin"), "wb") as f:
            f.write(P.payload(i))
        with open(os.path.join(d, k + ".cls"), "wb") as f:
            f.write(str(label(i)).encode())
    return {}


def write_wds(spec: Spec, P: Payloads) -> dict[str, Any]:
    import webdataset as wds

    d = fmt_dir(spec, "wds")
    os.makedirs(d, exist_ok=True)
    with wds.ShardWriter(os.path.join(d, "wds-%06d.tar"), maxcount=spec.per_shard,
                         verbose=0) as w:
        for i in range(spec.n):
            w.write(P.sample(i))
    return {}


def write_mds(spec: Spec, P: Payloads) -> dict[str, Any]:
    streaming = import_streaming()
    d = fmt_dir(spec, "mds")
    with streaming.MDSWriter(out=d, columns={"key": "str", "bin": "bytes", "cls": "int"},
                             size_limit="64mb") as w:
        for i in range(spec.n):
            w.write({"key": key(i), "bin": P.payload(i), "cls": label(i)})
    return {}


_LIT_P: Payloads | None = None


def _lit_item(i: int) -> dict[str, Any]:
    global _LIT_P
    if _LIT_P is None:
        _LIT_P = Payloads(int(os.environ["TARINDEX_BENCH_N"]))
    return {"key": key(i), "bin": _LIT_P.payload(i), "cls": label(i)}


def write_litdata(spec: Spec, P: Payloads) -> dict[str, Any]:
    import litdata

    os.environ["TARINDEX_BENCH_N"] = str(spec.n)
    litdata.optimize(fn=_lit_item, inputs=list(range(spec.n)), output_dir=fmt_dir(spec, "litdata"),
                     chunk_bytes="64MB", num_workers=1, verbose=False, reorder_files=False,
                     mode="overwrite")
    return {"note": "optimize(num_workers=1); includes its worker start"}


AR_WRITER_OPTIONS = "group_size:1"  # what random access needs; compression stays its default


def write_arrayrecord(spec: Spec, P: Payloads) -> dict[str, Any]:
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    d = fmt_dir(spec, "arrayrecord")
    os.makedirs(d, exist_ok=True)
    for s, a in enumerate(range(0, spec.n, spec.per_shard)):
        path = os.path.join(d, f"ar-{s:06d}.array_record")
        w = ArrayRecordWriter(path, AR_WRITER_OPTIONS)
        for i in range(a, min(a + spec.per_shard, spec.n)):
            w.write(_rec(P, i))
        w.close()
    r = ArrayRecordReader(path)
    opts = r.writer_options_string()
    r.close()
    return {"note": f"options {AR_WRITER_OPTIONS!r} (file says {opts})"}


def _lance_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.string()), ("bin", pa.binary()), ("cls", pa.int32())])


def write_lance(spec: Spec, P: Payloads) -> dict[str, Any]:
    import lance
    import pyarrow as pa

    schema = _lance_schema()

    def batches() -> Any:
        for a in range(0, spec.n, 256):
            ids = range(a, min(a + 256, spec.n))
            yield pa.RecordBatch.from_arrays(
                [pa.array([key(i) for i in ids]), pa.array([P.payload(i) for i in ids], pa.binary()),
                 pa.array([label(i) for i in ids], pa.int32())], schema=schema)

    ds = lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()),
                             fmt_dir(spec, "lance"), schema=schema, mode="overwrite")
    return {"note": f"one dataset, {len(ds.get_fragments())} fragment(s), storage "
                    f"{getattr(ds, 'data_storage_version', '?')}"}


def write_tfrecord(spec: Spec, P: Payloads) -> dict[str, Any]:
    from tfrecord import TFRecordWriter
    from tfrecord.tools.tfrecord2idx import create_index

    d = fmt_dir(spec, "tfrecord")
    os.makedirs(d, exist_ok=True)
    for s, a in enumerate(range(0, spec.n, spec.per_shard)):
        path = os.path.join(d, f"tfr-{s:06d}.tfrecord")
        w = TFRecordWriter(path)
        for i in range(a, min(a + spec.per_shard, spec.n)):
            w.write({"key": (key(i).encode(), "byte"), "bin": (P.payload(i), "byte"),
                     "cls": (label(i), "int")})
        w.close()
        create_index(path, path[: -len(".tfrecord")] + ".tfindex")
    return {"note": "tf.train.Example per sample; includes writing its .tfindex files"}


WRITERS: dict[str, Callable[[Spec, Payloads], dict[str, Any]]] = {
    "tarindex": write_tarindex,
    "loose files": write_loose,
    "webdataset": write_wds,
    "MDS": write_mds,
    "litdata": write_litdata,
    "ArrayRecord": write_arrayrecord,
    "Lance": write_lance,
    "tfrecord": write_tfrecord,
}
WRITE_DIR = {"tarindex": "tarindex", "loose files": "loose", "webdataset": "wds", "MDS": "mds",
             "litdata": "litdata", "ArrayRecord": "arrayrecord", "Lance": "lance",
             "tfrecord": "tfrecord"}


# --------------------------------------------------------------------------------------------
# random access. Three figures over one seeded permutation of sample ids:
#   "random access ds[i]"            get(i) -> payload bytes (whole sample read, as ds[i] does)
#   "random batches of 64"           fetch(64 ids) -> batch; measure(batch) -> payload bytes
#   "random access, labels only"     get(i) -> label (int or decimal bytes); only cls asked for
# Each figure's limit is a tight loop of mmap slices, at offsets known in advance, of exactly
# the members the tarindex row of that figure returns.

RA_FIG = "random access ds[i]"
BATCH_FIG = "random batches of 64 (__getitems__)"
FIELDS_FIG = "random access, labels only (fields=('cls',))"


def _mmap_plan(spec: Spec, exts: tuple[str, ...] | None = None) -> tuple[list[Any], list[Any],
                                                                         list[int]]:
    """``(plan, mms, bin_size)``: per sample, the ``(shard, start, end)`` of each member to
    slice (every member, as ``ds[i]`` returns them, or only extensions ``exts``), the shards'
    mmaps, and per sample the size of its ``bin`` member in the index (what the payload-bytes
    check of a limit row adds up, outside its clock)."""
    import mmap

    import tarindex

    mms: list[Any] = []
    plan: list[Any] = []
    bin_size: list[int] = []
    for s, p in enumerate(tarindex_paths(spec)):
        r = tarindex.ShardReader(p)
        t = r.index
        names = [e.decode() if isinstance(e, bytes) else str(e) for e in t.exts]
        keep = [exts is None or nm in exts for nm in names]
        off, size, sp = t.offset.tolist(), t.size.tolist(), t.sample_ptr.tolist()
        ext = t.ext_id.tolist()
        for j in range(r.n_samples):
            ms = range(sp[j], sp[j + 1])
            plan.append(tuple((s, off[m], off[m] + size[m]) for m in ms if keep[ext[m]]))
            bin_size.append(sum(size[m] for m in ms if names[ext[m]] == "bin"))
        f = open(p, "rb")
        mms.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        r.close()
    return plan, mms, bin_size


def ra_mmap_limit(spec: Spec) -> Callable[[int], Any]:
    """The limit of ds[i]: mmap slices of every member of the sample (bin and cls, what ds[i]
    returns), offsets known in advance (no lookup at all)."""
    plan, mms, check = _mmap_plan(spec)

    def get(i: int) -> Any:
        s, a, b = plan[i][0]
        return mms[s][a:b]

    # The timed loop for a limit is special-cased in _run_access (no per-call overhead).
    get.plan, get.mms, get.check = plan, mms, check  # type: ignore[attr-defined]
    return get


def ra_tarindex(spec: Spec) -> Callable[[int], Any]:
    import tarindex

    ds = tarindex.TarDataset(tarindex_paths(spec))
    return lambda i: ds[i]["bin"]


def ra_loose(spec: Spec) -> Callable[[int], Any]:
    d = fmt_dir(spec, "loose")

    def get(i: int) -> bytes:
        k = os.path.join(d, key(i))
        with open(k + ".cls", "rb") as f:
            f.read()
        with open(k + ".bin", "rb") as f:
            return f.read()

    return get


def ra_tarfile(spec: Spec) -> Callable[[int], Any]:
    import tarfile

    index: dict[str, tuple[Any, Any]] = {}
    for p in wds_paths(spec):
        tf = tarfile.open(p)
        for ti in tf.getmembers():
            index[ti.name] = (tf, ti)

    def get(i: int) -> bytes:
        k = key(i)
        tf, ti = index[k + ".cls"]
        tf.extractfile(ti).read()
        tf, ti = index[k + ".bin"]
        return tf.extractfile(ti).read()

    return get


def _wids_shards(spec: Spec) -> list[dict[str, Any]]:
    out = []
    paths = wds_paths(spec)
    for s, p in enumerate(paths):
        n = min(spec.per_shard, spec.n - s * spec.per_shard)
        out.append({"url": p, "nsamples": n})
    return out


def ra_wids(spec: Spec) -> Callable[[int], Any]:
    import wids

    shards = _wids_shards(spec)
    ds = wids.ShardListDataset(shards, lru_size=len(shards), transformations=[])
    return lambda i: ds[i][".bin"].getvalue()  # wids hands out io.BytesIO per member


def ra_mds(spec: Spec) -> Callable[[int], Any]:
    streaming = import_streaming()
    ds = streaming.StreamingDataset(local=fmt_dir(spec, "mds"), shuffle=False, batch_size=1)
    return lambda i: ds[i]["bin"]


def ra_litdata(spec: Spec) -> Callable[[int], Any]:
    import litdata

    ds = litdata.StreamingDataset(fmt_dir(spec, "litdata"), shuffle=False)
    return lambda i: ds[i]["bin"]


def _ar_source(spec: Spec) -> Any:
    from array_record.python.array_record_data_source import ArrayRecordDataSource

    # its default reader options for a data source: readahead_buffer_size:0 (random access)
    return ArrayRecordDataSource(ar_paths(spec))


def ra_arrayrecord(spec: Spec) -> Callable[[int], Any]:
    ds = _ar_source(spec)

    def get(i: int) -> Any:
        _k, _c, payload = _unrec(ds[i])
        return payload

    return get


def _lance(spec: Spec) -> Any:
    import lance

    return lance.dataset(fmt_dir(spec, "lance"))


def ra_lance(spec: Spec) -> Callable[[int], Any]:
    ds = _lance(spec)

    def get(i: int) -> Any:
        t = ds.take([i])  # every column (key, bin, cls), as ds[i] returns every member
        t.column("cls")[0].as_py()
        return t.column("bin")[0].as_py()

    return get


RANDOM: dict[str, Callable[[Spec], Callable[[int], Any]]] = {
    "mmap-slice limit": ra_mmap_limit,
    "tarindex": ra_tarindex,
    "loose files": ra_loose,
    "tarfile": ra_tarfile,
    "wids": ra_wids,
    "MDS": ra_mds,
    "litdata": ra_litdata,
    "ArrayRecord": ra_arrayrecord,
    "Lance take([i])": ra_lance,
}


# labels only: get(i) -> the label, as int or decimal-text bytes


def fl_mmap_limit(spec: Spec) -> Callable[[int], Any]:
    """The limit of ds[i] with fields=("cls",): an mmap slice of the cls member only, at its
    offset from the index (``offset``/``size``/``ext_id``/``exts`` tables)."""
    plan, mms, check = _mmap_plan(spec, ("cls",))

    def get(i: int) -> Any:
        s, a, b = plan[i][0]
        return mms[s][a:b]

    get.plan, get.mms, get.check = plan, mms, check  # type: ignore[attr-defined]
    return get


def fl_tarindex(spec: Spec) -> Callable[[int], Any]:
    import tarindex

    # raises TypeError until TarDataset has the fields= keyword: the row then says so
    ds = tarindex.TarDataset(tarindex_paths(spec), fields=("cls",))
    return lambda i: ds[i]["cls"]


def fl_tarindex_all(spec: Spec) -> Callable[[int], Any]:
    import tarindex

    ds = tarindex.TarDataset(tarindex_paths(spec))
    return lambda i: ds[i]["cls"]


def fl_lance(spec: Spec) -> Callable[[int], Any]:
    ds = _lance(spec)
    return lambda i: ds.take([i], columns=["cls"]).column("cls")[0].as_py()


FIELDS: dict[str, Callable[[Spec], Callable[[int], Any]]] = {
    "mmap-slice limit (cls members only)": fl_mmap_limit,
    "tarindex fields=('cls',)": fl_tarindex,
    "tarindex ds[i] (reads every member)": fl_tarindex_all,
    "Lance take([i], columns=['cls'])": fl_lance,
}


# batches of 64 random ids: (fetch(ids) -> batch, measure(batch) -> payload bytes)


def bt_mmap_limit(spec: Spec) -> tuple[Callable[[list[int]], Any], Callable[[Any], int]]:
    """The per-item limit over the same batches: every member of each sample, sliced (the
    timed loop is special-cased in run_batch, as in the ds[i] figure)."""
    get = ra_mmap_limit(spec)

    def fetch(ids: list[int]) -> Any:
        return [get(i) for i in ids]

    fetch.plan, fetch.mms, fetch.check = get.plan, get.mms, get.check  # type: ignore[attr-defined]
    return fetch, lambda b: sum(map(len, b))


def _bt_tarindex(batched: bool) -> Callable[[Spec], tuple[Callable[[list[int]], Any],
                                                         Callable[[Any], int]]]:
    def make(spec: Spec) -> tuple[Callable[[list[int]], Any], Callable[[Any], int]]:
        import tarindex

        ds = tarindex.TarDataset(tarindex_paths(spec), batched=batched)
        if batched:  # one BatchedSamples: one buffer + offsets, cls parsed to int64
            return ds.__getitems__, lambda b: int(b.lengths("bin").sum())
        return ds.__getitems__, lambda b: sum(len(s["bin"]) for s in b)

    return make


def bt_arrayrecord(spec: Spec) -> tuple[Callable[[list[int]], Any], Callable[[Any], int]]:
    ds = _ar_source(spec)

    def fetch(ids: list[int]) -> Any:
        return [_unrec(r) for r in ds.__getitems__(ids)]

    return fetch, lambda b: sum(len(r[2]) for r in b)


def bt_lance(spec: Spec) -> tuple[Callable[[list[int]], Any], Callable[[Any], int]]:
    import pyarrow.compute as pc

    ds = _lance(spec)
    # one Arrow table per batch (every column), kept as Arrow: no per-sample objects
    return ds.take, lambda t: int(pc.sum(pc.binary_length(t.column("bin"))).as_py())


BATCHES: dict[str, Callable[[Spec], tuple[Callable[[list[int]], Any], Callable[[Any], int]]]] = {
    "mmap-slice limit (per item)": bt_mmap_limit,
    "tarindex __getitems__": _bt_tarindex(False),
    "tarindex __getitems__ batched=True": _bt_tarindex(True),
    "ArrayRecord __getitems__": bt_arrayrecord,
    "Lance take(64 ids)": bt_lance,
}


def _perm(spec: Spec) -> list[int]:
    return np.random.default_rng(spec.seed + 1).permutation(spec.n)[: spec.n_access].tolist()


def _access_extra(spec: Spec, t_open: float, n: int, n_max: int, anon0: float,
                  **kw: Any) -> dict[str, Any]:
    anon1 = rss_anon_mb()
    return {"open_s": t_open, "accesses": n, "stopped_early": n < n_max,
            "anon_mb_delta": anon1 - anon0, "anon_bytes_per_sample": (anon1 - anon0) * MB / spec.n,
            "peak_rss_mb": peak_rss_mb(), **kw}


def _run_access(spec: Spec, name: str, figure: str,
                table: dict[str, Callable[[Spec], Callable[[int], Any]]]) -> list[Result]:
    """One process, ``get(i)`` over the seeded permutation (at most ``spec.ra_seconds``).

    Checked: the payload bytes read (``random access ds[i]``) or the sum of the labels read
    (labels only), against the dataset."""
    labels = figure == FIELDS_FIG
    P = Payloads(spec.n)
    perm = _perm(spec)

    def expect(ids: list[int]) -> int:
        return sum(label(i) for i in ids) if labels else int(P.sizes[ids].sum())

    anon0 = rss_anon_mb()
    t0 = now()
    get = table[name](spec)
    first = get(perm[0])
    t_open = now() - t0
    del first
    got = 0
    _warm(perm, get)
    if hasattr(get, "plan"):  # a limit: the slices alone, checked outside the clock
        plan, mms, check = get.plan, get.mms, get.check  # type: ignore[attr-defined]
        t0 = now()
        for i in perm:
            for s, a, b in plan[i]:
                mms[s][a:b]
        dt = now() - t0
        if labels:
            got = sum(int(mms[s][a:b]) for i in perm for s, a, b in plan[i])
        else:
            got = sum(check[i] for i in perm)
        n = len(perm)
    else:
        measure = int if labels else len
        t0 = now()
        deadline = t0 + spec.ra_seconds
        done = 0
        for k in range(0, len(perm), 256):
            for i in perm[k : k + 256]:
                got += measure(get(i))
            done = min(k + 256, len(perm))
            if now() > deadline:
                break
        dt = now() - t0
        n = done
    want = expect(perm[:n])
    extra = _access_extra(spec, t_open, n, len(perm), anon0, bytes_ok=got == want)
    what = "label sum" if labels else "payload bytes"
    status = "ok" if got == want else f"failed: read {got} {what}, expected {want}"
    mbs = None if labels else got / MB / dt
    return [Result(name, figure, n / dt, mbs, dt, status, extra)]


WARM_S = 2.0
"""Untimed warm-up per random-access contender: its accesses, in the timed order, until
this many seconds pass. The machine's page cache does not hold every format's data at once
(and its memory daemon reclaims cold pages), so without it whichever row first touches a
format's files pays for disk reads: the limit rows did, by up to 3x."""


def _warm(items: list[Any], fn: Callable[[Any], Any]) -> None:
    t_end = now() + WARM_S
    for k in range(0, len(items), 64):
        for it in items[k : k + 64]:
            fn(it)
        if now() > t_end:
            break


def run_random(spec: Spec, name: str) -> list[Result]:
    return _run_access(spec, name, RA_FIG, RANDOM)


def run_fields(spec: Spec, name: str) -> list[Result]:
    return _run_access(spec, name, FIELDS_FIG, FIELDS)


def run_batch(spec: Spec, name: str) -> list[Result]:
    """One process, ``fetch(64 random ids)`` per batch over the seeded permutation (at most
    ``spec.ra_seconds``); checked: the payload bytes of every batch against the dataset."""
    P = Payloads(spec.n)
    perm = _perm(spec)
    batches = [perm[k : k + BATCH] for k in range(0, len(perm) - BATCH + 1, BATCH)]
    anon0 = rss_anon_mb()
    t0 = now()
    fetch, measure = BATCHES[name](spec)
    measure(fetch(batches[0]))
    t_open = now() - t0
    got = done = 0
    _warm(batches, fetch)
    if hasattr(fetch, "plan"):  # the limit: the slices alone, checked outside the clock
        plan, mms, check = fetch.plan, fetch.mms, fetch.check  # type: ignore[attr-defined]
        t0 = now()
        for b in batches:
            for i in b:
                for s, a, c in plan[i]:
                    mms[s][a:c]
        dt = now() - t0
        done = len(batches)
        got = sum(check[i] for b in batches for i in b)
    else:
        t0 = now()
        deadline = t0 + spec.ra_seconds
        for b in batches:
            got += measure(fetch(b))
            done += 1
            if now() > deadline:
                break
        dt = now() - t0
    ids = [i for b in batches[:done] for i in b]
    want = int(P.sizes[ids].sum())
    extra = _access_extra(spec, t_open, len(ids), len(batches) * BATCH, anon0,
                          bytes_ok=got == want, batches=done)
    status = "ok" if got == want else f"failed: read {got} payload bytes, expected {want}"
    return [Result(name, BATCH_FIG, len(ids) / dt, got / MB / dt, dt, status, extra)]


# --------------------------------------------------------------------------------------------
# DataLoader epochs (2 workers, batch 64, shuffle) and streaming epochs


class MmapSliceDataset:
    """The bare per-sample DataLoader ceiling: ``ds[i]`` = mmap slices, nothing else."""

    def __init__(self, spec: Spec) -> None:
        import tarindex

        self.paths = tarindex_paths(spec)
        sid, off = [], []
        for s, p in enumerate(self.paths):
            with tarindex.ShardReader(p) as r:
                t = r.index
                sp = np.asarray(t.sample_ptr, np.int64)
                # members are (bin, cls) in write order
                ob, oc = np.asarray(t.offset)[sp[:-1]], np.asarray(t.offset)[sp[:-1] + 1]
                sb, sc = np.asarray(t.size)[sp[:-1]], np.asarray(t.size)[sp[:-1] + 1]
                sid.append(np.full(r.n_samples, s))
                off.append(np.stack([ob, ob + sb, oc, oc + sc], 1))
        self.sid = np.concatenate(sid).tolist()
        self.rng = np.concatenate(off).astype(np.int64).tolist()
        self._mms: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.sid)

    def __getitem__(self, i: int) -> Any:
        import mmap

        s = self.sid[i]
        mm = self._mms.get(s)
        if mm is None:
            with open(self.paths[s], "rb") as f:
                mm = self._mms[s] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        a, b, c, d = self.rng[i]
        return mm[a:b], int(mm[c:d]), i

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_mms": {}}


class LooseDataset:
    def __init__(self, spec: Spec) -> None:
        self.d = fmt_dir(spec, "loose")
        self.n = spec.n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        k = os.path.join(self.d, key(i))
        with open(k + ".cls", "rb") as f:
            c = int(f.read())
        with open(k + ".bin", "rb") as f:
            return f.read(), c, i


class TransportLimitDataset:
    """The batched DataLoader's physical limit: no lookup, no file read; each batch is its
    samples' payload bytes copied from a hot in-memory buffer into one shared-memory tensor
    (what ``TarDataset(batched=True)`` must at least do), then sent to the main process."""

    def __init__(self, spec: Spec) -> None:
        self.sizes = Payloads(spec.n).sizes + 3  # payload + label bytes
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitems__(self, idx: list[int]) -> Any:
        from tarindex.torch.collate import BatchedSamples

        try:  # where the read kernel put it; before: tarindex.torch.collate._alloc
            from tarindex.torch.transport import alloc_buffer as _alloc
        except ImportError:
            from tarindex.torch.collate import _alloc  # type: ignore[attr-defined,no-redef]

        if self._pool is None:
            self._pool = np.random.default_rng(0).integers(0, 256, 64 * 121_000, np.uint8)
        sizes = self.sizes[idx]
        total = int(sizes.sum())
        t = _alloc(total)
        t.numpy()[:] = self._pool[:total]
        offsets = np.zeros((1, len(idx) + 1), np.int64)
        np.cumsum(sizes, out=offsets[0, 1:])
        # sent exactly as a TarDataset(batched=True) batch is (one buffer, by name)
        return BatchedSamples(["bin"], t, offsets, np.ones((1, len(idx)), np.bool_),
                              [""] * len(idx), np.asarray(idx, np.int64), {}, [None] * len(idx))


def _first(batch: Any) -> Any:
    return batch


def ld_transport_limit(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    return (_loader(TransportLimitDataset(spec), collate_fn=_first),
            lambda b: (b.index.tolist(), int(b.data.numel())))


def _loader(ds: Any, **kw: Any) -> Any:
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                       generator=g, **kw)


def ld_mmap_ceiling(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    return _loader(MmapSliceDataset(spec)), lambda b: (b[2].tolist(), sum(map(len, b[0])))


def ld_tarindex(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import tarindex

    ds = tarindex.TarDataset(tarindex_paths(spec))
    return _loader(ds), lambda b: (b["__index__"].tolist(), sum(map(len, b["bin"])))


def ld_tarindex_batched(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import tarindex
    from tarindex.torch.collate import collate_batched

    ds = tarindex.TarDataset(tarindex_paths(spec), batched=True)
    return (_loader(ds, collate_fn=collate_batched),
            lambda b: (b.index.tolist(), int(b.lengths("bin").sum())))


def ld_loose(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    return _loader(LooseDataset(spec)), lambda b: (b[2].tolist(), sum(map(len, b[0])))


def ld_wids(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import wids

    shards = _wids_shards(spec)
    ds = wids.ShardListDataset(shards, lru_size=len(shards), transformations=[])
    return (_loader(ds, collate_fn=_wids_collate),
            lambda b: ([int(k) for k in b[0]], sum(map(len, b[1]))))


def _wids_collate(samples: list[dict[str, Any]]) -> Any:
    # wids returns an io.BytesIO per member, which default_collate refuses
    return [s["__key__"] for s in samples], [s[".bin"].getvalue() for s in samples]


def _lit_collate(samples: list[dict[str, Any]]) -> Any:
    # litdata returns a memoryview of its chunk for bytes, which default_collate refuses
    return [s["key"] for s in samples], [bytes(s["bin"]) for s in samples]


def ld_tarindex_stream(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import torch

    from tarindex import TarIterableDataset

    ds = TarIterableDataset(tarindex_paths(spec), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    return loader, lambda b: (b["__index__"].tolist(), sum(map(len, b["bin"])))


def ld_tarindex_stream_batched(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import torch

    from tarindex import TarIterableDataset

    # one BatchedSamples per batch, packed in the worker straight from the block reads
    ds = TarIterableDataset(tarindex_paths(spec), shuffle=True, seed=0, batched=True,
                            batch_size=BATCH)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS)
    return loader, lambda b: (b.index.tolist(), int(b.lengths("bin").sum()))


def ld_wds(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import webdataset as wds

    ds = (wds.WebDataset(wds_paths(spec), shardshuffle=True, seed=0)
          .shuffle(WDS_BUFFER).to_tuple("__key__", "bin").batched(BATCH))
    loader = wds.WebLoader(ds, batch_size=None, num_workers=WORKERS)
    return loader, lambda b: ([int(k) for k in b[0]], sum(map(len, b[1])))


def ld_mds(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import torch

    streaming = import_streaming()
    ds = streaming.StreamingDataset(local=fmt_dir(spec, "mds"), shuffle=True, shuffle_seed=0,
                                    batch_size=BATCH)
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    return loader, lambda b: ([int(k) for k in b["key"]], sum(map(len, b["bin"])))


def ld_litdata(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import litdata

    ds = litdata.StreamingDataset(fmt_dir(spec, "litdata"), shuffle=True, seed=0)
    loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                                         collate_fn=_lit_collate)
    return loader, lambda b: ([int(k) for k in b[0]], sum(map(len, b[1])))


LOADERS: dict[str, Callable[[Spec], tuple[Any, Callable[[Any], Any]]]] = {
    "mmap-slice ceiling (per-sample)": ld_mmap_ceiling,
    "batch transport limit (no reads)": ld_transport_limit,
    "tarindex batched": ld_tarindex_batched,
    "tarindex per-sample": ld_tarindex,
    "tarindex streaming": ld_tarindex_stream,
    "tarindex streaming batched": ld_tarindex_stream_batched,
    "loose files": ld_loose,
    "wids": ld_wids,
    "webdataset +shuffle buffer": ld_wds,
    "MDS": ld_mds,
    "litdata": ld_litdata,
}


def run_loader(spec: Spec, name: str) -> list[Result]:
    """``spec.loader_epochs`` epochs; samples/s is the best steady rate after the first batch
    (worker start apart); every epoch is checked for duplicates and missing samples."""
    anon0 = rss_anon_mb()
    t0 = now()
    loader, unpack = LOADERS[name](spec)
    best: tuple[float, float, float] | None = None
    epochs = []
    for _ in range(spec.loader_epochs):
        ids: list[int] = []
        nbytes = 0
        t_first = None
        n_first = b_first = 0
        for batch in loader:
            got, nb = unpack(batch)
            ids += got
            nbytes += nb
            if t_first is None:
                t_first, n_first, b_first = now(), len(ids), nbytes
        t_end = now()
        dup, miss = dup_missing(np.asarray(ids), spec.n)
        epochs.append({"first_batch_s": (t_first or t_end) - t0, "epoch_s": t_end - t0,
                       "epoch_samples_per_s": len(ids) / (t_end - t0), "yielded": len(ids),
                       "duplicates": dup, "missing": miss})
        if t_first is not None and t_end > t_first:
            dt = t_end - t_first
            rate = (len(ids) - n_first) / dt
            if best is None or rate > best[0]:
                best = (rate, (nbytes - b_first) / MB / dt, dt)
        t0 = now()
    extra = {**epochs[0], "epochs": epochs,
             "duplicates": sum(e["duplicates"] for e in epochs),
             "missing": sum(e["missing"] for e in epochs),
             "peak_rss_mb": peak_rss_mb(), "worker_peak_rss_mb": children_peak_rss_mb(),
             "anon_mb_delta": rss_anon_mb() - anon0}
    del loader
    if best is None:
        return [Result(name, "DataLoader epoch (2 workers)", status="failed: no batch", extra=extra)]
    return [Result(name, "DataLoader epoch (2 workers)", best[0], best[1], best[2], "ok", extra)]


def st_tarindex(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    from tarindex import TarIterableDataset

    return (TarIterableDataset(tarindex_paths(spec), shuffle=True, seed=0),
            lambda s: (s["__index__"], len(s["bin"])))


def st_wds(buffer: int) -> Callable[[Spec], tuple[Any, Callable[[Any], Any]]]:
    def make(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
        import webdataset as wds

        ds = wds.WebDataset(wds_paths(spec), shardshuffle=True, seed=0)
        if buffer:
            ds = ds.shuffle(buffer)
        return ds, lambda s: (int(s["__key__"]), len(s["bin"]))

    return make


def st_mds(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    streaming = import_streaming()
    ds = streaming.StreamingDataset(local=fmt_dir(spec, "mds"), shuffle=True, shuffle_seed=0,
                                    batch_size=BATCH)
    return ds, lambda s: (int(s["key"]), len(s["bin"]))


def st_litdata(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import litdata

    ds = litdata.StreamingDataset(fmt_dir(spec, "litdata"), shuffle=True, seed=0)
    return ds, lambda s: (int(s["key"]), len(s["bin"]))


def st_tarfile(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    import tarfile

    def gen() -> Any:
        for p in wds_paths(spec):
            with tarfile.open(p) as tf:
                for ti in tf:
                    if ti.name.endswith(".bin"):
                        yield ti.name[:-4], tf.extractfile(ti).read()

    return gen(), lambda s: (int(s[0]), len(s[1]))


def st_arrayrecord(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    """ArrayRecord has no shuffled stream of its own (Grain shuffles by random access, the
    ds[i] figure): shards in a seeded order, each read sequentially with the reader's default
    options (readahead), 256 records per ``read(start, end)``, through a 1000-sample shuffle
    buffer like webdataset's."""
    import random

    from array_record.python.array_record_module import ArrayRecordReader

    paths = ar_paths(spec)
    order = np.random.default_rng(spec.seed).permutation(len(paths)).tolist()

    def gen() -> Any:
        rnd = random.Random(spec.seed)
        buf: list[bytes] = []
        for s in order:
            r = ArrayRecordReader(paths[s])
            n = r.num_records()
            for a in range(0, n, 256):
                for rec in r.read(a, min(a + 256, n)):
                    buf.append(rec)
                    if len(buf) >= WDS_BUFFER:
                        k = rnd.randrange(len(buf))
                        buf[k], buf[-1] = buf[-1], buf[k]
                        yield _unrec(buf.pop())
            r.close()
        rnd.shuffle(buf)
        for rec in buf:
            yield _unrec(rec)

    return gen(), lambda s: (int(s[0]), len(s[2]))


def st_tfrecord(spec: Spec) -> tuple[Any, Callable[[Any], Any]]:
    """vahidk's tfrecord: ``MultiTFRecordDataset`` over every shard with its ``.tfindex``
    (each shard starts at a random record, shards interleaved at random), a 1000-sample shuffle
    queue, one pass (``infinite=False``); numpy's global seed fixed."""
    from tfrecord.torch.dataset import MultiTFRecordDataset

    d = fmt_dir(spec, "tfrecord")
    splits = {os.path.basename(p)[: -len(".tfrecord")]: 1.0 for p in tfr_paths(spec)}
    np.random.seed(spec.seed)
    ds = MultiTFRecordDataset(os.path.join(d, "{}.tfrecord"), os.path.join(d, "{}.tfindex"),
                              splits, description={"key": "byte", "bin": "byte", "cls": "int"},
                              shuffle_queue_size=WDS_BUFFER, infinite=False)
    return ds, lambda s: (int(s["key"]), len(s["bin"]))


STREAMS: dict[str, Callable[[Spec], tuple[Any, Callable[[Any], Any]]]] = {
    "tarindex streaming": st_tarindex,
    "webdataset +shuffle buffer": st_wds(WDS_BUFFER),
    "webdataset no buffer": st_wds(0),
    "MDS": st_mds,
    "litdata": st_litdata,
    "tarfile (sequential, no shuffle)": st_tarfile,
    "ArrayRecord (shard order + 1000 buffer)": st_arrayrecord,
    "tfrecord (MultiTFRecordDataset + index)": st_tfrecord,
}


def run_stream(spec: Spec, name: str) -> list[Result]:
    t0 = now()
    ds, unpack = STREAMS[name](spec)
    ids: list[int] = []
    nbytes = 0
    for s in ds:
        i, nb = unpack(s)
        ids.append(i)
        nbytes += nb
    dt = now() - t0
    dup, miss = dup_missing(np.asarray(ids), spec.n)
    extra = {"yielded": len(ids), "duplicates": dup, "missing": miss,
             "peak_rss_mb": peak_rss_mb()}
    if dup == 0 and miss == 0:
        try:  # shuffle-quality metrics of benchmarks/bench_stream.py, on the order observed
            from bench_stream import quality

            extra["shuffle"] = quality(np.asarray(ids, np.int64))
        except ImportError as e:
            extra["shuffle"] = f"bench_stream.quality not available yet: {e}"
    return [Result(name, "streaming epoch, 1 process, shuffled", len(ids) / dt,
                   nbytes / MB / dt, dt, "ok", extra)]


# --------------------------------------------------------------------------------------------
# limits, write, index build, scale


def run_seqread(spec: Spec, _name: str) -> list[Result]:
    buf = bytearray(8 << 20)
    total = 0
    paths = tarindex_paths(spec)
    for p in paths:  # warm pass (page cache)
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    t0 = now()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                total += k
    dt = now() - t0
    return [Result("raw sequential read (limit)", "streaming epoch, 1 process, shuffled",
                   spec.n / dt, total / MB / dt, dt, "ok",
                   {"bytes": total, "note": "8 MiB readinto over the tarindex shards"})]


def run_write(spec: Spec, name: str) -> list[Result]:
    P = Payloads(spec.n)
    d = fmt_dir(spec, WRITE_DIR[name])
    shutil.rmtree(d, ignore_errors=True)
    t0 = now()
    extra = WRITERS[name](spec, P)
    dt = now() - t0
    disk = du_bytes(d)
    extra.update({"disk_bytes": disk, "disk_bytes_per_sample": disk / spec.n,
                  "payload_bytes_per_sample": P.total_bytes / spec.n,
                  "overhead_pct": 100 * (disk / P.total_bytes - 1), "peak_rss_mb": peak_rss_mb()})
    if name == "tarindex":
        idx = sum(os.path.getsize(p + ".tidx") for p in tarindex_paths(spec))
        extra.update({"index_bytes": idx, "index_bytes_per_sample": idx / spec.n})
    return [Result(name, "write", spec.n / dt, P.total_bytes / MB / dt, dt, "ok", extra)]


def _synthetic_shard(d: str, n: int) -> str:
    """An index of ``n`` samples (bin 1000 B + cls 3 B each) beside a sparse tar of zeros."""
    import zlib

    from tarindex.format.index import IndexTables, encode_index

    per = 2560  # header 512 + bin 1024 + header 512 + cls 512
    tar = os.path.join(d, f"scale-{n}.tar")
    size = n * per + 10240
    with open(tar, "wb") as f:
        f.truncate(size)
        # real ustar headers where opening re-reads them (first, quartiles, last member:
        # tarindex.format.spec.HEADER_CHECKS of them), so the shard passes the open-time checks
        import tarfile

        from tarindex.format.spec import HEADER_CHECKS

        m = 2 * n
        for k in sorted({(m - 1) * q // (HEADER_CHECKS - 1) for q in range(HEADER_CHECKS)}):
            ti = tarfile.TarInfo(f"{k // 2:08d}." + ("bin" if k % 2 == 0 else "cls"))
            ti.size, ti.mtime = (1000, 3)[k % 2], 0
            f.seek((k // 2) * per + (0, 1536)[k % 2])
            f.write(ti.tobuf(format=tarfile.USTAR_FORMAT))
    with open(tar, "rb") as f:
        head = zlib.crc32(f.read(4096))
    zeros = zlib.crc32(bytes(4096))
    base = np.arange(n, dtype=np.uint64) * per
    offset = np.empty(2 * n, np.uint64)
    offset[0::2] = base + 512
    offset[1::2] = base + 2048
    sizes = np.empty(2 * n, np.uint64)
    sizes[0::2], sizes[1::2] = 1000, 3
    keys = np.char.zfill(np.arange(n).astype("U8"), 8).astype("S8").tobytes()
    t = IndexTables(
        sample_ptr=np.arange(0, 2 * n + 1, 2, dtype=np.uint64), offset=offset, size=sizes,
        ext_id=np.tile(np.array([0, 1], np.uint32), n),
        key_ptr=np.arange(0, 8 * n + 1, 8, dtype=np.uint64), key_blob=keys,
        exts=[b"bin", b"cls"], tar_size=size, head_crc=head, tail_crc=zeros, meta={},
    )
    with open(tar + ".tidx", "wb") as f:
        f.write(encode_index(t))
    return tar


def run_scale(spec: Spec, _name: str) -> list[Result]:
    import pickle

    import tarindex

    d = os.path.join(spec.root, "scale")
    os.makedirs(d, exist_ok=True)
    out = []
    for n in spec.scale:
        tar = _synthetic_shard(d, n)
        anon0 = rss_anon_mb()
        t0 = now()
        ds = tarindex.TarDataset([tar])
        ds[0]
        t_open = now() - t0
        anon1 = rss_anon_mb()
        perm = np.random.default_rng(spec.seed + 2).permutation(n)[: min(n, 20_000)].tolist()
        for i in perm:  # warm: fault in the (sparse) tar pages these samples touch
            ds[i]
        t0 = now()
        for i in perm:
            ds[i]
        dt = now() - t0
        out.append(Result(f"tarindex @ {n:,} samples", "scale: open + random access",
                          len(perm) / dt, None, dt, "ok",
                          {"n": n, "open_ms": t_open * 1e3,
                           "anon_mb_after_open": anon1 - anon0,
                           "index_bytes_per_sample": os.path.getsize(tar + ".tidx") / n,
                           "pickled_dataset_bytes": len(pickle.dumps(ds)),
                           "note": "synthetic index + sparse tar; ds[i] over 20k samples, "
                                   "second pass (warm)"}))
        ds.shards.close()
        os.unlink(tar)
        os.unlink(tar + ".tidx")
    return out


def run_index_build(spec: Spec, _name: str) -> list[Result]:
    """Index build of existing tars (the webdataset-written shards: pax headers on every member).

    The listers and their timing are benchmarks/bench_scan.py's (``time_listers``: warm cache,
    best of 3 for the fast ones, one run for tarfile and ratarmountcore), summed over the
    shards; plus tarindex ``build_index`` (scan + write the .tidx), timed here.
    """
    try:
        from bench_scan import time_listers
    except ImportError as e:
        return [Result("index build", "index build", status="not available yet",
                       extra={"why": f"benchmarks/bench_scan.py: {e}"})]
    import tarindex

    paths = wds_paths(spec)
    tot: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    nbytes = sum(os.path.getsize(p) for p in paths)
    for p in paths:
        for name, r in time_listers(p, repeat=3).items():
            if "error" in r:
                errors[name] = str(r["error"])
                continue
            t = tot.setdefault(name, {"seconds": 0.0, "members": 0})
            t["seconds"] += float(r["seconds"])
            t["members"] += int(r["members"])
    d = os.path.join(spec.root, "index-build")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t0 = now()
    members = 0
    for k, p in enumerate(paths):
        members += len(tarindex.build_index(p, os.path.join(d, f"{k}.tidx")).offset)
    tot["tarindex build_index (scan + write .tidx)"] = {"seconds": now() - t0, "members": members}
    out = []
    for name, t in tot.items():
        out.append(Result(name, "index build", t["members"] / t["seconds"],
                          nbytes / MB / t["seconds"], t["seconds"], "ok",
                          {"members": t["members"], "gb_s": nbytes / 1e9 / t["seconds"],
                           "tars": len(paths), "tar_bytes": nbytes,
                           "note": "members/s in the samples/s column"}))
    for name, err in errors.items():
        out.append(Result(name, "index build", status=f"failed: {err[:150]}"))
    return out


TASKS: dict[str, Callable[[Spec, str], list[Result]]] = {
    "write": run_write,
    "random": run_random,
    "batch": run_batch,
    "fields": run_fields,
    "loader": run_loader,
    "stream": run_stream,
    "seqread": run_seqread,
    "scale": run_scale,
    "index": run_index_build,
}


# --------------------------------------------------------------------------------------------
# orchestration


def _preimport(task: str, name: str) -> None:
    """Import what a measurement needs before its clock starts: open costs exclude imports."""
    import importlib

    mods = ["torch", "torch.utils.data", "tarindex", "tarindex.torch", "tarindex.torch.collate"]
    low = name.lower()
    if "wids" in low:
        mods.append("wids")
    if "webdataset" in low:
        mods.append("webdataset")
    if "litdata" in low:
        mods.append("litdata")
    if "tarfile" in low:
        mods.append("tarfile")
    if "arrayrecord" in low:
        mods += ["array_record.python.array_record_module",
                 "array_record.python.array_record_data_source"]
    if "lance" in low:
        mods += ["lance", "pyarrow", "pyarrow.compute"]
    if "tfrecord" in low:
        mods += ["tfrecord", "tfrecord.torch.dataset", "tfrecord.tools.tfrecord2idx"]
    for m in mods:
        importlib.import_module(m)
    if "mds" in low:
        import_streaming()


def child_main(task: str, name: str, spec_json: str) -> int:
    spec = Spec(**json.loads(spec_json))
    try:
        if task != "write":
            _preimport(task, name)
        # the same for every contender: what the imports left (torch: ~170k objects) moves
        # out of the collector's way, so one full collection falling inside a short timed
        # epoch or not does not swing a row by 2x
        gc.collect()
        gc.freeze()
        res = TASKS[task](spec, name)
    except BaseException as e:  # report, never crash the run
        tb = traceback.format_exc(limit=3)
        res = [Result(name, task, status=f"failed: {type(e).__name__}: {str(e)[:200]}",
                      extra={"traceback": tb})]
    if os.environ.get("TARINDEX_BENCH_TV_STUB"):
        for r in res:
            r.extra["torchvision_stub"] = True
    sys.stdout.write("\nRESULT:" + json.dumps([r.to_json() for r in res], default=str) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip peers' atexit hooks (MDS shared memory, litdata threads) hanging


def in_child(task: str, name: str, spec: Spec, timeout: float, figure: str) -> list[Result]:
    t0 = time.time()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", task, name,
           json.dumps(spec.__dict__)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           cwd=spec.root, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        return [Result(name, figure, status=f"failed: timed out after {timeout:.0f} s",
                       extra={"stderr": (e.stderr or b"")[-500:]})]
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT:"):
            res = [Result(**r) for r in json.loads(line[7:])]
            for r in res:
                r.extra["wall_s"] = time.time() - t0
                if r.figure == task:
                    r.figure = figure
            return res
    last = (err.strip().splitlines() or ["no output"])[-1]
    return [Result(name, figure, status=f"failed: exit {rc}: {last[:200]}",
                   extra={"stderr": err[-2000:]})]


def run_all(spec: Spec, only: set[str] | None, match: list[str] | None = None) -> list[Result]:
    results: list[Result] = []

    def go(task: str, name: str, figure: str, timeout: float) -> None:
        if only and task not in only:
            return
        if match and not any(m in name.lower() for m in match):
            return
        t0 = time.time()
        rs = in_child(task, name, spec, timeout, figure)
        results.extend(rs)
        for r in rs:
            sps = f"{r.samples_per_s:,.0f}/s" if r.samples_per_s else ""
            print(f"  {figure[:28]:28s} {r.contender[:36]:36s} {sps:>14s}  {r.status[:70]}"
                  f"  [{time.time() - t0:.1f}s]", flush=True)

    big = 60 + spec.n / 100
    print("write:", flush=True)
    for name in WRITERS:
        go("write", name, "write", big * 2)
    print("limits + random access:", flush=True)
    go("seqread", "seqread", "streaming epoch, 1 process, shuffled", big)
    for name in RANDOM:
        go("random", name, RA_FIG, big)
    for name in BATCHES:
        go("batch", name, BATCH_FIG, big)
    for name in FIELDS:
        go("fields", name, FIELDS_FIG, big)
    print("DataLoader epochs:", flush=True)
    for name in LOADERS:
        go("loader", name, "DataLoader epoch (2 workers)", big)
    print("streaming epochs:", flush=True)
    for name in STREAMS:
        go("stream", name, "streaming epoch, 1 process, shuffled", big)
    print("index build + scale:", flush=True)
    go("index", "index build", "index build", big * 2)
    go("scale", "scale", "scale: open + random access", big * 2)
    return results


# --------------------------------------------------------------------------------------------
# reporting

REF = {  # figure -> (tarindex reference row, limit row)
    RA_FIG: ("tarindex", "mmap-slice limit"),
    BATCH_FIG: ("tarindex __getitems__ batched=True", "mmap-slice limit (per item)"),
    FIELDS_FIG: ("tarindex fields=('cls',)", "mmap-slice limit (cls members only)"),
    "DataLoader epoch (2 workers)": ("tarindex batched", "batch transport limit (no reads)"),
    "streaming epoch, 1 process, shuffled": ("tarindex streaming", "raw sequential read (limit)"),
    "write": ("tarindex", None),
    "index build": ("tarindex scan", None),
}


def _get(results: list[Result], figure: str, contender: str) -> Result | None:
    for r in results:
        if r.figure == figure and r.contender == contender and r.status == "ok":
            return r
    return None


def fmt_num(x: float | None, digits: int = 0) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:,.{digits}f}"


def table(results: list[Result], spec: Spec) -> str:
    lines = []
    lines.append("| figure | contender | samples/s | MB/s | vs tarindex | of limit | notes |")
    lines.append("|---|---|---:|---:|---:|---:|---|")
    figures = list(dict.fromkeys(r.figure for r in results))
    for fig in figures:
        ref_name, lim_name = REF.get(fig, (None, None))
        ref = _get(results, fig, ref_name) if ref_name else None
        lim = _get(results, fig, lim_name) if lim_name else None
        for r in results:
            if r.figure != fig:
                continue
            vs = of = ""
            if r.status == "ok" and r.samples_per_s and ref and ref.samples_per_s:
                vs = f"{r.samples_per_s / ref.samples_per_s:.2f}x"
            if r.status == "ok" and lim and r.samples_per_s and r is not lim:
                of = f"{r.samples_per_s / lim.samples_per_s:.2f}"
            notes = []
            e = r.extra
            if r.status != "ok":
                notes.append(r.status + (f" ({e['why']})" if "why" in e else ""))
            if "open_s" in e:
                notes.append(f"first open {e['open_s'] * 1e3:,.0f} ms")
            if e.get("stopped_early"):
                what = f"{e['batches']:,} batches" if "batches" in e else \
                    f"{e['accesses']:,} accesses"
                notes.append(f"{what} (time cap)")
            if "duplicates" in e:
                ep = f" over {len(e['epochs'])} epochs" if len(e.get("epochs", [])) > 1 else ""
                notes.append(f"dup {e['duplicates']}, missing {e['missing']}{ep}")
            if "anon_bytes_per_sample" in e and fig in (RA_FIG, BATCH_FIG, FIELDS_FIG):
                notes.append(f"heap {max(e['anon_bytes_per_sample'], 0):,.0f} B/sample")
            if "peak_rss_mb" in e and fig != "scale: open + random access":
                notes.append(f"peak RSS {e['peak_rss_mb']:,.0f} MB")
            if "disk_bytes_per_sample" in e:
                notes.append(f"disk {e['disk_bytes_per_sample']:,.0f} B/sample "
                             f"(+{e['overhead_pct']:.1f}%)")
            if "index_bytes_per_sample" in e:
                notes.append(f"index {e['index_bytes_per_sample']:,.1f} B/sample")
            if "open_ms" in e:
                notes.append(f"open {e['open_ms']:.2f} ms, pickled {e['pickled_dataset_bytes']} B")
            if isinstance(e.get("shuffle"), dict):
                q = e["shuffle"]
                notes.append(f"shuffle disp {q['disp']:.3f} adj {q['adj']:.3f} "
                             f"near16 {q['near16']:.3f}")
            if "gb_s" in e:
                notes.append(f"{e['gb_s']:.2f} GB/s of tar, {e['members']:,} members")
            if "first_batch_s" in e and e["first_batch_s"] is not None:
                notes.append(f"first batch {e['first_batch_s']:.2f} s, whole first epoch "
                             f"{e['epoch_samples_per_s']:,.0f}/s")
            if e.get("torchvision_stub"):
                notes.append("torchvision stubbed")
            if e.get("note"):
                notes.append(e["note"])
            sps = fmt_num(r.samples_per_s) if r.status == "ok" else "-"
            mbs = fmt_num(r.mb_per_s) if r.status == "ok" else "-"
            lines.append(f"| {fig} | {r.contender} | {sps} | {mbs} | {vs} | {of} | "
                         f"{'; '.join(notes)} |")
    return "\n".join(lines)


def goals(results: list[Result]) -> list[dict[str, Any]]:
    def sps(fig: str, c: str) -> float | None:
        r = _get(results, fig, c)
        return r.samples_per_s if r else None

    out = []

    def goal(name: str, value: float | None, target: float, unit: str = "x") -> None:
        met = None if value is None else value >= target
        out.append({"goal": name, "value": value, "target": target, "met": met})

    RA, DL, ST = "random access ds[i]", "DataLoader epoch (2 workers)", \
        "streaming epoch, 1 process, shuffled"
    ti = sps(RA, "tarindex")

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    goal("random access / mmap-slice limit >= 0.8", ratio(ti, sps(RA, "mmap-slice limit")), 0.8)
    goal("random access / wids >= 4", ratio(ti, sps(RA, "wids")), 4)
    goal("random access / MDS >= 4", ratio(ti, sps(RA, "MDS")), 4)
    ts = sps(ST, "tarindex streaming")
    goal("streaming / webdataset+buffer >= 2", ratio(ts, sps(ST, "webdataset +shuffle buffer")), 2)
    goal("streaming / litdata >= 1", ratio(ts, sps(ST, "litdata")), 1)
    goal("DataLoader batched / per-sample mmap ceiling >= 2",
         ratio(sps(DL, "tarindex batched"), sps(DL, "mmap-slice ceiling (per-sample)")), 2)
    goal("index build / tarfile >= 10",
         ratio(sps("index build", "tarindex scan"), sps("index build", "tarfile getmembers")), 10)
    w = _get(results, RA, "wids")
    t = _get(results, "write", "tarindex")
    if w and t:
        wb = max(w.extra["anon_bytes_per_sample"], 1e-9)
        goal("memory/sample: wids heap / tarindex index >= 10",
             wb / t.extra["index_bytes_per_sample"], 10)
    ok = [r for r in results if r.contender.startswith("tarindex") and "duplicates" in r.extra]
    exact = all(r.extra["duplicates"] == 0 and r.extra["missing"] == 0 for r in ok)
    out.append({"goal": "exactly-once in every tarindex DataLoader/stream config",
                "value": [f"{r.contender}/{r.figure}: dup {r.extra['duplicates']} missing "
                          f"{r.extra['missing']}" for r in ok], "target": 0,
                "met": exact if ok else None})
    return out


CHART_FIGS = [RA_FIG, BATCH_FIG, FIELDS_FIG, "DataLoader epoch (2 workers)",
              "streaming epoch, 1 process, shuffled", "index build", "write"]


def chart(results: list[Result], path: str, title: str = "") -> str | None:
    """One horizontal bar panel per figure (samples/s, log scale), failed rows marked, plus the
    scale panel; red: tarindex, gray: limits and ceilings, blue: peers."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"no chart: {e}"
    figs = [f for f in CHART_FIGS if any(r.figure == f for r in results)]
    has_scale = any(r.figure.startswith("scale") and r.status == "ok" for r in results)
    panels = len(figs) + int(has_scale)
    if not panels:
        return "no chart: no results"
    cols = 3 if panels > 4 else panels
    rows_n = -(-panels // cols)
    fig, grid = plt.subplots(rows_n, cols, figsize=(7.5 * cols, 5.2 * rows_n), squeeze=False)
    axes = list(grid.ravel())
    for ax, f in zip(axes, figs, strict=False):
        rows = [r for r in results if r.figure == f]
        ok = [r.samples_per_s for r in rows if r.status == "ok" and r.samples_per_s]
        floor = min(ok) / 3 if ok else 1.0
        names = [r.contender for r in rows]
        vals = [r.samples_per_s if r.status == "ok" and r.samples_per_s else floor for r in rows]
        colors = ["white" if r.status != "ok" else
                  "tab:gray" if "limit" in r.contender or "ceiling" in r.contender else
                  "tab:red" if r.contender.startswith("tarindex") else "tab:blue" for r in rows]
        ax.barh(names, vals, color=colors, edgecolor="black", linewidth=0.3)
        ax.set_xscale("log")
        ax.set_title(f, fontsize=10)
        ax.set_xlabel("members/s (log)" if f == "index build" else "samples/s (log)")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
        for y, (r, v) in enumerate(zip(rows, vals, strict=True)):
            text = f" {v:,.0f}" if r.status == "ok" else f" {r.status[:60]}"
            ax.text(v, y, text, va="center", fontsize=7,
                    color="black" if r.status == "ok" else "tab:red")
        if ok:
            ax.set_xlim(floor, max(ok) * 6)
        else:
            ax.set_xlim(0.5, 1e3)
            ax.set_xticks([])
    if has_scale:
        ax = axes[len(figs)]
        sc = [r for r in results if r.figure.startswith("scale") and r.status == "ok"]
        ns = [r.extra["n"] for r in sc]
        ax.plot(ns, [r.extra["open_ms"] for r in sc], "o-", label="open (ms)")
        ax2 = ax.twinx()
        ax2.plot(ns, [r.samples_per_s for r in sc], "s--", color="tab:red",
                 label="random ds[i]/s")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax2.set_ylim(bottom=0)
        ax.legend(loc="lower left")
        ax2.legend(loc="lower right")
        ax.set_xlabel("samples in the shard")
        ax.set_ylabel("open ms")
        ax2.set_ylabel("samples/s")
        ax.set_title("scale: tarindex open time and ds[i]/s", fontsize=10)
    for ax in axes[panels:]:
        ax.axis("off")
    fig.suptitle("tarindex vs peers (red: tarindex, gray: physical limits, blue: peers, "
                 "white: failed; higher is better)" + (f"\n{title}" if title else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return None


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "nproc": os.cpu_count()}
    try:
        import torch

        info["torch"] = torch.__version__
    except Exception:
        pass
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "L3 cache"):
                info[k.strip()] = v.strip()
    except Exception:
        pass
    with open("/proc/meminfo") as f:
        info["mem_total_gb"] = round(int(f.readline().split()[1]) / 2**20, 1)
    info["loadavg_at_start"] = os.getloadavg()
    versions = {}
    for mod in ("tarindex", "webdataset", "wids", "litdata", "ratarmountcore", "numpy"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001
            versions[mod] = f"unavailable: {type(e).__name__}"
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("mosaicml-streaming", "wids", "array-record", "pylance", "tfrecord", "pyarrow"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = "not installed"
    info["versions"] = versions
    try:  # which tarindex was measured: its directory, the repo's commit, local changes
        import tarindex

        info["tarindex_path"] = os.path.dirname(os.path.abspath(tarindex.__file__))
        repo = os.path.dirname(HERE)

        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                                   timeout=10).stdout.strip()

        info["repo_commit"] = git("rev-parse", "--short", "HEAD")
        info["tarindex_modified"] = bool(git("status", "--porcelain", "--", "tarindex"))
    except Exception as e:  # noqa: BLE001
        info["tarindex_path"] = f"unavailable: {type(e).__name__}: {e}"
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k samples, about 2 minutes")
    ap.add_argument("--n", type=int, help="samples (overrides the mode)")
    ap.add_argument("--data", default=os.path.join(HERE, "_data"))
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--only", help="comma-separated tasks: write,seqread,random,batch,fields,"
                                   "loader,stream,index,scale (write must have run once before)")
    ap.add_argument("--match", help="comma-separated substrings: run only the contenders "
                                    "whose name contains one (case-insensitive)")
    ap.add_argument("--update-readme", action="store_true",
                    help="replace the results section of benchmarks/README.md with this run")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return child_main(*a.child)
    n = a.n or (10_000 if a.quick else 100_000)
    spec = Spec(n=n, per_shard=1_000 if n <= 20_000 else 5_000,
                n_access=min(n, 10_000 if a.quick else 50_000),
                root=os.path.abspath(os.path.join(a.data, "quick" if a.quick else f"n{n}")),
                ra_seconds=3.0 if a.quick else 15.0, loader_epochs=2 if a.quick else 1,
                scale=[10_000, 100_000, 1_000_000])
    os.makedirs(spec.root, exist_ok=True)
    os.makedirs(a.out, exist_ok=True)
    info = machine()
    print(f"tarindex benchmarks: {n:,} samples, {spec.per_shard:,}/shard, "
          f"{Payloads(n).total_bytes / MB:,.0f} MB payload; data in {spec.root}")
    print(f"machine: {info.get('Model name')}, {info['nproc']} cores, "
          f"load {info['loadavg_at_start']}")
    t0 = time.time()
    only = set(a.only.split(",")) if a.only else None
    match = [m.strip().lower() for m in a.match.split(",")] if a.match else None
    results = run_all(spec, only, match)
    info["loadavg_at_end"] = os.getloadavg()
    info["wall_s"] = time.time() - t0
    tab = table(results, spec)
    gl = goals(results)
    print()
    print(tab)
    print()
    for g in gl:
        v = g["value"]
        vs = f"{v:.2f}" if isinstance(v, float) else str(v)
        print(f"  goal {'MET ' if g['met'] else 'open' if g['met'] is False else '  ? '} "
              f"{g['goal']}: {vs}")
    print(f"\nwall {info['wall_s']:.0f} s, load avg start {info['loadavg_at_start']} "
          f"end {info['loadavg_at_end']}")
    mode = "quick" if a.quick else "full"
    stem = os.path.join(a.out, f"results-{mode}")
    dump_json({"spec": spec.__dict__, "machine": info, "goals": gl,
               "results": [r.to_json() for r in results]}, stem + ".json")
    with open(stem + ".md", "w") as f:
        f.write(tab + "\n")
    title = (f"python benchmarks/run.py{' --quick' if a.quick else ''} ({mode} run, "
             f"{n:,} samples), {time.strftime('%Y-%m-%d', time.gmtime())}, "
             f"{info.get('nproc')} cores, warm page cache")
    err = chart(results, stem + ".png", title)
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if err is None else f" ({err})"))
    if a.update_readme:
        if err is None:  # the tracked copy that benchmarks/README.md and README.md show
            shutil.copyfile(stem + ".png", os.path.join(HERE, "chart.png"))
            print(f"wrote {os.path.join(HERE, 'chart.png')}")
        update_readme(os.path.join(HERE, "README.md"), tab, gl, info, spec, mode)
    return 0


def update_readme(path: str, tab: str, gl: list[dict[str, Any]], info: dict[str, Any],
                  spec: Spec, mode: str) -> None:
    """Replace the text between the results markers of the README with this run."""
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    with open(path) as f:
        text = f.read()
    if start not in text or end not in text:
        print(f"{path}: no {start} ... {end} markers; not updated")
        return
    v = info.get("versions", {})
    goals_md = "\n".join(
        f"- {'met' if g['met'] else 'OPEN' if g['met'] is False else 'not measured'}: "
        f"{g['goal']}: " + (f"**{g['value']:.2f}**" if isinstance(g["value"], float)
                            else f"{g['value']}") for g in gl)
    la0, la1 = info["loadavg_at_start"], info["loadavg_at_end"]
    here = os.path.join(os.path.dirname(HERE), "tarindex")
    tpath = info.get("tarindex_path", "?")
    if tpath == here:
        where = (f"this repository's `tarindex/` at commit {info.get('repo_commit')}"
                 + (" with uncommitted changes" if info.get("tarindex_modified") else ""))
    else:
        where = f"`{tpath}` (repository at commit {info.get('repo_commit')})"
    body = f"""{start}
Run: `python benchmarks/run.py --{mode}` ({"quick" if mode == "quick" else "full"} mode),
{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, {info["wall_s"]:.0f} s wall; tarindex
{v.get("tarindex")} imported from {where}.
Dataset: {spec.n:,} samples, {spec.per_shard:,} per tar shard, payload ~10 KB (90%) or ~100 KB
(10%) plus a `cls` label, mean {Payloads(spec.n).total_bytes / spec.n / 1e3:.1f} KB; warm page
cache.

Machine: {info.get("Model name")}, {info["nproc"]} cores (KVM guest), {info["mem_total_gb"]} GB RAM;
Python {info["python"]}, torch {info.get("torch")}, numpy {v.get("numpy")}; webdataset
{v.get("webdataset")}, wids {v.get("wids")}, mosaicml-streaming {v.get("mosaicml-streaming")},
litdata {v.get("litdata")}, ratarmountcore {v.get("ratarmountcore")}, array-record
{v.get("array-record")}, pylance {v.get("pylance")}, tfrecord {v.get("tfrecord")}. Load average (1/5/15 min)
at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, at end {la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f}
(the machine is shared: other processes were running).

![benchmark chart: samples/s per contender per figure, log scale](chart.png)

{tab}

Goals of issue 5:

{goals_md}
{end}"""
    a, b = text.index(start), text.index(end) + len(end)
    with open(path, "w") as f:
        f.write(text[:a] + body + text[b:])
    print(f"updated {path}")


if __name__ == "__main__":
    sys.exit(main())
