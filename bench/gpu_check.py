"""One-shot GPU check (issue 20): run by bench/gpu_check.sh on the lent GPU machine.

    bash bench/gpu_check.sh                       # on the GPU machine, from the repo root
    PYTHON=.venv/bin/python GPU_CHECK_CPU=1 bash bench/gpu_check.sh   # CPU smoke test

Steps (each independent: a failure is recorded and the next step runs):
  0  tensorboard and matplotlib import (else hidden behind an ImportError stub, since the
     trainer catches only ImportError around them).
  1  GPU facts: raw nvidia-smi / lspci / driver outputs (new test fixtures) and what
     preflight's gpu_facts module makes of them (the module's own code, with a stand-in
     for AnsibleModule, since Ansible is not installed there).
  2  Matrix selection for this host (torch 2.11.0 cu130) and the torch build's facts.
  5  allreduce_bench through torchrun --nproc-per-node 1 (as is, and with a process
     group forced at world size 1 so that NCCL really runs), and a DDP/NCCL probe.
  3  The trainer: mnist5k bf16, mnist5k with the forced NCCL group, resnet18 on
     CIFAR-10-shaped synthetic data, SIGKILL of the launcher's process group and resume
     (whether the worker outlives its launcher is recorded; it is then killed too).
  4  bench_trainer's comparison (tutorial loop vs trainer, one process) with flag sets.
Step 5 runs before 3 and 4 because it is short; every step has a time cap and the whole
run a budget (GPU_CHECK_BUDGET seconds). Each command's environment carries a tag, and
whatever still carries it after the command returned (torchrun's workers run in sessions
of their own, so killing a launcher's group misses them) is killed. After each step the results are written to
$OUT/summary.txt and $OUT/gpu_check.tar.gz, so a run cut short still returns them.

Internal sub-commands: `_worker MODULE ARGS` (run a module with the GPU_CHECK_* patches,
used under torchrun), `_torchinfo FILE`, `_ddp_probe FILE`.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = os.environ.get("GPU_CHECK_CPU") == "1"
PY = sys.executable
TORCH = "2.11.0"
VARIANT = "cu130"


def load(relpath: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ======================================================================= sub-commands


def patch_torchrig() -> None:
    """GPU_CHECK_FORCE_PG=1: a process group (nccl on CUDA, else gloo) even at world size 1,
    where torchrig.dist.setup makes none. GPU_CHECK_SYNTH=CxHxW:NTRAIN:NTEST: --dataset
    synthetic with that image shape (torchrig's own is 1x28x28)."""
    import torch
    import torch.distributed as tdist
    import torchrig.data as tdata
    import torchrig.dist as tdistmod

    if os.environ.get("GPU_CHECK_FORCE_PG") == "1":
        orig = tdistmod.setup

        def setup(threads: int = 0):
            env = orig(threads)
            if not tdist.is_initialized() and "MASTER_ADDR" in os.environ:
                backend = "nccl" if env.device.type == "cuda" else "gloo"
                if backend == "nccl":
                    tdist.init_process_group("nccl", device_id=env.device)
                else:
                    tdist.init_process_group("gloo")
                env.control_group = tdist.new_group(backend="gloo")
                env.backend = backend
                print(f"gpu_check: forced a {backend} process group at world size "
                      f"{env.world_size}", flush=True)
            return env

        tdistmod.setup = setup

    spec = os.environ.get("GPU_CHECK_SYNTH")
    if spec:
        shape_s, n_train_s, n_test_s = spec.split(":")
        shape = tuple(int(v) for v in shape_s.split("x"))

        def load_synthetic(n_train: int = int(n_train_s), n_test: int = int(n_test_s),
                           classes: int = 10):
            g = torch.Generator().manual_seed(tdata.SPLIT_SEED)
            templates = torch.randn(classes, *shape, generator=g)
            y = torch.randint(0, classes, (n_train + n_test,), generator=g)
            x = templates[y] + 2.0 * torch.randn(n_train + n_test, *shape, generator=g)
            return tdata._make(x[:n_train], y[:n_train], x[n_train:], y[n_train:], classes)

        tdata.load_synthetic = load_synthetic
        print(f"gpu_check: --dataset synthetic is {shape} x ({n_train_s} train, {n_test_s} "
              "held-out)", flush=True)


def sub_worker(argv: list[str]) -> None:
    import runpy

    patch_torchrig()
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


def _try(info: dict, key: str, fn) -> None:
    try:
        info[key] = fn()
    except Exception as e:  # noqa: BLE001 - every probe is independent
        info[key] = f"error: {type(e).__name__}: {e}"


def sub_torchinfo(path: str) -> None:
    t0 = time.perf_counter()
    import torch

    info: dict = {"import_torch_s": round(time.perf_counter() - t0, 2),
                  "python": sys.version.split()[0], "torch": torch.__version__}
    _try(info, "torch_version_cuda", lambda: torch.version.cuda)
    _try(info, "cudnn_available", torch.backends.cudnn.is_available)
    _try(info, "cudnn_version", torch.backends.cudnn.version)
    _try(info, "nccl_available", torch.distributed.is_nccl_available)
    _try(info, "nccl_version", lambda: list(torch.cuda.nccl.version()))
    _try(info, "cuda_available", torch.cuda.is_available)
    _try(info, "device_count", torch.cuda.device_count)
    _try(info, "arch_list", torch.cuda.get_arch_list)
    _try(info, "bf16_supported_no_emulation",
         lambda: torch.cuda.is_bf16_supported(including_emulation=False))
    _try(info, "bf16_supported_default", torch.cuda.is_bf16_supported)
    for mod in ("torchvision", "triton", "numpy", "yaml", "matplotlib", "tensorboard", "tqdm",
                "sklearn"):
        _try(info, f"{mod}_version", lambda m=mod: __import__(m).__version__)
    _try(info, "mlxtend_spec", lambda: str(importlib.util.find_spec("mlxtend").origin))
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        _try(info, "device_name", lambda: torch.cuda.get_device_name(dev))
        _try(info, "capability", lambda: list(torch.cuda.get_device_capability(dev)))
        _try(info, "total_memory_mib",
             lambda: torch.cuda.get_device_properties(dev).total_memory // 2**20)
        _try(info, "driver_cuda_version", getattr(torch._C, "_cuda_getDriverVersion", lambda: None))

        def matmul_check():
            g = torch.Generator(device=dev).manual_seed(0)
            a = torch.randn(2048, 2048, device=dev, generator=g)
            b = torch.randn(2048, 2048, device=dev, generator=g)
            ref = (a.double() @ b.double())
            out = (a.bfloat16() @ b.bfloat16()).double()
            torch.cuda.synchronize()
            return float((out - ref).norm() / ref.norm())

        def conv_check():
            g = torch.Generator(device=dev).manual_seed(1)
            x = torch.randn(64, 64, 32, 32, device=dev, generator=g)
            w = torch.randn(64, 64, 3, 3, device=dev, generator=g)
            ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
            xc = x.contiguous(memory_format=torch.channels_last)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = torch.nn.functional.conv2d(xc, w, padding=1)
            torch.cuda.synchronize()
            return {"rel_err": float((out.double() - ref).norm() / ref.norm()),
                    "out_dtype": str(out.dtype),
                    "out_channels_last": out.is_contiguous(memory_format=torch.channels_last)}

        _try(info, "bf16_matmul_rel_err", matmul_check)
        _try(info, "bf16_conv_channels_last", conv_check)
    Path(path).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


def sub_ddp_probe(path: str) -> None:
    """Under torchrun (world size 1): an NCCL group bound to the device, DDP with bf16
    autocast and channels-last, and the collectives the trainer uses."""
    import torch
    import torch.distributed as tdist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    info: dict = {}
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device(
        "cpu")
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.set_device(dev)
        tdist.init_process_group("nccl", device_id=dev)
    else:
        tdist.init_process_group("gloo")
    ctl = tdist.new_group(backend="gloo")
    info["init_s"] = round(time.perf_counter() - t0, 3)
    info["backend"] = tdist.get_backend()
    info["world_size"] = tdist.get_world_size()
    try:
        t = torch.full((1024,), 2.0, device=dev)
        tdist.all_reduce(t)
        info["all_reduce_sum_ok"] = bool((t == 2.0 * tdist.get_world_size()).all())
        d = torch.ones(3, dtype=torch.float64, device=dev)
        tdist.all_reduce(d)
        info["all_reduce_float64_ok"] = bool((d == tdist.get_world_size()).all())
        b = torch.arange(8, device=dev, dtype=torch.float32)
        tdist.broadcast(b, src=0)
        info["broadcast_ok"] = bool((b == torch.arange(8, device=dev)).all())
        objs = [None] * tdist.get_world_size()
        tdist.all_gather_object(objs, socket.gethostname(), group=ctl)
        info["all_gather_object_gloo"] = objs
        flag = torch.zeros(1, dtype=torch.int32)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, group=ctl, async_op=True).wait()
        tdist.barrier(group=ctl)
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(dev)
        model = model.to(memory_format=torch.channels_last)
        ddp = DDP(model, device_ids=[dev.index] if cuda else None)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2, fused=True)
        x = torch.randn(64, 3, 32, 32, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (64,), device=dev)
        losses = []
        for _ in range(30):
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
                loss = nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        info["ddp_loss_first_last"] = [losses[0], losses[-1]]
        info["ddp_loss_decreased"] = losses[-1] < losses[0]
        info["ok"] = all(info[k] for k in ("all_reduce_sum_ok", "all_reduce_float64_ok",
                                          "broadcast_ok", "ddp_loss_decreased"))
    finally:
        tdist.destroy_process_group()
    Path(path).write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


