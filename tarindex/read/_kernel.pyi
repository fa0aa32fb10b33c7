"""Types of the compiled read-kernel loops (``tarindex/read/_kernel.c``); see ``tarindex.read.kernel``."""

from collections.abc import Callable, Collection, Sequence
from typing import Any

from .hot import HandBack, Packed

class Mapped:
    def __init__(
        self,
        fd: int,
        size: int,
        dev: int,
        ino: int,
        mtime_ns: int,
        fault: Callable[[int], BaseException | None],
    ) -> None: ...
    def __len__(self) -> int: ...
    def __getitem__(self, item: slice) -> bytes: ...
    def check(self) -> None: ...
    def willneed(self, start: int, end: int) -> None: ...

class Tables:
    def __init__(
        self,
        key_ptr: Any,
        sample_ptr: Any,
        keys: Any,
        key_base: int,
        key_end: int,
        ext_id: Any,
        offset: Any,
        size: Any,
        data: Any,
        exts: tuple[str, ...],
        checked: bytearray,
    ) -> None: ...
    def samples(
        self, j0: int, j1: int, want: bytes | None, shard: str, base: int
    ) -> list[dict[str, Any]] | HandBack: ...

def sample(
    i: int,
    starts: bytes,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
    fields: Collection[str] | None = None,
) -> dict[str, Any] | HandBack: ...
def take(
    indices: list[int],
    starts: bytes,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
) -> list[dict[str, Any]] | HandBack: ...
def gather(
    tables: tuple[Tables, ...], shards: tuple[int, ...], slot: Any, local: Any
) -> tuple[list[str], bytes, bytes, bytes, bytes] | HandBack: ...
def batch(
    indices: Sequence[int],
    starts: Any,
    per: int,
    readers: dict[int, Any],
    paths: list[str],
    fields: Collection[str] | None,
    int_fields: Collection[str],
    alloc: Callable[[int], tuple[Any, Any]],
) -> Packed | HandBack: ...
def pack(
    out: Any,
    datas: tuple[Any, ...],
    src: Any,
    offset: Any,
    size: Any,
    dest: Any,
    vals: Any,
    start: int,
) -> HandBack | None: ...
