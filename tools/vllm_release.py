"""Install one vLLM release into the running Python's environment, the way this package
index allows, and say what is left unmet.

Run with the target environment's interpreter (the Makefile does):

    .venv034/bin/python tools/vllm_release.py 0.34.0

vLLM pins ``flashinfer-python`` exactly, and the index does not carry every pin (0.34.0
wants 0.7.3; the index has 0.7.2.post1 and 0.7.4), so a plain ``pip install vllm==X``
can fail or, where a range admits an older vLLM, resolve to it silently. vLLM's CPU path
never imports flashinfer, so vLLM goes in without its dependencies, then every
dependency its metadata names for this platform but flashinfer, then kvscope itself
(``--no-deps``: nothing may move the vLLM just installed). ``pip check`` must then name
nothing but flashinfer.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

# vLLM's GPU sampling/attention kernels: never imported on CPU, and not on this index
# at every pin vLLM names.
SKIPPED = {"flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"}
# Pinned exactly, and taken as that exact build: the index carries torch 2.13.0 both plain and
# as 2.13.0+cpu, which ``==`` also matches and pip prefers, while the torchvision vLLM pins
# beside it is built against the plain one (importing it then fails: torchvision::nms).
EXACT_BUILD = {"torch"}


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True,
                          capture_output=True)


def requirement_name(spec: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(spec).name.lower().replace("_", "-")


def runtime_requirements(dist: str) -> list[str]:
    """The distribution's requirements that apply here, no extra asked for."""
    from packaging.requirements import Requirement

    wanted = []
    for spec in importlib.metadata.requires(dist) or ():
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = requirement_name(spec)
        if name in SKIPPED:
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if name in EXACT_BUILD and len(pins) == 1 and "+" not in pins[0]:
            wanted.append(f"{req.name}==={pins[0]}")
            continue
        wanted.append(str(req).split(";")[0].strip())
    return wanted


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    version = argv[0]
    done = pip("install", "-q", "--no-deps", f"vllm=={version}")
    if not done.returncode:
        importlib.invalidate_caches()
        done = pip("install", "-q", *runtime_requirements("vllm"))
    if not done.returncode:
        done = pip("install", "-q", "--no-deps", "-e", ".")
    if done.returncode:
        print(done.stdout + done.stderr, file=sys.stderr)
        return done.returncode
    installed = importlib.metadata.version("vllm")
    if installed != version:
        print(f"asked for vLLM {version}, got {installed}", file=sys.stderr)
        return 1
    unmet = [line for line in pip("check").stdout.splitlines()
             if line.strip() and not line.startswith("No broken")]
    for line in unmet:
        print(f"  pip check: {line}")
    if any(not any(name in line.lower() for name in SKIPPED) for line in unmet):
        print(f"vLLM {version}: unmet requirements besides flashinfer", file=sys.stderr)
        return 1
    print(f"vLLM {version} installed (flashinfer left out: vLLM's CPU path never imports it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
