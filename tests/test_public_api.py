"""The public API: a small ``__all__`` that resolves, without importing torch until asked."""

from __future__ import annotations

import subprocess
import sys

import tarindex
import tarindex.errors

PUBLIC = {
    "__version__",
    "ShardWriter",
    "TarWriter",
    "write_shards",
    "build_index",
    "verify",
    "ShardReader",
    "ShardSet",
    "OpenOptions",
    "RemoteOptions",
    "read_kernel",
    "write_manifest",
    "split_by_key",
    "to_tuple",
    "ImageDecode",
    "TarIndexError",
    "FormatError",
    "StaleIndexError",
    "DecodeError",
    "TarDataset",
    "TarIterableDataset",
    "BlockSampler",
    "MixedDataset",
    "MixSampler",
    "collate_batched",
}


def test_all_is_the_small_public_api() -> None:
    assert set(tarindex.__all__) == PUBLIC
    assert len(tarindex.__all__) == len(PUBLIC)  # no name twice


def test_every_public_name_resolves_and_every_error_is_in_errors() -> None:
    for name in tarindex.__all__:
        assert getattr(tarindex, name) is not None, name
    errors = {
        n
        for n, v in vars(tarindex.errors).items()
        if isinstance(v, type) and issubclass(v, Exception)
    }
    assert {"TarIndexError", "FormatError", "StaleIndexError", "DecodeError"} <= errors
    for name in errors & set(tarindex.__all__):
        assert getattr(tarindex, name) is getattr(tarindex.errors, name)
    for gone in ("WriterError", "TruncatedError", "ShardSubset", "scan", "task_pattern"):
        assert not hasattr(tarindex, gone), gone  # in tarindex.errors or the subpackages


def test_import_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import tarindex\n"
        "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
        "print(len(tarindex.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(PUBLIC)
