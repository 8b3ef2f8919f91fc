"""Helpers of the batch tests. LocalCluster: a real Ray cluster on this machine, a head node and
one extra worker node (`ray start --head`, `ray start --address`), small enough for a shared
2-core machine (logical CPUs 2 + 1, 100 MB object stores), on free ports, with its own temp dir
and token; the fixture stops it when the module ends, also when a test failed. Only this
cluster's processes are stopped: the two `ray start --block` parents and their descendants, by
pid."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
OBJECT_STORE = 100 * 1000 * 1000


# Set by the cluster fixture: the test cluster's own token authentication (a token file in its
# temp dir), for its nodes and for every driver the tests start; never ~/.ray.
CLUSTER_ENV: dict = {}


def cli_env() -> dict:
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'pkg'}:{REPO / 'native'}", CANDLE_WEB_OFFLINE="1",
               OPENBLAS_NUM_THREADS="1", RAY_USAGE_STATS_ENABLED="0", **CLUSTER_ENV)
    env.pop("RAY_ADDRESS", None)
    return env


def run_cli(*args, timeout=300, check_code=None):
    out = subprocess.run([sys.executable, "-m", "candle_web.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=timeout, env=cli_env())
    if check_code is not None:
        assert out.returncode == check_code, f"exit {out.returncode}\n{out.stderr[-4000:]}"
    return out


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def _node_ports() -> list[str]:
    agent, grpc, metrics, runtime_env, manager, objects = _free_ports(6)
    # Workers keep Ray's default port range (10002-19999), below the ephemeral ports above.
    return [f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
            f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
            f"--node-manager-port={manager}", f"--object-manager-port={objects}"]


class LocalCluster:
    def __init__(self):
        # Ray's socket paths must stay short: a temp dir under /tmp, not pytest's tmp_path.
        self.temp = Path(tempfile.mkdtemp(prefix="cwray", dir="/tmp"))
        self.port, self.dashboard = _free_ports(2)
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[subprocess.Popen] = []
        token = self.temp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        CLUSTER_ENV.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))

    def _start(self, name: str, arguments: list[str]) -> None:
        log = open(self.temp / f"{name}.log", "w")
        node = subprocess.Popen([str(RAY), "start", "--block", "--node-ip-address=127.0.0.1",
                                 f"--object-store-memory={OBJECT_STORE}", f"--temp-dir={self.temp}",
                                 "--disable-usage-stats", *arguments, *_node_ports()],
                                stdout=log, stderr=subprocess.STDOUT, env=self.node_env(),
                                start_new_session=True)
        self.nodes.append(node)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if node.poll() is not None:
                raise RuntimeError(f"ray start ({name}) exited {node.returncode}:\n"
                                   f"{(self.temp / f'{name}.log').read_text()[-3000:]}")
            if "Ray runtime started" in (self.temp / f"{name}.log").read_text():
                return
            time.sleep(0.5)
        raise RuntimeError(f"ray start ({name}) did not come up in 120 s")

    @staticmethod
    def node_env() -> dict:
        # On a machine shared with other jobs, Ray's memory monitor kills this cluster's workers
        # when *another* process fills the RAM (it watches the whole node); the kernel's OOM
        # killer is enough for these small clips. No 30 s drain when the test stops a node.
        return dict(cli_env(), RAY_memory_monitor_refresh_ms="0",
                    RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")

    def start(self):
        self._start("head", ["--head", f"--port={self.port}", "--num-cpus=2",
                             "--include-dashboard=false", f"--dashboard-port={self.dashboard}"])
        # "Ray runtime started" on the worker: it has registered with the head.
        self._start("worker", [f"--address={self.address}", "--num-cpus=1"])
        return self

    def raylet_pids(self) -> set[int]:
        """The raylets of this cluster (their command lines name its temp dir)."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "raylet/raylet" in cmdline and str(self.temp) in cmdline:
                    found.add(int(entry.name))
        return found

    def workers(self, title: str) -> list[tuple[int, str]]:
        """(pid, process title) of this cluster's worker processes whose title holds `title`."""
        raylets = self.raylet_pids()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent in raylets and title in cmdline:
                found.append((int(entry.name), cmdline))
        return found

    def processes(self) -> set[int]:
        """Every process of this cluster: the two `ray start` parents and all their descendants
        (GCS, raylets, agents, and the workers the raylets started, which run in sessions of
        their own), read from /proc."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(parent, []).append(int(entry.name))
        found, todo = set(), [node.pid for node in self.nodes if node.poll() is None]
        while todo:
            pid = todo.pop()
            if pid not in found:
                found.add(pid)
                todo.extend(children.get(pid, []))
        return found

    def stop(self) -> None:
        """SIGTERM to the two `ray start --block` parents (each stops its node), then SIGKILL
        to any of this cluster's processes left after 10 s (listed before, so that none
        escapes as an orphan of init): what `ray stop` does, limited to this cluster."""
        pids = self.processes()
        for node in self.nodes:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            for node in self.nodes:
                node.poll()  # reap the two we started
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for node in self.nodes:
            try:
                node.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        CLUSTER_ENV.clear()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def read_results(out: Path) -> list[dict]:
    """Every row of OUT/results with its status (from the partition folder)."""
    import pyarrow.parquet as pq

    rows = []
    for path in sorted((out / "results").glob("status=*/*.parquet")):
        for row in pq.read_table(path).to_pylist():
            row["status"] = path.parent.name.split("=", 1)[1]
            row["file"] = path.name
            rows.append(row)
    return rows
