"""The torch-free executors (tarindex.stream) over real shards, in processes without torch.

Each test writes shards here, then runs one check of tests/stream_checks.py in a fresh
interpreter where ``sys.modules["torch"] = None`` makes ``import torch`` fail, so nothing the
check touches may need torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import MakeShards

ROOT = Path(__file__).resolve().parents[2]
SIZES = [13, 5, 11, 1, 9, 17, 10]  # 66 samples, divisible by 1, 2, 3 and 6


def run_blocked(check: str, *args: object) -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "sys.argv = ['stream_checks', *sys.argv[1:]]; "
        "from tests.stream_checks import main; main()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    out = subprocess.run(
        [sys.executable, "-c", code, check, json.dumps(list(args))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip() == f"ok {check}"


def test_import_without_torch() -> None:
    run_blocked("imports")


def test_blocked_torch_really_fails() -> None:
    """The harness can fail: a check that imports torch is caught."""
    code = "import sys; sys.modules['torch'] = None; import tarindex.torch.iterable"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr


@pytest.mark.timeout(300)
def test_exactly_once_over_rank_worker_splits(make_shards: MakeShards) -> None:
    run_blocked("exactly_once", make_shards(SIZES))


def test_epoch_order_is_deterministic(make_shards: MakeShards) -> None:
    run_blocked("epochs", make_shards(SIZES))


def test_resume_mid_epoch_yields_the_rest(make_shards: MakeShards) -> None:
    run_blocked("resume", make_shards(SIZES))


def test_batched_output_and_resume(make_shards: MakeShards) -> None:
    run_blocked("batched", make_shards(SIZES))


def test_mixing_proportions_workers_resume(make_shards: MakeShards) -> None:
    a = make_shards([40, 20], name="a", seed=1)
    b = make_shards([12], name="b", seed=2)
    c = make_shards([5], name="c", seed=3)
    run_blocked("mixing", a, b, c)


def test_on_error_skip_reports_and_skips(make_shards: MakeShards) -> None:
    run_blocked("on_error", make_shards([12, 9, 7]))


def test_planned_samplers_without_torch(make_shards: MakeShards) -> None:
    run_blocked("samplers", make_shards(SIZES))
