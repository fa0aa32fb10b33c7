"""Resume states: the one set of checks a saved state passes before a plan resumes from it.

Every resumable object (the streaming datasets, the mix, the samplers) saves a small dict
(docs/STREAMING.md, "Resume") and checks it on load here, in this order:

1. **Shape**: a dict with every key its version has (:func:`check_state` names the missing
   ones and lists the expected keys); ``version`` is :data:`STATE_VERSION` or ``1``.
2. **Fields**: ``seed`` and ``epoch`` integers in ``[0, 2**64)``, ``consumed >= 0``,
   ``world_size >= 1``, ``rank`` and ``worker`` in range (:func:`tarindex.plan.checks.check_int`:
   a float or a string is refused, not truncated).
3. **Plan parameters**: equal to the loading object's (block size, counts, ...), else the
   message names the field; a streaming state also needs the same world size.
4. **Shard layout** (:func:`shard_layout`): a shuffled plan cuts blocks per shard and
   permutes the shards, so the same samples re-sharded (4 x 25 -> 2 x 50) are another plan and
   a resumed position another sample. A state records each source's layout and is refused on
   another one, naming both. Unshuffled, position ``k`` is sample ``k`` whatever the layout,
   so the layout is not compared. Version 1 states (saved before the layout was recorded)
   load only where the layout cannot matter.
5. **Position**: ``consumed`` within what the saved worker or rank plays this epoch
   (:func:`check_consumed`; the owner computes that count).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .checks import check_int, check_u64

__all__ = ["STATE_VERSION", "shard_layout", "check_state", "check_consumed"]

STATE_VERSION = 2
"""Version of every resume state; 2 added ``layout`` (version 1 states load where safe)."""
_COMMON = ("version", "seed", "epoch", "consumed", "layout")
_NEXT_EPOCH = (
    "start the next epoch on these shards instead (set_epoch(state['epoch'] + 1), without "
    "load_state_dict)"
)


def shard_layout(counts: Any) -> list[int]:
    """Return the layout a state records: ``[n_shards, crc32 of the counts as <i8]``.

    Args:
        counts: Samples per shard, shape ``(n_shards,)``, integers.

    Returns:
        Two ints: the number of shards and ``zlib.crc32`` of the counts as little-endian
        ``int64`` bytes (with the state's ``n_samples`` it pins the per-shard counts).
    """
    c = np.ascontiguousarray(np.asarray(counts, dtype="<i8"))
    return [int(c.size), zlib.crc32(c.tobytes())]


def check_state(
    state: Any,
    *,
    what: str,
    mine: Mapping[str, Any],
    extra: Sequence[str],
    layouts: Sequence[list[int]],
    shuffled: Sequence[bool],
    sizes: Sequence[int],
    nested: bool = False,
    v1_defaults: Mapping[str, Any] | None = None,
    same: str = "shards",
) -> dict[str, Any]:
    """Check a saved state against the object loading it (module docstring, steps 1 to 4).

    Args:
        state: What ``load_state_dict`` was given.
        what: The loading object's class name, for messages.
        mine: The plan parameters the state must equal (``block_size``, ...). With
            ``world_size`` among them (streaming states), another world size is refused with
            what to do instead.
        extra: Further keys the state must hold, not compared (``worker``, ``legs``, ...).
        layouts: :func:`shard_layout` of each source now (one for a single dataset).
        shuffled: Per source, whether its plan depends on the layout (its ``shuffle``).
        sizes: Samples per source, for messages.
        nested: The state's ``layout`` is a list of per-source layouts (a mix) rather than
            one layout. Defaults to ``False``.
        v1_defaults: Keys a version 1 state may lack, with their values. Defaults to none.
        same: What else must be the same, for the message on other plan parameters.
            Defaults to ``"shards"``.

    Returns:
        A copy of the state, integer fields as Python ints, version 1 defaults filled in.

    Raises:
        ValueError: Not a dict; an unknown version; missing keys (all named, with the keys
            expected); a field out of range or not an integer; another plan parameter, world
            size or shard layout (naming both and what to do); a version 1 state of a plan
            that depends on the layout.
    """
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{what}.load_state_dict: expected a dict from {what}.state_dict(), got "
            f"{type(state).__name__}"
        )
    version = state.get("version", STATE_VERSION)
    if version not in (1, STATE_VERSION) or isinstance(version, bool):
        raise ValueError(
            f"{what} state version {version!r}: this tarindex reads versions 1 and "
            f"{STATE_VERSION}; save the state again with this version"
        )
    keys = [*_COMMON, *extra, *mine]
    out = dict(state)
    if version == 1:
        keys.remove("layout")
        for k, v in (v1_defaults or {}).items():
            out.setdefault(k, v)
    missing = sorted(k for k in keys if k not in out)
    if missing:
        raise ValueError(
            f"{what} state is missing {', '.join(map(repr, missing))}: expected the keys "
            f"{', '.join(map(repr, sorted(keys)))} (a dict saved by {what}.state_dict())"
        )
    _check_fields(out)
    if "world_size" in mine and out["world_size"] != mine["world_size"]:
        raise ValueError(
            f"state saved with world_size={out['world_size']!r}, this run has "
            f"world_size={mine['world_size']!r}: a streaming state resumes only on the same "
            "rank of the same world size (each worker's state covers its own part of the "
            "plan). Resume on the old world size, start the next epoch "
            "(set_epoch(state['epoch'] + 1)) on the new one, or read map-style (TarDataset "
            "with BlockSampler or MixSampler), whose samplers deal what is left over a new "
            "world size"
        )
    for k, v in mine.items():
        if out[k] != v:
            raise ValueError(
                f"state {k}={out[k]!r} but this {what} has {k}={v!r}: resuming would not "
                f"replay the same plan; construct it with the same {k} (and {same}) as the "
                "one that saved the state"
            )
    _check_layouts(out, version, what, layouts, shuffled, sizes, nested)
    return out


def _check_fields(st: dict[str, Any]) -> None:
    """Step 2: the integer fields, in place (Python ints)."""
    st["seed"] = check_u64("state seed", st["seed"])
    st["epoch"] = check_u64("state epoch", st["epoch"])
    st["consumed"] = check_int("state consumed", st["consumed"])  # range: check_consumed
    if "world_size" in st:
        st["world_size"] = check_int("state world_size", st["world_size"], 1)
        if "rank" in st:
            st["rank"] = check_int("state rank", st["rank"], 0, st["world_size"])
    if "num_workers" in st:
        st["num_workers"] = check_int("state num_workers", st["num_workers"], 1)
        st["worker"] = check_int("state worker", st.get("worker"), 0, st["num_workers"])
    if "legs" in st:
        legs = st["legs"]
        if not isinstance(legs, (list, tuple)) or not all(
            isinstance(x, (list, tuple)) and len(x) == 2 for x in legs
        ):
            raise ValueError(f"state legs={legs!r}: expected a list of [world_size, consumed]")
        st["legs"] = [
            [check_int("state legs world_size", w, 1), check_int("state legs consumed", k, 0)]
            for w, k in legs
        ]


def _check_layouts(
    st: dict[str, Any],
    version: int,
    what: str,
    layouts: Sequence[list[int]],
    shuffled: Sequence[bool],
    sizes: Sequence[int],
    nested: bool,
) -> None:
    """Step 4: the shard layout of every source whose plan depends on it."""
    if version == 1:
        if any(shuffled):
            raise ValueError(
                f"{what} state version 1 does not record the shard layout (per-shard sample "
                "counts), and this shuffled plan depends on it: blocks are cut per shard and "
                "the shards permuted, so the state cannot be checked against these shards. "
                f"Resume it with the tarindex that saved it, or {_NEXT_EPOCH}"
            )
        return
    saved = st["layout"]
    rows = saved if nested else [saved]
    ok = isinstance(rows, (list, tuple)) and len(rows) == len(layouts)
    ok = ok and all(
        isinstance(r, (list, tuple)) and len(r) == 2 and all(type(x) is int for x in r)
        for r in rows
    )
    if not ok:
        want = "one [n_shards, crc32] per source" if nested else "[n_shards, crc32]"
        raise ValueError(f"state layout={saved!r}: expected {want}")
    st["layout"] = [list(r) for r in rows] if nested else list(saved)
    for s, (old, new, shuf) in enumerate(zip(rows, layouts, shuffled, strict=True)):
        if shuf and list(old) != list(new):
            src = f" (source {s})" if nested else ""
            raise ValueError(
                f"{what} state was saved on another shard layout{src}: {old[0]} shards "
                f"(per-shard counts crc32 0x{old[1]:08x}) then, {new[0]} shards (crc32 "
                f"0x{new[1]:08x}) now, of {sizes[s]} samples. A shuffled plan cuts blocks per "
                "shard and permutes the shards, so on other shards the same position is "
                "another sample (some would be yielded twice, others never). Resume on the "
                f"shards that saved the state, or {_NEXT_EPOCH}"
            )


def check_consumed(consumed: int, share: int, who: str, epoch: int) -> None:
    """Step 5: ``0 <= consumed <= share``.

    Args:
        consumed: The state's ``consumed``.
        share: Positions the saved worker (or rank) plays in ``epoch``.
        who: Which, for the message (``"worker 0 of 2 of rank 0"``).
        epoch: The state's epoch.

    Raises:
        ValueError: Naming the count and the range.
    """
    if not 0 <= consumed <= share:
        raise ValueError(
            f"state consumed={consumed}: expected 0..{share}, the positions {who} plays in "
            f"epoch {epoch}; the state is not from this plan (same samples, same parameters)"
        )
