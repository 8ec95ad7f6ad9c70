"""A torch.distributed process tree (tests/gpu/tp_ranks.py: a parent and two ranks joined by
gloo, the CPU's backend, all-reducing in a loop; on GPUs the same script runs NCCL) checkpointed
through the real `gstore` binary and real CRIU, killed, restored, and reducing on from where it
stopped. Needs root and CRIU >= 4.2 at /opt/criu/sbin/criu (scripts/criu.sh)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

import gstore  # noqa: E402

CRIU = "/opt/criu/sbin/criu"
pytestmark = pytest.mark.skipif(
    not (os.path.exists(CRIU) and os.geteuid() == 0), reason="needs root and CRIU at /opt/criu/sbin/criu"
)
TP_RANKS = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu", "tp_ranks.py")


def gstore_cli(store, *args):
    return subprocess.run(
        [os.environ["GSTORE_BIN"], "--json", "--store", store, *args, "--criu", CRIU],
        capture_output=True,
        text=True,
    )


def steps(out):
    """Each rank's last step and its state."""
    found = []
    for rank in range(2):
        with open(os.path.join(out, f"rank{rank}")) as f:
            step, rest = f.read().split(" ", 1)
        found.append((int(step), rest.rsplit(" ", 1)[0].strip()))
    return found


def wait_past(out, floor, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        now = steps(out)
        for step, state in now:
            assert state == "ok", f"step {step}: {state}"
        if min(step for step, _ in now) > floor:
            return now
        assert time.monotonic() < deadline, f"the ranks stopped at {now}"
        time.sleep(0.02)


class Tree:
    """tests/gpu/tp_ranks.py started in a session of its own; its pids once both ranks stepped."""

    def __init__(self, tmp_path, name, env):
        self.out = str(tmp_path / name)
        self.log = open(tmp_path / f"{name}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, TP_RANKS, self.out, "--backend", "gloo", "--mib", "64", "--period", "0.01"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        )
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(self.out, "pids")):
            assert self.proc.poll() is None, open(tmp_path / f"{name}.log").read()
            assert time.monotonic() < deadline, "the ranks never stepped"
            time.sleep(0.05)
        with open(os.path.join(self.out, "pids")) as f:
            self.pids = [int(p) for p in f.read().split()]

    def kill(self):
        try:
            os.killpg(self.pids[0], signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def test_a_gloo_tree_is_checkpointed_restored_and_reduces_on(tmp_path):
    store = str(tmp_path / "store")
    gstore.Store.init(store)

    # PyTorch's TCPStore server (on rank 0 here) sets up an io_uring through libuv where the
    # kernel offers one; CRIU cannot dump it: refused with the way out, and the tree runs on.
    tree = Tree(tmp_path, "uv", {})
    try:
        uring = any("[io_uring]" in open(f"/proc/{p}/maps").read() for p in tree.pids)
        r = gstore_cli(store, "checkpoint", "--pid", str(tree.pids[0]), "--tag", "tp:uv")
        if uring:
            assert r.returncode != 0, r.stdout
            assert "USE_LIBUV=0" in r.stderr, r.stderr
            wait_past(tree.out, max(step for step, _ in steps(tree.out)) + 5)
        else:
            assert r.returncode == 0, r.stderr
    finally:
        tree.kill()

    tree = Tree(tmp_path, "tp", {"USE_LIBUV": "0"})
    try:
        wait_past(tree.out, 20)
        # Its gloo and TCPStore connections are all between its own processes: gstore dumps them
        # established by itself, and restores them so.
        r = gstore_cli(store, "checkpoint", "--pid", str(tree.pids[0]), "--tag", "tp:1")
        assert r.returncode == 0, r.stderr
        capture = json.loads(r.stdout)["capture"]
        assert capture["image_kind"] == "cpu-process" and capture["tcp_connections"] == "inside"
        tree.proc.wait()
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{p}") for p in tree.pids):
            assert time.monotonic() < deadline, "the dumped tree is still there"
            time.sleep(0.02)
        at_dump = steps(tree.out)

        r = gstore_cli(store, "restore", "tp:1", "--run")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["pid"] == tree.pids[0]
        # Both ranks step on from the dump point over their restored gloo connections, every
        # all-reduce right and the weights checked again (every 50 steps).
        assert min(s for s, _ in steps(tree.out)) >= min(s for s, _ in at_dump), "it started over"
        wait_past(tree.out, max(step for step, _ in at_dump) + 60)
    finally:
        tree.kill()
