"""The main job on real data: ``tarindex demo``.

Takes scikit-learn's handwritten digits (1,797 images of 8x8 pixels, 10 classes; shipped inside
the scikit-learn wheel, so nothing is downloaded), and runs the whole tarindex pipeline on them:

1. holds out a seeded, stratified test split (20 %);
2. writes the train images as PNG + ``cls`` into a few shards with :class:`tarindex.ShardWriter`
   (indexes written in the same pass), and the test images into one more shard;
3. writes a copy of the train files as ``NNNN.png`` / ``NNNN.cls`` into a directory, packs it with
   the system ``tar`` command (``tar cf``), rebuilds its index with :func:`tarindex.build_index`,
   and checks that both datasets hold the same samples, byte for byte;
4. times random access: a seeded random permutation of ``ds[i]`` reads in one process;
5. trains a small MLP for a few epochs through
   ``DataLoader(TarDataset(..., decode="l8"), shuffle=True, num_workers=2)`` and prints the
   accuracy on the held-out split (a correct pipeline gets well above 90 %; labels scrambled
   by a wrong index would fall toward 10 %).

Needs the ``demo`` extra (``pip install -c constraints.txt -e ".[demo]"`` from a clone: torch
and scikit-learn). torch is imported inside the functions that train, so importing this module
does not import torch.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .common import Failure

__all__ = ["DemoResult", "MissingExtraError", "run", "command", "DEFAULT_EPOCHS"]

DEFAULT_EPOCHS = 12
"""Training epochs of :func:`run` unless told otherwise."""

_INSTALL_HINT = 'pip install -c constraints.txt -e ".[demo]" (from a clone of the repository)'


class MissingExtraError(ImportError):
    """An optional dependency of the demo (torch, scikit-learn) is not installed."""


@dataclass
class DemoResult:
    """What :func:`run` measured."""

    workdir: str
    """Directory that holds ``shards/`` and ``tar/`` (deleted afterwards unless given)."""
    train_shards: list[str]
    """Paths of the train shards written by :class:`tarindex.ShardWriter`."""
    test_shards: list[str]
    """Paths of the held-out test shards."""
    tar_copy: str | None
    """Path of the train copy packed by the ``tar`` command, or ``None`` if ``tar`` is missing."""
    n_train: int
    """Number of train samples."""
    n_test: int
    """Number of held-out test samples."""
    same_samples: bool
    """True if the ``tar`` copy and the shards hold the same keys and bytes (always checked
    when ``tar`` exists; :func:`run` raises otherwise)."""
    random_access_per_s: float
    """Random-access raw ``ds[i]`` reads per second, one process."""
    decoded_per_s: float
    """Random-access ``ds[i]`` reads per second with PNG decoding (``decode="l8"``)."""
    losses: list[float] = field(default_factory=list)
    """Mean training loss (cross-entropy, nats) of each epoch."""
    accuracy: float = 0.0
    """Accuracy on the held-out test split, in ``[0, 1]``."""
    seconds: float = 0.0
    """Wall time of the whole run, in seconds."""


def _require() -> tuple[Any, Any]:
    """Import scikit-learn's digits loader and torch, or raise MissingExtraError."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped,unused-ignore]
        from sklearn.model_selection import train_test_split  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise MissingExtraError(
            f"tarindex demo needs scikit-learn (its handwritten digits); run: {_INSTALL_HINT}"
        ) from None
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingExtraError(f"tarindex demo needs torch; run: {_INSTALL_HINT}") from None
    return load_digits, train_test_split


