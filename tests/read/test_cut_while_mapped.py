"""A local tar cut or rewritten by another process after it was opened (issue 19 items 3, 8).

Item 3: a tar truncated while mapped is ``TruncatedError`` naming the file, never SIGBUS, on
every read path, in-process and in DataLoader workers (``tools/cut_while_mapped.py``: a
forked reader loops over reads while this process truncates the tar; 3 trials per path here,
100 in the slow test). Item 8: a tar changed in place after open (same size, a member renamed
in its header, appended to) is ``StaleIndexError`` at the next read (one ``fstat``, compared
with the one at open); a tar replaced by a rename keeps being read as the file opened.
Both kernel modes (``TARINDEX_PURE_PYTHON``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tarindex
from tarindex.errors import StaleIndexError
from tests.conftest import MakeShards

ROOT = Path(__file__).resolve().parents[2]
MODES = ["0", "1"]
"""``TARINDEX_PURE_PYTHON``: the compiled kernel, then its twin."""


def _cut_trials(
    trials: int, pure: str, paths: list[str] | None = None
) -> dict[str, dict[str, int]]:
    pytest.importorskip("torch")
    env = dict(os.environ, TARINDEX_PURE_PYTHON=pure, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, str(ROOT / "tools" / "cut_while_mapped.py"), "--trials", str(trials),
           "--json"]  # fmt: skip
    if paths:
        cmd += ["--paths", *paths]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500)
    assert p.returncode == 0, p.stderr[-3000:]
    got: dict[str, dict[str, int]] = json.loads(p.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pure", MODES)
def test_a_tar_cut_while_mapped_is_an_error_on_every_path(pure: str) -> None:
    got = _cut_trials(2, pure)
    assert len(got) == 10  # 5 paths, in-process and with 2 DataLoader workers
    for path, counts in got.items():
        assert counts == {"error": 2}, (path, counts)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("pure", MODES)
def test_a_tar_cut_while_mapped_100_trials(pure: str) -> None:
    got = _cut_trials(100, pure)
    for path, counts in got.items():
        assert counts == {"error": 100}, (path, counts)


def _rewrite(path: str, how: str) -> None:
    """Change the tar at ``path`` after it was opened, as another process would."""
    data = Path(path).read_bytes()
    if how == "same-size":  # other bytes in one member's data, in place
        at = data.index(b"sample 3")
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"SAMPLE 3")
    elif how == "renamed":  # a member renamed in its header (the checksum kept right)
        at = data.index(b"00000001.txt")
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"00000001.zzz")
    else:  # appended to
        with open(path, "ab") as f:
            f.write(bytes(512))


@pytest.mark.parametrize("how", ["same-size", "renamed", "appended"])
@pytest.mark.parametrize("pure", MODES)
@pytest.mark.parametrize("use_mmap", [True, False])
def test_a_tar_changed_after_open_is_stale(
    make_shards: MakeShards, how: str, pure: str, use_mmap: bool
) -> None:
    (path,) = make_shards([8])
    os.utime(path, ns=(10**18, 10**18))  # the mtime moves on a change, whatever the clock
    code = f"""
import sys, tarindex
from tarindex.errors import StaleIndexError
ss = tarindex.ShardSet([{path!r}], options=tarindex.OpenOptions(use_mmap={use_mmap}))
ds = tarindex.TarDataset(ss)
assert ds[3]["txt"] == b"sample 3"
sys.stdout.write("opened\\n"); sys.stdout.flush()
sys.stdin.readline()  # the tar is changed now
for read in (lambda: ds[3], lambda: ds.__getitems__([1, 3]), lambda: ss.takes().read_samples(0, 0, 8)):
    try:
        read()
    except StaleIndexError as e:
        assert {path!r} in str(e) and "tarindex index --force" in str(e), e
    else:
        raise SystemExit("read silently")
print("stale")
"""
    env = dict(os.environ, TARINDEX_PURE_PYTHON=pure, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "opened"
    _rewrite(path, how)
    out, err = p.communicate("\n", timeout=120)
    assert p.returncode == 0 and out.strip() == "stale", err[-3000:]


def test_a_tar_replaced_by_rename_keeps_the_file_opened(make_shards: MakeShards) -> None:
    """``mv new.tar shard.tar`` after open: the open reader reads the file it opened (whose
    index it checked), never the new one's bytes; a new open checks the new file. (The
    suite runs in both kernel modes.)"""
    (path,) = make_shards([8])
    (other,) = make_shards([8], seed=1, name="other")
    ds = tarindex.TarDataset([path])
    before = [ds[i] for i in range(8)]
    os.replace(other, path)  # same size, other bytes: the old index no longer describes it
    assert [ds[i] for i in range(8)] == before
    with pytest.raises(StaleIndexError, match="tarindex index --force"):
        tarindex.TarDataset([path])[0]