# ======================================================================= orchestration


class Check:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.budget = float(os.environ.get("GPU_CHECK_BUDGET", "1500" if CPU else "400"))
        self.deadline = self.t0 + self.budget
        self.work = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
        self.out = Path(os.environ.get("OUT") or "/tmp/gpu_check_out")
        if self.work.exists():
            shutil.rmtree(self.work)
        for d in ("raw", "fixtures", "logs", "runs", "json"):
            (self.work / d).mkdir(parents=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.steps: list[dict] = []
        self.cores = len(os.sched_getaffinity(0))
        self.gpu_facts: dict | None = None
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    # ------------------------------------------------------------ helpers

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def capture(self, cmd: list[str], name: str, timeout: float = 20) -> dict:
        """A short command: stdout saved raw as raw/NAME (stderr as NAME.stderr)."""
        rec = {"cmd": shlex.join(cmd)}
        exe = shutil.which(cmd[0], path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if exe is None:
            rec.update(rc=None, error=f"{cmd[0]} not found")
            return rec
        t0 = time.monotonic()
        try:
            p = subprocess.run([exe, *cmd[1:]], capture_output=True, text=True,
                               timeout=min(timeout, max(5.0, self.left())), check=False)
        except subprocess.TimeoutExpired:
            rec.update(rc=None, error=f"timed out after {timeout} s")
            return rec
        except OSError as e:
            rec.update(rc=None, error=f"{type(e).__name__}: {e}")
            return rec
        rec.update(rc=p.returncode, seconds=round(time.monotonic() - t0, 2), file=f"raw/{name}",
                   stdout=p.stdout, stderr=p.stderr)
        (self.work / "raw" / name).write_text(p.stdout)
        if p.stderr:
            (self.work / "raw" / f"{name}.stderr").write_text(p.stderr)
        return rec

    def run(self, cmd: list[str], log: str, cap: float, env: dict | None = None,
            step_deadline: float | None = None) -> dict:
        """A long command in its own session, output to logs/LOG, killed at its cap or the
        budget; a line every 20 s shows it is alive."""
        limit = min(cap, self.left() - 8)
        if step_deadline is not None:
            limit = min(limit, step_deadline - time.monotonic())
        rec = {"cmd": shlex.join(cmd), "log": f"logs/{log}"}
        if limit < 10:
            rec.update(rc=None, skipped=f"not enough time left ({limit:.0f} s)")
            self.say(f"  skip {log}: {rec['skipped']}")
            return rec
        path = self.work / "logs" / log
        self.say(f"  run ({limit:.0f} s cap): {rec['cmd']}")
        t0 = time.monotonic()
        tag = f"{os.getpid()}-{time.monotonic_ns()}"
        with path.open("w") as f:
            f.write(f"$ {rec['cmd']}\n")
            f.flush()
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                 env={**(env or self.env), "GPU_CHECK_TAG": tag},
                                 cwd=ROOT, start_new_session=True)
        rc, timed_out = None, False
        while rc is None:
            try:
                rc = p.wait(timeout=min(20, max(0.1, t0 + limit - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= t0 + limit:
                    timed_out = True
                    self.kill_group(p)
                    rc = p.returncode
                else:
                    self.say(f"    ... {time.monotonic() - t0:.0f} s: {self.last_line(path)}")
        leftovers = self.sweep(tag)
        rec.update(rc=rc, seconds=round(time.monotonic() - t0, 1), timed_out=timed_out,
                   tail=self.tail(path))
        if leftovers:
            rec["leftover_pids_killed"] = leftovers
        self.say(f"  -> rc {rc}{' (TIMED OUT)' if timed_out else ''} in {rec['seconds']} s")
        if rc != 0:
            print("    | " + "\n    | ".join(rec["tail"].splitlines()[-15:]), flush=True)
        return rec

    @staticmethod
    def tagged_pids(tag: str) -> list[int]:
        """Processes whose environment holds GPU_CHECK_TAG=tag (ours, by construction)."""
        want = f"GPU_CHECK_TAG={tag}".encode()
        pids = []
        for d in glob.glob("/proc/[0-9]*"):
            try:
                if want in Path(d, "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.rsplit("/", 1)[1]))
            except OSError:
                continue
        return [p for p in pids if p != os.getpid()]

    def sweep(self, tag: str) -> list[int]:
        """SIGKILL the processes left behind by the command tagged `tag`; their pids."""
        left = self.tagged_pids(tag)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            self.say(f"  killed {len(left)} leftover process(es) of that command: {left}")
        return left

    @staticmethod
    def kill_group(p: subprocess.Popen) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                return
            try:
                p.wait(timeout=10)
                return
            except subprocess.TimeoutExpired:
                continue

    @staticmethod
    def tail(path: Path, n: int = 4000) -> str:
        try:
            return path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def last_line(self, path: Path) -> str:
        lines = [ln for ln in self.tail(path, 2000).splitlines() if ln.strip()]
        return lines[-1][-160:] if lines else "(no output yet)"

    def torchrun(self, args: list[str], wrapped: bool = False) -> list[str]:
        base = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        if wrapped:
            return base + [str(ROOT / "bench" / "gpu_check.py"), "_worker", *args]
        return base + ["-m", *args]

    def save_json(self, name: str, obj) -> None:
        (self.work / "json" / name).write_text(json.dumps(obj, indent=2, default=str) + "\n")

    # ------------------------------------------------------------ steps

    def step(self, label: str, fn, cap: float) -> None:
        rec = {"step": label, "status": "ok", "lines": [], "errors": []}
        self.steps.append(rec)
        self.say(f"=== step {label} (cap {cap:.0f} s, {self.left():.0f} s of budget left)")
        t0 = time.monotonic()
        if self.left() < 15:
            rec["status"] = "skipped: budget spent"
        else:
            try:
                fn(rec, min(time.monotonic() + cap, self.deadline - 8))
            except Exception as e:  # noqa: BLE001 - one step failing must not stop the others
                rec["status"] = "error"
                rec["errors"].append(f"{type(e).__name__}: {e}")
                (self.work / "logs" / f"step-{label.split()[0]}-traceback.txt").write_text(
                    traceback.format_exc())
                traceback.print_exc()
            if rec["errors"] and rec["status"] == "ok":
                rec["status"] = "problems"
        rec["seconds"] = round(time.monotonic() - t0, 1)
        self.say(f"=== step {label}: {rec['status']} in {rec['seconds']} s")
        for line in rec["lines"]:
            print(f"    {line}", flush=True)
        for err in rec["errors"]:
            print(f"    ERROR {err}", flush=True)
        self.package()

    def s0_imports(self, rec: dict, deadline: float) -> None:
        """The trainer catches only ImportError around tensorboard and matplotlib: if one is
        installed but breaks at import in another way (protobuf, numpy ABI), every trainer
        run would fail. Such a package is then hidden behind a stub that raises ImportError
        (the trainer's own fallback: no TensorBoard events / no metrics.png)."""
        L = rec["lines"]
        probes = {"tensorboard": "from torch.utils.tensorboard import SummaryWriter",
                  "matplotlib": "import matplotlib; matplotlib.use('Agg'); "
                                "import matplotlib.pyplot"}
        shim = self.work / "shim"
        for pkg, code in probes.items():
            try:
                p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                                   env=self.env, cwd=ROOT, check=False)
                rc, err = p.returncode, p.stderr.strip().splitlines()
            except subprocess.TimeoutExpired:
                rc, err = None, ["timed out"]
            last = err[-1][:200] if err else ""
            if rc == 0:
                L.append(f"{pkg}: imports")
            elif rc is not None and ("ImportError" in last or "ModuleNotFoundError" in last):
                L.append(f"{pkg}: not importable ({last}); the trainer skips it by itself")
            else:
                (shim / pkg).mkdir(parents=True, exist_ok=True)
                (shim / pkg / "__init__.py").write_text(
                    f"raise ImportError('{pkg} hidden by gpu_check: it failed at import')\n")
                self.env["PYTHONPATH"] = f"{shim}:{self.env.get('PYTHONPATH', '')}"
                L.append(f"{pkg}: BROKEN at import (rc {rc}: {last}); hidden behind a stub for "
                         "the trainer runs (a trainer defect: it catches only ImportError)")
                rec["errors"].append(f"{pkg} fails at import with a non-ImportError")

    def s1_facts(self, rec: dict, deadline: float) -> None:
        gpu = load("roles/preflight/module_utils/torchrig_gpu.py", "torchrig_gpu")
        L = rec["lines"]
        query = ["nvidia-smi", *gpu.NVIDIA_SMI_ARGS]
        cmds = [
            (query, "nvidia-smi-query.txt"),
            (["nvidia-smi"], "nvidia-smi.txt"),
            (["nvidia-smi", "-q"], "nvidia-smi-q.txt"),
            (["nvidia-smi", "topo", "-m"], "nvidia-smi-topo-m.txt"),
            (["nvidia-smi", "-L"], "nvidia-smi-L.txt"),
            (["lspci", "-nn"], "lspci-nn.txt"),
            (["lspci", "-vmm", "-nn"], "lspci-vmm-nn.txt"),
            (["modinfo", "nvidia"], "modinfo-nvidia.txt"),
            (["uname", "-a"], "uname-a.txt"),
            (["uname", "-m"], "uname-m.txt"),
            (["mokutil", "--sb-state"], "mokutil-sb-state.txt"),
            ([PY, "-m", "pip", "list"], "pip-list.txt"),
            (["df", "-h", "/", "/tmp"], "df.txt"),
        ]
        results = {}
        smi_hung = False
        for cmd, name in cmds:
            if smi_hung and cmd[0] == "nvidia-smi":
                results[name] = {"cmd": shlex.join(cmd), "rc": None,
                                 "error": "skipped: an earlier nvidia-smi call timed out"}
                continue
            r = self.capture(cmd, name, timeout=45 if name == "nvidia-smi-q.txt" else 20)
            results[name] = r
            smi_hung = smi_hung or (cmd[0] == "nvidia-smi" and "timed out" in r.get("error", ""))
            if name in ("pip-list.txt", "df.txt"):
                continue
            status = r.get("error") or f"rc {r['rc']}"
            first = (r.get("stdout") or r.get("stderr") or "").strip().splitlines()
            L.append(f"{name}: {status}" + (f" | {first[0][:150]}" if first else ""))
        files = {}
        for pattern in ("/proc/driver/nvidia/version", "/sys/module/nvidia/version",
                        "/proc/driver/nvidia/gpus/*/information", "/etc/os-release",
                        "/proc/driver/nvidia/params"):
            for path in sorted(glob.glob(pattern)):
                try:
                    text = Path(path).read_text(errors="replace")
                except OSError as e:
                    files[path] = f"error: {e}"
                    continue
                files[path] = text
                name = "file" + path.replace("/", "_")
                (self.work / "raw" / name).write_text(text)
            if not glob.glob(pattern):
                files[pattern] = None
        for path, text in files.items():
            if path == "/etc/os-release" or path.endswith("params"):
                continue
            shown = (text or "absent").strip().splitlines()
            L.append(f"{path}: {shown[0][:160] if shown else '(empty)'}")
        mod = results["modinfo-nvidia.txt"]
        if mod.get("rc") == 0:
            lic = [ln for ln in mod["stdout"].splitlines()
                   if re.match(r"^(license|version|filename)\s*:", ln, re.I)]
            L.append("modinfo nvidia: " + "; ".join(" ".join(x.split()) for x in lic))
        facts: dict = {"commands": {k: {kk: vv for kk, vv in v.items() if kk not in ("stdout",)}
                                    for k, v in results.items()},
                       "files_present": {k: v is not None for k, v in files.items()}}

        # The parsers on this host's output, and the fixtures for tests/fixtures/gpu/.
        q = results["nvidia-smi-query.txt"]
        prefix = "gpu"
        if q.get("rc") == 0:
            try:
                gpus = gpu.parse_nvidia_smi(q["stdout"])
                facts["parse_nvidia_smi"] = gpus
                names = {g["name"] for g in gpus}
                m = re.search(r"(H200|H100|A100|B200|L40S|L4|T4|V100)", " ".join(names))
                prefix = m.group(1).lower() if m else "gpu"
                if len(gpus) > 1:
                    prefix += f"-{len(gpus)}x"
                if gpus:
                    L.append(f"tests/test_gpu_facts.py SMI row: (\"{prefix}.nvidia-smi\", "
                             f"{len(gpus)}, {gpus[0]['name']!r}, {gpus[0]['compute_capability']!r}, "
                             f"{gpus[0]['driver_version']!r})")
                for g in gpus:
                    L.append(f"parse_nvidia_smi: GPU {g['index']} {g['name']} cc "
                             f"{g['compute_capability']} driver {g['driver_version']} "
                             f"{g['memory_mib']} MiB bus {g['pci_bus_id']}")
            except Exception as e:  # noqa: BLE001
                facts["parse_nvidia_smi"] = f"error: {type(e).__name__}: {e}"
                rec["errors"].append(f"parse_nvidia_smi failed on this host's output: {e}")
            (self.work / "fixtures" / f"{prefix}.nvidia-smi").write_text(q["stdout"])
        elif CPU:
            L.append("CPU mode: no nvidia-smi query output (expected without a GPU)")
        else:
            rec["errors"].append("nvidia-smi query: " + (q.get("error") or f"rc {q.get('rc')}"))
        lsp = results["lspci-nn.txt"]
        if lsp.get("rc") == 0:
            try:
                facts["parse_lspci"] = gpu.parse_lspci(lsp["stdout"])
                for g in facts["parse_lspci"]:
                    dev = g["pci_device_id"].split(":")[1]
                    L.append(f"parse_lspci: {g['pci_bus_id']} {g['name']!r} {g['pci_device_id']} "
                             f"cc {g['compute_capability']} (device id in DEVICE_ID_CC: "
                             f"{dev in gpu.DEVICE_ID_CC})")
                if not facts["parse_lspci"]:
                    L.append("parse_lspci: no NVIDIA GPU in lspci -nn output")
            except Exception as e:  # noqa: BLE001
                facts["parse_lspci"] = f"error: {type(e).__name__}: {e}"
                rec["errors"].append(f"parse_lspci failed: {e}")
            (self.work / "fixtures" / f"{prefix}.lspci").write_text(lsp["stdout"])
        for path in ("/sys/module/nvidia/version", "/proc/driver/nvidia/version"):
            if files.get(path):
                facts[f"parse_driver_version {path}"] = gpu.parse_driver_version(files[path])
                L.append(f"parse_driver_version({path}) = {facts[f'parse_driver_version {path}']}")

        # The gpu_facts module itself, as Ansible would run it on this host.
        try:
            module_result = run_gpu_facts_module(gpu)
            facts["gpu_facts_module"] = module_result
            self.gpu_facts = module_result
            g = module_result.get("gpu", {})
            L.append(f"gpu_facts module: source {g.get('source')} count {g.get('count')} ccs "
                     f"{g.get('compute_capabilities')} driver {g.get('driver_version')} notes "
                     f"{g.get('notes')}")
            L.append(f"gpu_facts module: secure_boot {module_result.get('secure_boot')} disk "
                     f"{module_result.get('disk')} failed={module_result.get('failed', False)}")
            if module_result.get("failed"):
                rec["errors"].append(f"gpu_facts module failed: {module_result.get('msg')}")
        except Exception as e:  # noqa: BLE001
            facts["gpu_facts_module"] = f"error: {type(e).__name__}: {e}"
            rec["errors"].append(f"gpu_facts module: {type(e).__name__}: {e}")
        if CPU and not facts.get("parse_nvidia_smi"):
            # CPU smoke test: the same parsers on a recorded fixture, so their path runs.
            fx = ROOT / "tests" / "fixtures" / "gpu"
            facts["cpu_mode_fixture_parse"] = {
                "h100-8x.nvidia-smi": gpu.parse_nvidia_smi((fx / "h100-8x.nvidia-smi").read_text()),
                "h100.lspci": gpu.parse_lspci((fx / "h100.lspci").read_text())}
            L.append("CPU mode: parsed fixtures h100-8x.nvidia-smi ("
                     f"{len(facts['cpu_mode_fixture_parse']['h100-8x.nvidia-smi'])} GPUs) and "
                     f"h100.lspci ({len(facts['cpu_mode_fixture_parse']['h100.lspci'])} GPUs)")
        fixtures = sorted(p.name for p in (self.work / "fixtures").iterdir())
        L.append(f"fixtures saved (tar: fixtures/): {fixtures}")
        self.save_json("gpu_facts.json", facts)

    def s2_matrix(self, rec: dict, deadline: float) -> None:
        L = rec["lines"]
        stack = load("roles/preflight/filter_plugins/torchrig_stack.py", "torchrig_stack")
        matrix = stack.load_matrix((ROOT / "roles/preflight/files/compat_matrix.yml").read_text())
        if matrix["errors"]:
            rec["errors"].append(f"matrix errors: {matrix['errors']}")
            return
        rows = matrix["rows"]
        osr = {}
        if Path("/etc/os-release").exists():
            for line in Path("/etc/os-release").read_text().splitlines():
                k, _, v = line.partition("=")
                osr[k] = v.strip().strip('"')
        distro, version = osr.get("ID", "unknown"), osr.get("VERSION_ID", "0")
        os_id = stack.os_id(distro.capitalize(), version)
        L.append(f"host OS: {osr.get('PRETTY_NAME')} -> os id {os_id}")
        found = self.gpu_facts or {}
        g = found.get("gpu") or {}
        sb = found.get("secure_boot") or {}
        disk = found.get("disk") or {}

        def host(**kw):
            h = {"name": socket.gethostname(), "os": os_id,
                 "os_name": f"{distro.capitalize()} {version}",
                 "gpu_group": bool(g.get("count")), "cpu_group": False,
                 "gpus": g.get("gpus") or [], "gpu_count": g.get("count") or 0,
                 "gpu_notes": g.get("notes") or [], "driver_version": g.get("driver_version"),
                 "manage_driver": True, "driver_branch_max": "",
                 "secure_boot": sb.get("enabled", False), "signing_key": sb.get("signing_key"),
                 "signing_key_enrolled": sb.get("signing_key_enrolled", False),
                 "free_bytes": disk.get("free_bytes"), "disk_path": disk.get("path"),
                 "min_free_gib": 10}
            h.update(kw)
            return h

        cases = [("this host, torch 2.11.0 cu130", host(), TORCH, VARIANT),
                 ("this host, nvidia_driver_manage false", host(manage_driver=False), TORCH,
                  VARIANT),
                 ("this host, no torch/variant asked (preflight's default pick)", host(), None,
                  None)]
        if not any(os_id in r["os"] for r in rows):
            cases.append(("this host with its OS taken as ubuntu2404 (GPU checks only)",
                          host(os="ubuntu2404"), TORCH, VARIANT))
        if not g.get("count"):
            gpu = load("roles/preflight/module_utils/torchrig_gpu.py", "torchrig_gpu")
            fx = gpu.parse_nvidia_smi(
                (ROOT / "tests/fixtures/gpu/h100-8x.nvidia-smi").read_text())
            cases.append(("NO GPU HERE: fixture h100-8x instead, ubuntu2404",
                          host(os="ubuntu2404", gpus=fx, gpu_count=len(fx), gpu_group=True,
                               driver_version=fx[0]["driver_version"]), TORCH, VARIANT))
        selections = []
        chosen = None
        for label, h, torch_v, variant in cases:
            sel = stack.select_stack(rows, [h], torch_v, variant)
            selections.append({"case": label, "host": h, "torch": torch_v, "variant": variant,
                               **sel})
            if sel["row"]:
                r = sel["row"]
                L.append(f"select_stack [{label}]: row torch {r['torch']} {r['variant']} (CUDA "
                         f"{r.get('cuda')}, min driver {r.get('min_driver')}), profile "
                         f"{sel['profiles']}")
                if chosen is None and torch_v == TORCH:
                    chosen = r
            else:
                L.append(f"select_stack [{label}]: REFUSED: {sel['problems']}")
        self.save_json("matrix_selection.json", selections)

        info_path = self.work / "json" / "torchinfo.json"
        r = self.run([PY, str(ROOT / "bench" / "gpu_check.py"), "_torchinfo", str(info_path)],
                     "torchinfo.log", cap=120, step_deadline=deadline)
        rec.setdefault("runs", {})["torchinfo"] = r
        if r.get("rc") != 0 or not info_path.exists():
            rec["errors"].append(f"torchinfo failed (rc {r.get('rc')}), see logs/torchinfo.log")
            return
        info = json.loads(info_path.read_text())
        for k in ("torch", "torch_version_cuda", "cudnn_version", "nccl_version", "cuda_available",
                  "device_name", "capability", "total_memory_mib",
                  "bf16_supported_no_emulation", "bf16_supported_default", "arch_list",
                  "torchvision_version", "triton_version", "numpy_version", "python",
                  "bf16_matmul_rel_err", "bf16_conv_channels_last", "mlxtend_spec",
                  "import_torch_s"):
            L.append(f"{k}: {info.get(k)}")
        row = chosen or next((x for x in rows if x["torch"] == TORCH and x["variant"] == VARIANT),
                             None)
        if row:
            base = str(info.get("torch", "")).split("+")[0]
            checks = {
                "torch matches row": base == row["torch"],
                "torchvision matches row":
                    str(info.get("torchvision_version", "")).split("+")[0] == row["torchvision"],
                "torch.version.cuda matches row cuda": info.get("torch_version_cuda") == row["cuda"],
                "sm_90 in arch_list": "sm_90" in (info.get("arch_list") or []),
            }
            drv = g.get("driver_version")
            if drv:
                checks["driver >= row min_driver"] = (
                    stack.version_tuple(drv) >= stack.version_tuple(row["min_driver"]))
            cudnn = info.get("cudnn_version")
            L.append(f"cudnn: torch's bundled {cudnn} vs the row's apt package "
                     f"{row['cudnn_package']} {row['cudnn_version']} (informational: pip wheels "
                     "bundle their own cuDNN)")
            for k, v in checks.items():
                L.append(f"check {k}: {v}")
                if not v and not CPU:
                    rec["errors"].append(f"check failed: {k}")
            self.save_json("torch_vs_row.json", {"row": row, "checks": checks, "info": info})

    def summary_of(self, run_dir: Path) -> dict:
        out: dict = {}
        s = run_dir / "summary.json"
        if s.exists():
            out = json.loads(s.read_text())
        m = run_dir / "metrics.jsonl"
        if m.exists():
            recs = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
            sps = [r["samples_per_s"] for r in recs if r["split"] == "train"]
            if len(sps) > 2:
                out["steady_samples_per_s"] = statistics.median(sps[1:])
                out["first_window_samples_per_s"] = sps[0]
            out["eval"] = [(r["step"], round(r["accuracy"], 4), round(r["loss"], 4))
                           for r in recs if r["split"] == "eval"]
        return out

    def train_line(self, name: str, r: dict, s: dict) -> str:
        if r.get("rc") != 0:
            return f"{name}: FAILED rc {r.get('rc')} {r.get('skipped', '')} (log {r.get('log')})"
        steady = s.get("steady_samples_per_s")
        return (f"{name}: accuracy {s.get('accuracy', float('nan')):.4f} loss "
                f"{s.get('loss', float('nan')):.4f}, {s.get('steps')} steps, global batch "
                f"{s.get('global_batch')}, {s.get('precision')}, samples/s "
                f"{s.get('samples_per_s') or 0:.0f} (summary) / "
                f"{steady or 0:.0f} (median window after the first), duration "
                f"{s.get('duration_s', 0):.1f} s, run {r.get('seconds')} s")

    def s3_trainer(self, rec: dict, deadline: float) -> None:
        L = rec["lines"]
        runs = rec.setdefault("runs", {})
        prec = "fp32" if CPU else "bf16"
        results = {}

        # a. mnist5k, the trainer as it runs in production (torchrun, 1 process).
        rd = self.work / "runs" / "mnist5k"
        args = ["torchrig.train", "--dataset", "mnist5k", "--precision", prec,
                "--run-dir", str(rd)] + (["--epochs", "1"] if CPU else [])
        r = self.run(self.torchrun(args), "train-mnist5k.log", cap=150, step_deadline=deadline)
        s = self.summary_of(rd)
        runs["mnist5k"], results["mnist5k"] = r, s
        L.append(self.train_line(f"mnist5k {prec} ({'1 epoch' if CPU else 'defaults: 6 epochs'}"
                                 ", batch 32)", r, s))
        backend = re.findall(r"backend (\S+)", self.tail(self.work / "logs" /
                                                          "train-mnist5k.log", 10**6))
        L.append(f"  startup line backend: {backend[:1]} (torchrig makes no process group at "
                 "world size 1)")
        if r.get("rc") != 0 and not r.get("skipped"):
            rec["errors"].append("mnist5k run failed")

        # b. resnet18 on CIFAR-10-shaped synthetic data (3x32x32; 25000 / 5000 to save time).
        rd = self.work / "runs" / "resnet18-synth"
        synth = "3x32x32:512:256" if CPU else "3x32x32:25000:5000"
        env = {**self.env, "GPU_CHECK_SYNTH": synth}
        args = ["torchrig.train", "--dataset", "synthetic", "--model", "resnet18", "--precision",
                prec, "--channels-last", "--checkpoint-every", "0", "--run-dir", str(rd)]
        args += (["--batch-size", "16", "--epochs", "1", "--max-steps", "4",
                  "--eval-batch-size", "128"] if CPU else
                 ["--batch-size", "256", "--epochs", "3",
                  "--eval-batch-size", "1000", "--log-every", "20"])
        r = self.run(self.torchrun(args, wrapped=True), "train-resnet18-synth.log", cap=180,
                     env=env, step_deadline=deadline)
        s = self.summary_of(rd)
        runs["resnet18_synth"], results["resnet18_synth"] = r, s
        L.append(self.train_line(f"resnet18 synthetic {synth} {prec} channels-last", r, s))
        if r.get("rc") != 0 and not r.get("skipped"):
            rec["errors"].append("resnet18 synthetic run failed")

        # c. SIGKILL after the first checkpoint, then the same command again: it resumes.
        results["kill_resume"] = self.kill_resume(rec, deadline)

        # d. mnist5k with a process group forced at world size 1 (nccl on the GPU).
        rd = self.work / "runs" / "mnist5k-pg"
        env = {**self.env, "GPU_CHECK_FORCE_PG": "1", "NCCL_DEBUG": "INFO"}
        args = ["torchrig.train", "--dataset", "mnist5k", "--precision", prec, "--epochs",
                "1" if CPU else "2", "--checkpoint-every", "50", "--run-dir", str(rd)]
        r = self.run(self.torchrun(args, wrapped=True), "train-mnist5k-forced-pg.log", cap=120,
                     env=env, step_deadline=deadline)
        s = self.summary_of(rd)
        runs["mnist5k_forced_pg"], results["mnist5k_forced_pg"] = r, s
        backend = re.findall(r"backend (\S+)", self.tail(self.work / "logs" /
                                                          "train-mnist5k-forced-pg.log", 10**6))
        nccl = re.findall(r"NCCL version [^\n]*", self.tail(self.work / "logs" /
                                                          "train-mnist5k-forced-pg.log", 200000))
        L.append(self.train_line(f"mnist5k {prec}, forced process group", r, s))
        L.append(f"  backend {backend[:1]}; {nccl[:1]}")
        if r.get("rc") != 0 and not r.get("skipped"):
            rec["errors"].append("mnist5k with a forced process group failed")

        self.save_json("trainer.json", results)

    def kill_resume(self, rec: dict, deadline: float) -> dict:
        L = rec["lines"]
        rd = self.work / "runs" / "kill-resume"
        ckpt_dir = rd / "checkpoints"
        epochs, every = ("3", "20") if CPU else ("20", "100")
        prec = "fp32" if CPU else "bf16"
        args = ["torchrig.train", "--dataset", "mnist5k", "--precision", prec, "--epochs", epochs,
                "--checkpoint-every", every, "--run-dir", str(rd)]
        cmd = self.torchrun(args)
        out: dict = {"cmd": shlex.join(cmd)}
        limit = min(120, deadline - time.monotonic(), self.left() - 8)
        if limit < 30:
            L.append(f"kill/resume: skipped, {limit:.0f} s left")
            out["skipped"] = True
            return out
        log = self.work / "logs" / "kill-resume-1.log"
        self.say(f"  kill/resume: first run: {out['cmd']}")
        t0 = time.monotonic()
        tag = f"{os.getpid()}-kill-{time.monotonic_ns()}"
        with log.open("w") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                 env={**self.env, "GPU_CHECK_TAG": tag}, cwd=ROOT,
                                 start_new_session=True)
        killed_pid = None
        steps_at_kill: list[int] = []
        while time.monotonic() - t0 < limit / 2:
            if p.poll() is not None:
                break
            steps = sorted(int(m.group(1)) for x in (ckpt_dir.glob("ckpt_*.pt")
                                                     if ckpt_dir.is_dir() else [])
                           if (m := re.match(r"ckpt_(\d+)\.pt$", x.name)))
            pidf = rd / "worker-rank0.pid"
            if steps and pidf.exists():
                killed_pid = int(pidf.read_text())
                steps_at_kill = steps
                os.killpg(p.pid, signal.SIGKILL)  # the launcher's process group
                p.wait(timeout=30)
                time.sleep(0.5)
                try:  # alive: /proc/PID exists and is not a zombie
                    stat = Path(f"/proc/{killed_pid}/stat").read_text()
                    survived = stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
                except (OSError, IndexError):
                    survived = False
                out["worker_survived_launcher_kill"] = survived
                self.say(f"  kill/resume: SIGKILL to launcher pgid {p.pid} at checkpoints "
                         f"{steps}; worker {killed_pid} still running: {survived}")
                if survived:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(killed_pid, signal.SIGKILL)  # its own session and group
                break
            time.sleep(0.01)
        try:
            rc1 = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill_group(p)
            rc1 = p.returncode
        out["leftovers_killed"] = self.sweep(tag)
        for _ in range(100):  # the worker must be gone before the same run dir is reused
            if not self.tagged_pids(tag):
                break
            time.sleep(0.1)
        steps_after = sorted(int(m.group(1)) for x in ckpt_dir.glob("ckpt_*.pt")
                             if (m := re.match(r"ckpt_(\d+)\.pt$", x.name))) \
            if ckpt_dir.is_dir() else []
        out.update(first_rc=rc1, killed_pid=killed_pid, ckpt_steps_seen=steps_at_kill,
                   ckpt_steps_after_kill=steps_after, first_seconds=round(time.monotonic() - t0, 1),
                   finished_before_kill=(rd / "summary.json").exists())
        self.say(f"  kill/resume: killed pid {killed_pid} at checkpoints {steps_at_kill}; "
                 f"launcher rc {rc1}; checkpoints now {steps_after}")
        if killed_pid is None:
            rec["errors"].append("kill/resume: no checkpoint appeared before the run ended or "
                                 "the wait ran out (log logs/kill-resume-1.log)")
            L.append(f"kill/resume: NOT KILLED (first run rc {rc1}, finished "
                     f"{out['finished_before_kill']})")
            return out
        r = self.run(cmd, "kill-resume-2.log", cap=120, step_deadline=deadline)
        s = self.summary_of(rd)
        resumed_log = re.findall(r"resumed from step (\d+)", self.tail(
            self.work / "logs" / "kill-resume-2.log", 200000))
        expect = max(steps_after) if steps_after else None
        out.update(second=r, summary=s, resumed_log=resumed_log)
        ok = (r.get("rc") == 0 and s.get("resumed_from_step") == expect
              and s.get("steps") == int(epochs) * 125)
        out["ok"] = ok
        L.append(f"kill/resume: SIGKILL to the launcher's process group after checkpoint(s) "
                 f"{steps_at_kill} (launcher rc {rc1}; worker outlived it: "
                 f"{out.get('worker_survived_launcher_kill')}, then killed), rerun rc "
                 f"{r.get('rc')}: resumed_from_step "
                 f"{s.get('resumed_from_step')} (newest checkpoint {expect}; log says "
                 f"{resumed_log}), finished at step {s.get('steps')} of {int(epochs) * 125}, "
                 f"accuracy {s.get('accuracy')}, ok={ok}")
        if not ok:
            rec["errors"].append("kill/resume did not resume and finish as expected")
        return out

    def s4_bench(self, rec: dict, deadline: float) -> None:
        """bench_trainer.py's 1-process comparison: its reference worker (the tutorial loop)
        and the trainer, with the exact commands its launch() builds for nproc 1."""
        L = rec["lines"]
        bench = ROOT / "bench" / "bench_trainer.py"
        threads = str(self.cores)
        epochs = "1" if CPU else "2"

        def ref(batch: str) -> tuple[list[str], Path]:
            outp = self.work / "runs" / f"bench-ref-b{batch}.json"
            return ([PY, str(bench), "--reference-worker", "--out", str(outp), "--threads",
                     threads, "--epochs", epochs, "--batch-size", batch], outp)

        def trainer(name: str, batch: str, flags: str) -> tuple[list[str], Path]:
            rd = self.work / "runs" / f"bench-{name}"
            return ([PY, "-m", "torchrig.train", "--dataset", "mnist5k", "--epochs", epochs,
                     "--batch-size", batch, "--threads", threads, "--checkpoint-every", "0",
                     "--run-dir", str(rd), *shlex.split(flags)], rd)

        if CPU:
            configs = [("ref-b32", "32", None), ("fp32", "32", "--precision fp32"),
                       ("fp32-cl", "32", "--precision fp32 --channels-last")]
            if os.environ.get("GPU_CHECK_CPU_COMPILE") == "1":
                configs.append(("fp32-cl-compile", "32",
                                "--precision fp32 --channels-last --compile"))
        else:
            # bf16-cl before the compile run: a slow compile must not cost the main ratio.
            configs = [("ref-b32", "32", None),
                       ("bf16-cl", "32", "--precision bf16 --channels-last"),
                       ("bf16-cl-compile", "32", "--precision bf16 --channels-last --compile"),
                       ("fp32", "32", "--precision fp32"),
                       ("auto", "32", ""),
                       ("ref-b256", "256", None),
                       ("bf16-cl-b256", "256", "--precision bf16 --channels-last")]
        res: dict = {}
        for name, batch, flags in configs:
            if flags is None:
                cmd, outp = ref(batch)
                r = self.run(cmd, f"bench-{name}.log", cap=120, step_deadline=deadline)
                sps = json.loads(outp.read_text())["samples_per_s"] \
                    if r.get("rc") == 0 and outp.exists() else None
                res[name] = {"run": r, "samples_per_s": sps, "batch": batch}
                L.append(f"reference (tutorial loop, fp32) batch {batch}: "
                         + (f"{sps:.0f} samples/s" if sps else f"FAILED/skipped rc {r.get('rc')}"))
            else:
                cmd, rd = trainer(name, batch, flags)
                cap = 240 if "--compile" in flags else 120
                r = self.run(cmd, f"bench-{name}.log", cap=cap, step_deadline=deadline)
                s = self.summary_of(rd) if r.get("rc") == 0 else {}
                refv = res.get(f"ref-b{batch}", {}).get("samples_per_s")
                sps, steady = s.get("samples_per_s"), s.get("steady_samples_per_s")
                res[name] = {"run": r, "flags": flags, "batch": batch, "summary": s,
                             "ratio": sps / refv if sps and refv else None,
                             "ratio_steady": steady / refv if steady and refv else None}
                if r.get("rc") == 0 and sps:
                    ratio = f"{sps / refv:.2f}" if refv else "n/a"
                    rs = f"{steady / refv:.2f}" if steady and refv else "n/a"
                    L.append(f"trainer [{flags or 'defaults (auto)'}] batch {batch}: "
                             f"{sps:.0f} samples/s (summary), {steady or 0:.0f} steady; ratio to "
                             f"reference {ratio} (summary) / {rs} (steady); accuracy "
                             f"{s.get('accuracy', 0):.4f}, precision {s.get('precision')}")
                else:
                    L.append(f"trainer [{flags}] batch {batch}: FAILED/skipped rc {r.get('rc')} "
                             f"{r.get('skipped', '')} (log {r.get('log')})")
                    if not r.get("skipped"):
                        rec["errors"].append(f"bench trainer {name} failed")
            self.save_json("bench.json", res)
        ratios = [(v["ratio_steady"] or 0, v["ratio"] or 0, k) for k, v in res.items()
                  if "ratio" in v and v["ratio"]]
        if ratios:
            best = max(ratios)
            L.append(f"best trainer/reference ratio: {best[2]}: {best[1]:.2f} (summary), "
                     f"{best[0]:.2f} (steady); target >= 2")
        L.append("ratio = trainer samples/s / reference samples/s; 'summary' is summary.json's "
                 "figure (includes warm-up and torch.compile time in the first window), "
                 "'steady' the median of the train log windows after the first")

    def s5_allreduce(self, rec: dict, deadline: float) -> None:
        L = rec["lines"]
        runs = rec.setdefault("runs", {})
        sizes = ["--min-bytes", "1K", "--max-bytes", "1M" if CPU else "64M", "--iters",
                 "5" if CPU else "20", "--warmup", "2" if CPU else "5"]
        for name, wrapped in (("as-is", False), ("forced-pg", True)):
            js = self.work / "json" / f"allreduce-{name}.json"
            env = {**self.env, "GPU_CHECK_FORCE_PG": "1", "NCCL_DEBUG": "INFO"} if wrapped \
                else self.env
            r = self.run(self.torchrun(["torchrig.allreduce_bench", *sizes, "--json", str(js)],
                                       wrapped=wrapped), f"allreduce-{name}.log", cap=90, env=env,
                         step_deadline=deadline)
            runs[name] = r
            if r.get("rc") == 0 and js.exists():
                d = json.loads(js.read_text())
                big = d["results"][-1]
                L.append(f"allreduce_bench {name}: world {d['world_size']} backend {d['backend']} "
                         f"device {d['device']}; {big['bytes']} B: {big['time_us']:.1f} us, algbw "
                         f"{big['algbw_GBps']:.1f} GB/s, busbw {big['busbw_GBps']:.1f} GB/s")
                if name == "forced-pg":
                    nccl = re.findall(r"NCCL version [^\n]*", self.tail(
                        self.work / "logs" / "allreduce-forced-pg.log", 200000))
                    L.append(f"  {nccl[:1]}")
            else:
                L.append(f"allreduce_bench {name}: FAILED rc {r.get('rc')} (log {r.get('log')})")
                rec["errors"].append(f"allreduce_bench {name} failed")
        js = self.work / "json" / "ddp_probe.json"
        env = {**self.env, "NCCL_DEBUG": "INFO"}
        r = self.run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                      str(ROOT / "bench" / "gpu_check.py"), "_ddp_probe", str(js)],
                     "ddp-probe.log", cap=90, env=env, step_deadline=deadline)
        runs["ddp_probe"] = r
        if r.get("rc") == 0 and js.exists():
            d = json.loads(js.read_text())
            L.append(f"DDP/collectives probe: backend {d.get('backend')} world "
                     f"{d.get('world_size')} init {d.get('init_s')} s, ok {d.get('ok')}, loss "
                     f"{d.get('ddp_loss_first_last')}")
            if not d.get("ok"):
                rec["errors"].append("DDP probe: a check failed")
        else:
            L.append(f"DDP probe: FAILED rc {r.get('rc')} (log logs/ddp-probe.log)")
            rec["errors"].append("DDP probe failed")
            if not r.get("skipped") and not CPU:
                # One diagnostic retry: NCCL's cuMem allocations are what a VM most often lacks.
                env = {**env, "NCCL_CUMEM_ENABLE": "0"}
                r2 = self.run([PY, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "1", str(ROOT / "bench" / "gpu_check.py"),
                               "_ddp_probe", str(js)], "ddp-probe-cumem0.log", cap=60, env=env,
                              step_deadline=deadline)
                runs["ddp_probe_cumem0"] = r2
                L.append(f"DDP probe retry with NCCL_CUMEM_ENABLE=0: rc {r2.get('rc')} "
                         "(log logs/ddp-probe-cumem0.log)")

    # ------------------------------------------------------------ output

    def summary_text(self) -> str:
        lines = [f"gpu_check: mode {'CPU smoke test' if CPU else 'GPU'}, host "
                 f"{socket.gethostname()}, {self.cores} cores, python {sys.version.split()[0]}, "
                 f"elapsed {time.monotonic() - self.t0:.1f} s of a {self.budget:.0f} s budget",
                 f"work dir {self.work} (tarred without *.pt); OUT {self.out}"]
        for s in self.steps:
            lines.append("")
            lines.append(f"[step {s['step']}] {s['status']} in {s.get('seconds', '?')} s")
            lines += [f"  {x}" for x in s["lines"]]
            lines += [f"  ERROR {x}" for x in s["errors"]]
        return "\n".join(lines) + "\n"

    def package(self) -> None:
        text = self.summary_text()
        (self.work / "summary.txt").write_text(text)
        self.save_json("steps.json", self.steps)
        (self.out / "summary.txt").write_text(text)
        tmp = self.out / ".gpu_check.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.work, arcname="gpu_check",
                    filter=lambda ti: None if ti.name.endswith(".pt") else ti)
        if tmp.stat().st_size > 15 * 2**20:  # the limit is 16 MiB a file
            with tarfile.open(tmp, "w:gz") as tar:
                for sub in ("summary.txt", "raw", "fixtures", "json", "logs"):
                    tar.add(self.work / sub, arcname=f"gpu_check/{sub}")
        os.replace(tmp, self.out / "gpu_check.tar.gz")