def _png(img: NDArray[np.uint8]) -> bytes:
    """Encode a ``uint8`` array of shape ``(H, W)`` as a greyscale PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img, mode="L").save(buf, format="PNG")
    return buf.getvalue()


def to_xy(sample: dict[str, Any]) -> tuple[NDArray[np.float32], int]:
    """Turn a decoded digit sample into ``(x, label)``.

    Args:
        sample: A sample decoded with ``decode="l8"``: ``"png"`` a ``uint8`` array of shape
            ``(8, 8)``, ``"cls"`` an int in ``[0, 10)``.

    Returns:
        ``x`` of shape ``(64,)``, ``float32`` in ``[0, 1]``, and the label.
    """
    return sample["png"].reshape(-1).astype(np.float32) / 255.0, sample["cls"]


def _write_shards(
    pattern: str, keys: Sequence[str], pngs: Sequence[bytes], labels: Sequence[int], maxcount: int
) -> list[str]:
    import tarindex

    with tarindex.ShardWriter(pattern, maxcount=maxcount, mtime=0, seed=0) as sink:
        for key, png, label in zip(keys, pngs, labels, strict=True):
            sink.write({"__key__": key, "png": png, "cls": int(label)})
    return sink.paths


def _tar_copy(
    root: str, keys: Sequence[str], pngs: Sequence[bytes], labels: Sequence[int]
) -> str | None:
    """Write ``NNNN.png``/``NNNN.cls`` files, ``tar cf`` them, index the tar; None without tar."""
    import tarindex

    tar = shutil.which("tar")
    if tar is None:
        return None
    files = os.path.join(root, "files")
    os.makedirs(files, exist_ok=True)
    names: list[str] = []
    for key, png, label in zip(keys, pngs, labels, strict=True):
        for ext, data in (("png", png), ("cls", str(int(label)).encode())):
            with open(os.path.join(files, f"{key}.{ext}"), "wb") as f:
                f.write(data)
            names.append(f"{key}.{ext}")
    out = os.path.join(root, "train-tar.tar")
    listing = os.path.join(root, "files.txt")
    with open(listing, "w") as f:
        f.write("\n".join(names) + "\n")
    subprocess.run([tar, "cf", out, "-C", files, "-T", listing], check=True)
    tarindex.build_index(out)
    return out


def _same_samples(a: Any, b: Any) -> None:
    """Raise RuntimeError unless two raw datasets hold the same keys and member bytes in order."""
    if len(a) != len(b):
        raise RuntimeError(f"tar copy has {len(b)} samples, the shards {len(a)}")
    for i in range(len(a)):
        sa, sb = a.raw(i), b.raw(i)
        da = {k: v for k, v in sa.items() if k not in ("__shard__", "__index__")}
        db = {k: v for k, v in sb.items() if k not in ("__shard__", "__index__")}
        if da != db:
            raise RuntimeError(
                f"sample {i} differs: shards {sa['__key__']!r} ({sa['__shard__']}), "
                f"tar copy {sb['__key__']!r} ({sb['__shard__']})"
            )


def _rate(ds: Any, n_reads: int, seed: int) -> float:
    """Read ``ds[i]`` over seeded random permutations, ``n_reads`` in all; return reads/s."""
    rng = np.random.default_rng(seed)
    n = len(ds)
    order = np.concatenate([rng.permutation(n) for _ in range(-(-n_reads // n))])[:n_reads]
    idx = order.tolist()
    ds[idx[0]]  # open the shard files outside the timing
    t0 = time.perf_counter()
    for i in idx:
        ds[i]
    return n_reads / (time.perf_counter() - t0)


def run(
    workdir: str | os.PathLike[str] | None = None,
    epochs: int = DEFAULT_EPOCHS,
    *,
    seed: int = 0,
    num_workers: int = 2,
    batch_size: int = 32,
    log: Callable[[str], None] | None = None,
) -> DemoResult:
    """Run the demo end to end (see the module docs) and return what it measured.

    Args:
        workdir: Directory for the shards (``shards/``) and the ``tar`` copy (``tar/``); files
            there with the same names are replaced. Defaults to a temporary directory that is
            deleted at the end.
        epochs: Training epochs, ``>= 1``. Defaults to :data:`DEFAULT_EPOCHS`.
        seed: Seeds the split, the shuffles, the model's initial weights and the timed reads.
            Defaults to ``0``.
        num_workers: DataLoader worker processes. Defaults to ``2``.
        batch_size: Training batch size, in samples. Defaults to ``32``.
        log: Called with each line of the report. Defaults to printing to stdout.

    Returns:
        A :class:`DemoResult`.

    Raises:
        MissingExtraError: torch or scikit-learn is not installed.
        ValueError: ``epochs < 1``.
        RuntimeError: The ``tar`` copy and the shards disagree (a broken index or scanner).
        subprocess.CalledProcessError: The ``tar`` command failed.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    t_start = time.perf_counter()
    load_digits, train_test_split = _require()
    say: Callable[[str], None] = log if log is not None else (lambda s: print(s, flush=True))
    tmp = None
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="tarindex-demo-")
        root = tmp
    else:
        root = os.fspath(workdir)
        os.makedirs(root, exist_ok=True)
    try:
        return _run(
            root,
            epochs,
            seed,
            num_workers,
            batch_size,
            say,
            t_start,
            load_digits,
            train_test_split,
            temporary=tmp is not None,
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(
    root: str,
    epochs: int,
    seed: int,
    num_workers: int,
    batch_size: int,
    say: Callable[[str], None],
    t_start: float,
    load_digits: Any,
    train_test_split: Any,
    temporary: bool = False,
) -> DemoResult:
    import tarindex

    # 1. data: 8x8 images with values 0..16 -> uint8 0..255, seeded stratified split
    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    tr, te = train_test_split(
        np.arange(len(labels)), test_size=0.2, random_state=seed, stratify=labels
    )
    say(
        f"digits: {len(labels)} images 8x8, 10 classes (scikit-learn); "
        f"{len(tr)} train / {len(te)} held-out test (seed {seed})"
    )

    # 2. shards with ShardWriter
    shard_dir = os.path.join(root, "shards")
    tr_keys = [f"{i:04d}" for i in range(len(tr))]
    tr_png = [_png(images[j]) for j in tr]
    tr_cls = labels[tr].tolist()
    te_keys = [f"{i:04d}" for i in range(len(te))]
    train_shards = _write_shards(
        os.path.join(shard_dir, "train-%06d.tar"), tr_keys, tr_png, tr_cls, maxcount=400
    )
    test_shards = _write_shards(
        os.path.join(shard_dir, "test-%06d.tar"),
        te_keys,
        [_png(images[j]) for j in te],
        labels[te].tolist(),
        maxcount=len(te),
    )
    nbytes = sum(os.path.getsize(p) for p in train_shards)
    say(
        f"wrote {len(train_shards)} train shards ({nbytes / 1024:.0f} KiB) + "
        f"{len(test_shards)} test shard with ShardWriter in {shard_dir}"
        + (
            " (a temporary directory, removed at the end; --workdir DIR keeps it)"
            if temporary
            else ""
        )
    )

    # 3. the same files packed by the tar command, indexed by build_index, compared
    train_raw = tarindex.TarDataset(train_shards)
    tar_copy = _tar_copy(os.path.join(root, "tar"), tr_keys, tr_png, tr_cls)
    if tar_copy is None:
        say("no `tar` command on PATH: skipped the tar copy check")
    else:
        _same_samples(train_raw, tarindex.TarDataset(tar_copy))
        say(
            f"tar cf + tarindex.build_index: {tar_copy} holds the same {len(train_raw)} "
            f"samples as the shards (keys and bytes)"
        )

    # 4. random access, one process
    rate = _rate(train_raw, 50_000, seed)
    decoded = _rate(tarindex.TarDataset(train_shards, decode="l8"), 5_000, seed + 1)
    say(
        f"random access, 1 process: {rate:,.0f} samples/s raw ds[i], "
        f"{decoded:,.0f} samples/s with PNG decode"
    )

    # 5. train through DataLoader(TarDataset, shuffle=True, num_workers=2), test on held-out
    losses, acc = _train(train_shards, test_shards, epochs, seed, num_workers, batch_size, say)
    seconds = time.perf_counter() - t_start
    say(f"test accuracy: {acc:.4f} on {len(te)} held-out images ({seconds:.1f} s in all)")
    return DemoResult(
        workdir=root,
        train_shards=train_shards,
        test_shards=test_shards,
        tar_copy=tar_copy,
        n_train=len(tr),
        n_test=len(te),
        same_samples=tar_copy is not None,
        random_access_per_s=rate,
        decoded_per_s=decoded,
        losses=losses,
        accuracy=acc,
        seconds=seconds,
    )


def _train(
    train_shards: list[str],
    test_shards: list[str],
    epochs: int,
    seed: int,
    num_workers: int,
    batch_size: int,
    say: Callable[[str], None],
) -> tuple[list[float], float]:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from ..torch import TarDataset

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the DataLoader workers use the other cores
    try:
        torch.manual_seed(seed)
        train = TarDataset(train_shards, decode="l8", transform=to_xy)
        test = TarDataset(test_shards, decode="l8", transform=to_xy)
        loader = DataLoader(
            train,
            batch_size=batch_size,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=num_workers > 0,
            generator=torch.Generator().manual_seed(seed),
        )
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.CrossEntropyLoss()
        losses: list[float] = []
        for epoch in range(epochs):
            model.train()
            total, count = 0.0, 0
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                total += loss.item() * len(y)
                count += len(y)
            losses.append(total / count)
            say(f"epoch {epoch + 1}/{epochs}: train loss {losses[-1]:.4f} ({count} samples)")
        model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in DataLoader(test, batch_size=256, shuffle=False, num_workers=0):
                correct += int((model(x).argmax(1) == y).sum())
        return losses, correct / len(test)
    finally:
        torch.set_num_threads(threads)


def command(args: Any) -> int:
    """``tarindex demo``: :func:`run`; exit 1 if the accuracy says the pipeline is broken.

    ``args`` holds ``workdir``, ``epochs`` (None: :data:`DEFAULT_EPOCHS`) and ``seed``.

    Raises:
        Failure: An extra is missing, or the accuracy is below 0.9 after the full training.
    """
    epochs = DEFAULT_EPOCHS if args.epochs is None else args.epochs
    try:
        res = run(args.workdir, epochs, seed=args.seed)
    except MissingExtraError as e:
        raise Failure(str(e)) from None
    if res.accuracy < 0.9 and epochs >= DEFAULT_EPOCHS:
        raise Failure(f"test accuracy {res.accuracy:.4f} is below 0.9; the pipeline is broken")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(0 if run().accuracy > 0.9 else 1)
