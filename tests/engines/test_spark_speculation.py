"""Speculative copies for real: a Spark standalone cluster of two "hosts" on loopback.

Spark never runs two attempts of one task on one host (``TaskSetManager``:
``!(speculative && hasAttemptOnHost(index, host))``), so ``local[N]`` and
``local-cluster[...]`` (every executor on one host name) never speculate. Here a master and
two workers bound to 127.0.0.1 and 127.0.0.2 (both loopback) make two hosts on one machine;
the driver (``speculation_job.py``, its own process: one SparkContext per process, and this
session's tests hold a local one) writes through both paths with a stalled first attempt.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[test]')")
pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[test]')")

ROOT = Path(__file__).parents[2]


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def spark_class() -> str:
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java: install Java 17 to run Spark")
    try:
        free_port("127.0.0.2")
    except OSError as e:
        pytest.skip(f"127.0.0.2 is not a loopback address here ({e}): no second host")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["PYSPARK_PYTHON"] = sys.executable
    env["SPARK_NO_DAEMONIZE"] = "1"
    port = free_port("127.0.0.1")
    master = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(name: str, args: list[str], host: str) -> None:
        e = dict(env, SPARK_LOCAL_IP=host)
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen([spark_class(), *args], env=e, stdout=log, stderr=log))

    start("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                     str(port), "--webui-port", str(free_port("127.0.0.1"))], "127.0.0.1")
    for k, host in enumerate(["127.0.0.1", "127.0.0.2"]):
        work = tmp_path / f"work{k}"
        work.mkdir()
        start(f"worker{k}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                             "--cores", "1", "--memory", "1g", "--work-dir", str(work),
                             "--webui-port", str(free_port(host)), master], host)
    try:
        yield master, env
    finally:
        for p in procs:  # only the processes this fixture started, by their handles
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.slow
@pytest.mark.skipif(
    bool(os.environ.get("TARINDEX_PURE_PYTHON")),
    reason="Spark's commit protocol does not depend on the read kernel: run in the compiled pass",
)
@pytest.mark.timeout(900)  # ~2.5 min alone; a JVM master, 2 workers and a driver on 2 cores
def test_speculative_copies_commit_once_and_the_loser_is_pruned(
    cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    master, env = cluster
    out = tmp_path / "out"
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "tests.engines.speculation_job", master, str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if run.returncode != 0:
        tail = "\n".join((run.stdout + run.stderr).splitlines()[-60:])
        pytest.fail(f"the speculation job failed ({time.monotonic() - t0:.0f} s):\n{tail}")
    oks = [line for line in run.stdout.splitlines() if line.startswith("OK ")]
    assert oks == [f"OK {out / 'arrow'}", f"OK {out / 'format'}"], run.stdout
