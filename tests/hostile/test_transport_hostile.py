"""Hostile uses of the batches DataLoader workers send by name (tarindex/torch/transport.py).

No batch the user still holds may change, however it is held: the batch, a slice, a numpy
array or memoryview made from it, a batch handed on to another process; through
``persistent_workers`` on and off and several epochs, while the workers reuse the segments
(cc0820f). Each run is a fresh interpreter: a segfault fails the test with its signal.

Once broken: the main process pickled a batch it had received by name as a plain tensor, and
torch's default ``file_descriptor`` sharing copied it into new memory and unmapped the segment
under every numpy array the main process had made of that batch: a segfault on reading one (or
another batch's bytes, once a later batch was mapped at that address).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import MakeShards

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent(
    """
    import gc, sys
    import torch, torch.multiprocessing as mp
    import tarindex

    def child(q, out):  # holds what it is given; reads it once the main process read on
        held = []
        while (b := q.get()) is not None:
            held.append(b)
        out.put([(b.keys, [b.bytes("bin", j) for j in range(len(b))]) for b in held])

    def main(shards, how, persistent):
        one = tarindex.TarDataset(shards)
        want = {one[k]["__key__"]: one[k]["bin"] for k in range(len(one))}
        ds = tarindex.TarDataset(shards, batched=True)
        dl = torch.utils.data.DataLoader(
            ds, batch_size=6, shuffle=True, num_workers=2, persistent_workers=persistent,
            collate_fn=tarindex.collate_batched, generator=torch.Generator().manual_seed(0))
        ctx = mp.get_context("spawn")
        q, out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=child, args=(q, out))
        p.start()
        kept = []  # (key, bytes-like the main process holds)
        for epoch in range(3):
            for k, b in enumerate(dl):
                if k % 3 == 0:
                    kept.append((b.keys[1], b.tensor("bin", 1).numpy()))  # a numpy array
                    kept.append((b.keys[0], b.view("bin", 0)))  # a memoryview
                    if how == "pass on":
                        q.put(b)  # the batch to another process, its views kept here
                elif k % 3 == 1:
                    kept.append((b.keys[-1], b.data[int(b.offsets("bin")[-2]):
                                                    int(b.offsets("bin")[-1])]))  # a slice
                del b
                gc.collect()
        q.put(None)
        bad = [k for k, v in kept if bytes(v) != want[k]]
        for keys, bins in out.get(timeout=120):
            bad += [k for k, v in zip(keys, bins) if v != want[k]]
        p.join()
        print(len(kept), bad)

    if __name__ == "__main__":
        main(sys.argv[3:], sys.argv[1], sys.argv[2] == "1")
    """
)


@pytest.mark.parametrize("persistent", ["0", "1"])
@pytest.mark.parametrize("how", ["keep", "pass on"])
def test_no_batch_the_user_holds_ever_changes(
    make_shards: MakeShards, tmp_path: os.PathLike[str], how: str, persistent: str
) -> None:
    shards = make_shards([30, 31], seed=2)
    script = os.path.join(tmp_path, "holds.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out, err = (os.path.join(tmp_path, n) for n in ("out", "err"))
    with open(out, "w") as fo, open(err, "w") as fe:  # files: a child left waiting holds no pipe
        p = subprocess.Popen(
            [sys.executable, script, how, persistent, *shards],
            stdout=fo,
            stderr=fe,
            env=env,
            start_new_session=True,
        )
        try:
            code = p.wait(timeout=280)
        finally:  # the child (and the workers) of a main process that died
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    with open(out) as f, open(err) as g:
        stdout, stderr = f.read(), g.read()
    if code < 0:
        pytest.fail(f"the main process died of {signal.Signals(-code).name}: {stderr[-2000:]}")
    assert code == 0, stderr[-3000:]
    kept, bad = stdout.split(maxsplit=1)
    assert int(kept) == 36 and bad.strip() == "[]", stdout
