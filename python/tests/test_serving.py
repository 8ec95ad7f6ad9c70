"""gstore.serving against real CRIU and the real `gstore` binary: a serving process whose
weights come from a stored model image is checkpointed without them and gets them back from
the store, after a --leave-running checkpoint and after a restore. Host-memory weights (this
machine has no GPU; the same protocol runs on one: tests/gpu/). Needs root and CRIU >= 4 at
/opt/criu/sbin/criu (scripts/criu.sh)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

torch = pytest.importorskip("torch")

import gstore  # noqa: E402
import gstore.serving  # noqa: E402

CRIU = "/opt/criu/sbin/criu"
pytestmark = pytest.mark.skipif(
    not (os.path.exists(CRIU) and os.geteuid() == 0), reason="needs root and CRIU at /opt/criu/sbin/criu"
)

LAYERS = 3
WIDTH = 4096  # 64 MiB of float32 per layer: freed memory goes back to the system at once

SERVER = textwrap.dedent(
    """
    import os, sys, time, torch, gstore, gstore.serving
    store, out, layers, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    def put(name, text):
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            f.write(text)
        os.rename(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    x = torch.ones(1, width) * 0.01
    load = None
    if os.environ.get("SERVER_FUSED"):
        # A serving engine's shape: one fused parameter made of the image's tensors, filled by
        # the engine's own loader.
        model = torch.nn.Linear(width, layers * width, bias=False)
        def load(weights):
            with torch.no_grad():
                for name, t in weights:
                    i = int(name.split(".")[0])
                    model.weight[i * width:(i + 1) * width].copy_(t)
        load(gstore.Store(store).weights("model:v1", device="cpu"))
    else:
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        gstore.Store(store).load_into(model, "model:v1", progress=False)
    def answer():
        with torch.no_grad():
            return repr(float(model(x).double().sum()))
    put("expect", answer())
    registered = False
    while True:
        if not registered and os.path.exists(os.path.join(out, "register")):
            gstore.serving.weights_from(model, "model:v1", store=store, load=load)
            registered = True
            put("registered", str(os.getpid()))
        if os.path.exists(os.path.join(out, "ask")):
            os.remove(os.path.join(out, "ask"))
            put("answer", answer())
        if os.path.exists(os.path.join(out, "tweak")):
            # A fine-tune step: the first weight changed in place, or through .data (which
            # its version counter does not see).
            with open(os.path.join(out, "tweak")) as f:
                how = f.read()
            os.remove(os.path.join(out, "tweak"))
            p = next(model.parameters())
            with torch.no_grad():
                (p.data if how == "through .data" else p).add_(0.5)
            put("tweaked", answer())
        time.sleep(0.005)
    """
)


def cli(store, *args, check=True):
    r = subprocess.run(
        [os.environ["GSTORE_BIN"], "--json", "--store", store, *args, "--criu", CRIU]
        if args[0] in ("checkpoint", "restore")
        else [os.environ["GSTORE_BIN"], "--json", "--store", store, *args],
        capture_output=True,
        text=True,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"gstore {' '.join(args)} exited {r.returncode}: {r.stdout} {r.stderr}")
    return r


def wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear in {timeout} s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


def ask(out):
    try:
        os.remove(os.path.join(out, "answer"))
    except FileNotFoundError:
        pass
    open(os.path.join(out, "ask"), "w").close()
    return wait_for(os.path.join(out, "answer"))


def gone(pid, timeout=20.0):
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return not os.path.exists(f"/proc/{pid}")


def killed_and_restored(store, out, proc, tag):
    """Kills the serving process, makes a request and runs `gstore restore TAG --run`; returns
    its report (the restored process answers the request as soon as it runs)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert gone(proc.pid)
    open(os.path.join(out, "ask"), "w").close()
    ran = json.loads(cli(store, "restore", tag, "--run").stdout)
    _restored.add(ran["pid"])
    return ran


@pytest.fixture(params=["plain"])
def served(tmp_path, monkeypatch, request):
    """A store holding the model image, and a serving process that loaded it (``fused``: into
    one parameter, through its own loader)."""
    if request.param == "fused":
        monkeypatch.setenv("SERVER_FUSED", "1")
    monkeypatch.setenv("GSTORE_COOP_DIR", str(tmp_path / "coop"))
    store = str(tmp_path / "store")
    gstore.Store.init(store)
    g = torch.Generator().manual_seed(7)
    state = {f"{i}.weight": torch.randn(WIDTH, WIDTH, generator=g) * 0.02 for i in range(LAYERS)}
    gstore.Store(store).save(state, "model:v1", progress=False)
    out = tmp_path / "server"
    out.mkdir()
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, store, str(out), str(LAYERS), str(WIDTH)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wait_for(out / "expect", timeout=120)
    yield store, str(out), proc
    for pid in {proc.pid, *_restored}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _restored.clear()


_restored = set()


def test_weights_stay_out_of_the_image_and_come_back_from_the_store(served):
    store, out, proc = served
    expect = open(os.path.join(out, "expect")).read()
    weights_bytes = LAYERS * WIDTH * WIDTH * 4
    # The same process before it registers: its weights are in the image.
    full = json.loads(cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:full", "--leave-running").stdout)
    assert full.get("weights") is None
    open(os.path.join(out, "register"), "w").close()
    wait_for(os.path.join(out, "registered"))
    lean = json.loads(cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:lean", "--leave-running").stdout)
    assert lean["weights"]["bytes"] == weights_bytes and lean["weights"]["processes"] == 1, lean["weights"]
    assert lean["weights"]["refill_s"] is not None
    saved = full["push"]["logical_bytes"] - lean["push"]["logical_bytes"]
    assert saved >= 0.9 * weights_bytes, (full["push"]["logical_bytes"], lean["push"]["logical_bytes"])
    # Left running, it answers with its weights back.
    assert ask(out) == expect
    meta = gstore.Store(store).show("proc:lean")["meta"]
    model = gstore.Store(store).show("model:v1")["manifest"]
    assert meta["uses"] == [model]
    assert meta["released_weights"][0]["image"] == model

    # Killed, then restored: it refills from the store before it answers.
    ran = killed_and_restored(store, out, proc, "proc:lean")
    assert ran["weights_refill_s"] is not None
    assert wait_for(os.path.join(out, "answer")) == expect
    # Restored, it is a process started anew, and still registered: its next checkpoint leaves
    # the weights out too.
    again = json.loads(cli(store, "checkpoint", "--pid", str(ran["pid"]), "--tag", "proc:again", "--leave-running").stdout)
    assert again["weights"]["bytes"] == weights_bytes, again.get("weights")
    assert ask(out) == expect

    # gc keeps the model image while the process image uses it, though its tag is gone.
    cli(store, "rm", "model:v1")
    cli(store, "rm", "proc:full")
    cli(store, "gc")
    os.kill(ran["pid"], signal.SIGKILL)
    assert gone(ran["pid"])
    ran = json.loads(cli(store, "restore", "proc:lean", "--run").stdout)
    _restored.add(ran["pid"])
    assert ask(out) == expect


@pytest.mark.parametrize("served", ["fused"], indirect=True)
def test_an_engine_s_own_loader_refills_fused_weights(served):
    store, out, proc = served
    expect = open(os.path.join(out, "expect")).read()
    open(os.path.join(out, "register"), "w").close()
    wait_for(os.path.join(out, "registered"))
    live = json.loads(cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:fused", "--leave-running").stdout)
    assert live["weights"]["bytes"] == LAYERS * WIDTH * WIDTH * 4, live["weights"]
    assert ask(out) == expect
    killed_and_restored(store, out, proc, "proc:fused")
    assert wait_for(os.path.join(out, "answer")) == expect


def test_a_restore_whose_model_image_is_damaged_starts_nothing(served, tmp_path):
    store, out, proc = served
    open(os.path.join(out, "register"), "w").close()
    wait_for(os.path.join(out, "registered"))
    cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:lean")
    proc.wait(timeout=20)  # CRIU ended it once its image was stored
    model = gstore.Store(store).show("model:v1")["manifest"]
    manifests = [os.path.join(d, f) for d, _, fs in os.walk(store) for f in fs if f.startswith(model)]
    assert len(manifests) == 1, manifests
    with open(manifests[0], "r+b") as f:
        f.seek(20)
        byte = f.read(1)
        f.seek(20)
        f.write(bytes([byte[0] ^ 0xFF]))
    r = cli(store, "restore", "proc:lean", "--run", check=False)
    assert r.returncode == 4, (r.returncode, r.stdout, r.stderr)
    assert "weights come from model:v1" in r.stdout + r.stderr
    assert not os.path.exists(f"/proc/{proc.pid}"), "nothing may run"


@pytest.mark.parametrize("how", ["in place", "through .data"])
def test_weights_changed_after_registering_stay_in_the_image(served, how):
    store, out, proc = served
    open(os.path.join(out, "register"), "w").close()
    wait_for(os.path.join(out, "registered"))
    with open(os.path.join(out, "tweak"), "w") as f:
        f.write(how)
    tweaked = wait_for(os.path.join(out, "tweaked"))
    assert tweaked != open(os.path.join(out, "expect")).read()
    live = json.loads(cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:tuned", "--leave-running").stdout)
    w = live["weights"]
    assert w["processes"] == 0 and w["bytes"] == 0, w
    assert [c["pid"] for c in w["changed"]] == [proc.pid], w
    assert ("written in place" if how == "in place" else "bytes changed") in w["changed"][0]["why"], w
    assert live["push"]["logical_bytes"] >= LAYERS * WIDTH * WIDTH * 4, "the image holds the weights"
    assert gstore.Store(store).show("proc:tuned")["meta"].get("released_weights") is None
    assert ask(out) == tweaked, "it runs on with its own weights"
    # Its registration ended: the next checkpoint does not ask it.
    again = json.loads(cli(store, "checkpoint", "--pid", str(proc.pid), "--tag", "proc:again", "--leave-running").stdout)
    assert again.get("weights") is None, again.get("weights")
    # Killed and restored from the image: its own weights, not the model image's.
    ran = killed_and_restored(store, out, proc, "proc:tuned")
    assert ran["weights_refill_s"] is None
    assert wait_for(os.path.join(out, "answer")) == tweaked