def run_gpu_facts_module(gpu_utils) -> dict:
    """roles/preflight/library/gpu_facts.py's main() on this host, with a stand-in for
    AnsibleModule (Ansible is not installed on the GPU machine). Returns exit_json's or
    fail_json's arguments, plus the commands the module ran."""

    class Done(Exception):
        pass

    class FakeAnsibleModule:
        commands: list = []

        def __init__(self, argument_spec, supports_check_mode=False):
            self.params = {k: v.get("default") for k, v in argument_spec.items()}

        def get_bin_path(self, name, required=False, opt_dirs=None):
            # Ansible also looks in the sbin directories.
            return shutil.which(name, path=os.environ.get("PATH", "") +
                                ":/sbin:/usr/sbin:/usr/local/sbin")

        def run_command(self, args, **kw):
            p = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
            FakeAnsibleModule.commands.append({"args": args, "rc": p.returncode})
            return p.returncode, p.stdout, p.stderr

        def exit_json(self, **kw):
            raise Done(kw)

        def fail_json(self, **kw):
            raise Done({"failed": True, **kw})

    names = ("ansible", "ansible.module_utils", "ansible.module_utils.basic",
             "ansible.module_utils.torchrig_gpu")
    saved = {n: sys.modules.get(n) for n in names}
    try:
        for n in names[:3]:
            sys.modules[n] = types.ModuleType(n)
        sys.modules["ansible.module_utils.basic"].AnsibleModule = FakeAnsibleModule
        sys.modules["ansible.module_utils.torchrig_gpu"] = gpu_utils
        mod = load("roles/preflight/library/gpu_facts.py", "gpu_facts_module")
        try:
            mod.main()
            result = {"failed": True, "msg": "main() returned without exit_json"}
        except Done as d:
            result = d.args[0]
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    result["commands_run"] = FakeAnsibleModule.commands
    return result


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        cmd, rest = sys.argv[1], sys.argv[2:]
        if cmd == "_worker":
            sub_worker(rest)
        elif cmd == "_torchinfo":
            sub_torchinfo(rest[0])
        elif cmd == "_ddp_probe":
            sub_ddp_probe(rest[0])
        else:
            sys.exit(f"unknown sub-command {cmd}")
        return 0

    c = Check()
    c.say(f"gpu_check: {'CPU' if CPU else 'GPU'} mode, budget {c.budget:.0f} s, work {c.work}, "
          f"OUT {c.out}, python {PY}")
    c.say(f"PYTHONPATH={os.environ.get('PYTHONPATH')}")
    try:
        c.step("0 optional imports", c.s0_imports, cap=60)
        c.step("1 gpu facts", c.s1_facts, cap=60)
        c.step("2 matrix + torch", c.s2_matrix, cap=100)
        c.step("5 allreduce + nccl", c.s5_allreduce, cap=100 if not CPU else 200)
        # Leave step 4 at least 130 s (GPU) of the budget.
        reserve = 0 if CPU else 130
        c.step("3 trainer", c.s3_trainer, cap=max(60, c.left() - reserve - 10))
        c.step("4 bench_trainer", c.s4_bench, cap=c.left())
    finally:
        c.package()
    text = c.summary_text()
    print("\n" + "=" * 30 + " summary " + "=" * 30 + "\n" + text, flush=True)
    return 0 if all(s["status"] == "ok" for s in c.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
