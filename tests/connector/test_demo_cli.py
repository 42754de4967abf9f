"""`kvscope demo`: one-line errors with their own exit code, and its files gone
however it ends (SIGTERM, SIGINT, a taken port). Runs the real demo in a child."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

KVSCOPE = os.path.join(os.path.dirname(sys.executable), "kvscope")


def _regions(pid: int) -> set[str]:
    """The /dev/shm offload regions the process has mapped (its own, exactly)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {ln.split()[-1] for ln in f if "/dev/shm/vllm_offload_" in ln}
    except OSError:
        return set()


def _demo(tmp_path, *argv, **env_overrides):
    env = dict(os.environ, TMPDIR=str(tmp_path), VLLM_LOGGING_LEVEL="ERROR", PYTHONUNBUFFERED="1",
               **env_overrides)
    return subprocess.Popen([KVSCOPE, "demo", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_a_taken_port_is_one_line_exit_3_and_leaves_nothing(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _demo(tmp_path, "healthy", "--port", str(port))
        out, err = p.communicate(timeout=300)
    assert p.returncode == 3, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"kvscope demo: port {port} is taken"), err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("kvscope-*")), "temp dirs left behind"


# Ctrl-C while serving ends the serving, as `--serve` documents: the verdict stands (0).
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 0)])
def test_a_signal_while_serving_removes_shm_and_temp_dirs(tmp_path, sig, code):
    p = _demo(tmp_path, "healthy", "--serve", "120")
    regions: set[str] = set()
    try:
        deadline = time.monotonic() + 300
        for line in p.stdout:  # poll for readiness: the demo says when it serves
            regions |= _regions(p.pid)
            if line.startswith("serving "):
                break
            assert time.monotonic() < deadline
        regions |= _regions(p.pid)
        assert list(tmp_path.glob("kvscope-engine-*")), "the demo made no temp dir?"
        p.send_signal(sig)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert p.returncode == code, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("kvscope-*")), "temp dirs left behind"
    assert regions and not [r for r in regions if os.path.exists(r)], "shm regions left behind"


def test_the_demo_prints_its_own_lines_only(tmp_path):
    """vLLM logs as it loads and torch warns about CUDA: the demo quiets both before
    importing them, whatever the caller's environment says (here: nothing)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    env.update(TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")
    p = subprocess.run([KVSCOPE, "demo", "healthy"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("== scenario healthy:"), p.stdout[:2000]
    logged = [ln for ln in p.stdout.splitlines() + p.stderr.splitlines()
              if ln.split(" ", 1)[0] in ("DEBUG", "INFO", "WARNING") or ln[:1] in ("I", "W")
              and ln[1:5].isdigit()]
    assert logged == [], logged
    # what is left on stderr is kvscope's own (the connector's one-time notices)
    assert all(ln.startswith("kvscope") for ln in p.stderr.splitlines()), p.stderr
