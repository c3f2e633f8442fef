"""Parsers and judgements for health.yml's GPU checks: `nvidia-smi -q`, Xid lines in the
kernel log and `dcgmi diag`.

Pure functions over command output, unit-tested on recorded output
(tests/test_gpu_health.py) and used by the gpu_health module on the hosts.
"""

from __future__ import annotations

import re

# Xids a user's program causes (an illegal address, a killed process's cleanup),
# not the hardware: reported, but not a problem of the node by default.
# NVIDIA's Xid catalogue: https://docs.nvidia.com/deploy/xid-errors/
APPLICATION_XIDS = (13, 31, 43, 45)

# Fabric states that are fine: done, or no NVSwitch fabric on this board.
FABRIC_OK_STATES = ("Completed", "N/A", "Not Supported")
FABRIC_OK_STATUSES = ("Success", "N/A", "Not Supported")

_KV = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s(?P<value>.*))?$")
# A note row of dcgmi diag's table: "Warning" (DCGM 3) or "Warning: GPU1" (DCGM 4).
_DCGM_NOTE = re.compile(r"^(Warning|Info|Error)(:\s*GPU\s*\d+)?$")
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<detail>.*)$")


def parse_smi_tree(text: str) -> dict:
    """`nvidia-smi -q` as nested dicts: "Key : value" lines are leaves, a line without
    " : " opens a section of the lines indented under it.

    A leaf followed by deeper lines (a process under "Processes") becomes a section
    named "key value". Values stay strings ("N/A", "Enabled", "0").
    """
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    last: tuple[int, dict, str, str] | None = None  # the previous leaf: indent, parent, key, value
    for raw in text.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("="):
            continue
        indent = len(line) - len(line.lstrip(" "))
        if last is not None and indent > last[0]:
            l_indent, parent, key, value = last
            section: dict = {}
            parent.pop(key, None)
            parent[f"{key} {value}".strip()] = section
            stack.append((l_indent, section))
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        m = _KV.match(stripped)
        if m:
            key, value = m.group("key").strip(), (m.group("value") or "").strip()
            parent[key] = value
            last = (indent, parent, key, value)
        else:
            section = {}
            parent[stripped] = section
            stack.append((indent, section))
            last = None
    return root


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _uncorrectable(section: object) -> int | None:
    """Sum of the uncorrectable ECC counters of a Volatile or Aggregate section.

    Drivers name them differently: "DRAM Uncorrectable", "SRAM Uncorrectable Parity",
    "SRAM Uncorrectable SEC-DED" (R550 and newer), "SRAM Uncorrectable" (R470-R535),
    a "Double Bit" section with a "Total" (older). None: no ECC ("N/A", GeForce).
    """
    if not isinstance(section, dict):
        return None
    total = None
    for key, value in section.items():
        if isinstance(value, dict):
            if key.startswith("Double Bit"):
                n = _count(value.get("Total"))
                if n is not None:
                    total = (total or 0) + n
            continue
        n = _count(value)
        if n is not None and "Uncorrectable" in key:
            total = (total or 0) + n
    return total


def _yes(section: dict, key: str) -> bool | None:
    """A Yes/No field: True, False, or None where this driver does not print it."""
    value = section.get(key)
    return None if not isinstance(value, str) or value not in ("Yes", "No") else value == "Yes"


def parse_nvidia_smi_q(text: str) -> dict:
    """What health.yml checks, per GPU, from `nvidia-smi -q`."""
    tree = parse_smi_tree(text)
    if "Attached GPUs" not in tree:
        raise ValueError(f"not nvidia-smi -q output (no 'Attached GPUs'): {text.strip()[:200]!r}")
    gpus = []
    for key, gpu in tree.items():
        if not (key.startswith("GPU ") and isinstance(gpu, dict)):
            continue
        ecc = gpu.get("ECC Errors") if isinstance(gpu.get("ECC Errors"), dict) else {}
        ecc_mode = gpu.get("ECC Mode") or gpu.get("Ecc Mode")  # "Ecc Mode" before R510
        remap = gpu.get("Remapped Rows") if isinstance(gpu.get("Remapped Rows"), dict) else {}
        retired = gpu.get("Retired Pages") if isinstance(gpu.get("Retired Pages"), dict) else {}
        fabric = gpu.get("Fabric") if isinstance(gpu.get("Fabric"), dict) else {}
        gpus.append(
            {
                "index": len(gpus),
                "pci_bus_id": key[len("GPU "):],
                "name": gpu.get("Product Name"),
                "persistence_mode": gpu.get("Persistence Mode"),
                "ecc_mode": ecc_mode.get("Current") if isinstance(ecc_mode, dict) else None,
                "ecc_uncorrectable_volatile": _uncorrectable(ecc.get("Volatile")),
                "ecc_uncorrectable_aggregate": _uncorrectable(ecc.get("Aggregate")),
                "rows_remap_pending": remap.get("Pending") == "Yes",
                "rows_remap_failed": remap.get("Remapping Failure Occurred") == "Yes",
                "pages_retirement_pending": "Yes"
                in (retired.get("Pending Page Blacklist"), retired.get("Pending Page Retirement")),
                # R580 prints these under ECC Errors (None before): memory the GPU cannot
                # repair any more, a channel or TPC repair waiting for a reset, and SRAM
                # uncorrectable errors over NVIDIA's threshold (under Aggregate).
                "ecc_unrepairable_memory": _yes(ecc, "Unrepairable Memory"),
                "ecc_channel_repair_pending": _yes(ecc, "Channel Repair Pending"),
                "ecc_tpc_repair_pending": _yes(ecc, "TPC Repair Pending"),
                "ecc_sram_threshold_exceeded": _yes(
                    ecc.get("Aggregate") if isinstance(ecc.get("Aggregate"), dict) else {}, "SRAM Threshold Exceeded"
                ),
                # Absent before R470 (no fabric reporting): None.
                "fabric_state": fabric.get("State"),
                "fabric_status": fabric.get("Status"),
            }
        )
    return {
        "driver_version": tree.get("Driver Version"),
        "attached_gpus": _count(tree.get("Attached GPUs")),
        "gpus": gpus,
    }


def parse_xids(text: str) -> list[dict]:
    """Xid lines of a kernel log (journalctl -k or dmesg):
    "... NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    """
    xids = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            xids.append(
                {
                    "pci_bus_id": m.group("pci"),
                    "xid": int(m.group("xid")),
                    "detail": m.group("detail").strip(),
                    "line": line.strip(),
                }
            )
    return xids


def parse_dcgmi_diag(text: str) -> dict:
    """`dcgmi diag -r N` (its table): every test with its result, and which failed.

    Rows are "| Test | Result |"; a row with an empty first cell continues the one
    before (per-GPU results, wrapped warnings); "|-----  Section  ---" rows name the
    category. Results are Pass, Fail, Warn, Skip. A row named Warning, Info or Error
    belongs to the test above it: DCGM 3 prints "| Warning | GPU 0 ... |", DCGM 4
    "| Warning: GPU1 | ... |" (one per GPU); either way its text is the test's detail,
    and a warning makes a passing test "warn".
    """
    tests: list[dict] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("|-----") or line.startswith("+-----"):
            name = line.strip("|+- ").split("-")[0].strip()
            if name:
                section = name
            continue
        if not line.startswith("|") or line.startswith("+"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 2:
            continue
        name, result = cells[0], " ".join(cells[1:]).strip()
        if name == "Diagnostic" and result == "Result":
            continue
        if section == "Metadata":
            continue
        if name and not _DCGM_NOTE.match(name):
            tests.append({"category": section, "test": name, "result": result, "details": []})
        elif tests:
            tests[-1]["details"].append(result if not name else f"{name}: {result}")
    for t in tests:
        words = " ".join([t["result"], *t["details"]])
        t["status"] = (
            "fail" if re.search(r"\bFail", words) else "warn" if re.search(r"\bWarn", words)
            else "skip" if t["result"].startswith("Skip") else "pass"
        )
    return {
        "tests": tests,
        "failed": [t for t in tests if t["status"] == "fail"],
        "warned": [t for t in tests if t["status"] == "warn"],
    }


def _gpu_label(gpu: dict) -> str:
    return "GPU {} ({}, PCI {})".format(gpu.get("index"), gpu.get("name"), gpu.get("pci_bus_id"))


def health_problems(host: str, expected_gpus: int, smi: dict | None, smi_error: str | None,
                    xids: list[dict], xid_ignore: list[int], dcgm: dict | None, dcgm_error: str | None,
                    require_persistence: bool) -> list[str]:
    """What is wrong with a GPU node, each line naming the host, what was found and what to do."""
    problems = []
    if smi_error:
        problems.append(f"{host}: nvidia-smi -q failed: {smi_error}. Needs: a working driver "
                        "(a reboot after a driver change, or a GPU that fell off the bus).")
    if smi is not None:
        attached = smi["attached_gpus"]
        if attached != expected_gpus:
            problems.append(f"{host}: nvidia-smi sees {attached} GPU(s), preflight found {expected_gpus} on the PCI "
                            "bus or in nvidia-smi. Needs: every GPU visible (check the kernel log for Xid 79, "
                            "'fallen off the bus').")
        for gpu in smi["gpus"]:
            label = _gpu_label(gpu)
            if gpu["ecc_uncorrectable_volatile"]:
                problems.append(
                    f"{host}: {label} has {gpu['ecc_uncorrectable_volatile']} uncorrectable ECC error(s) since the "
                    f"driver loaded ({gpu['ecc_uncorrectable_aggregate']} in its lifetime). Needs: a GPU reset or "
                    "reboot, then `nvidia-smi -q -d ECC,ROW_REMAPPER`; errors that come back mean a failing GPU.")
            if gpu["rows_remap_pending"] or gpu["pages_retirement_pending"]:
                problems.append(f"{host}: {label} has a row remap or page retirement pending. Needs: a GPU reset "
                                "or reboot to apply it.")
            if gpu.get("ecc_unrepairable_memory"):
                problems.append(f"{host}: {label} reports Unrepairable Memory: errors in its memory that neither "
                                "row remapping nor a repair can fix. Needs: the GPU replaced.")
            repairs = [k for k, f in (("Channel", "ecc_channel_repair_pending"), ("TPC", "ecc_tpc_repair_pending"))
                       if gpu.get(f)]
            if repairs:
                problems.append(f"{host}: {label} has a {' and a '.join(repairs)} repair pending. Needs: a GPU reset "
                                "or reboot to apply it, then `nvidia-smi -q -d ECC` again.")
            if gpu.get("ecc_sram_threshold_exceeded"):
                problems.append(f"{host}: {label} has SRAM uncorrectable errors over NVIDIA's threshold (SRAM "
                                "Threshold Exceeded: Yes). Needs: NVIDIA's field diagnostic, most likely the GPU "
                                "replaced.")
            if gpu["rows_remap_failed"]:
                problems.append(f"{host}: {label} reports a row remapping failure: its memory has no spare rows "
                                "left. Needs: the GPU replaced.")
            if require_persistence and gpu["persistence_mode"] == "Disabled":
                problems.append(f"{host}: {label} has persistence mode off: the driver state is torn down "
                                "between jobs. Needs: nvidia-persistenced running (systemctl enable --now "
                                "nvidia-persistenced).")
            state, status = gpu["fabric_state"], gpu["fabric_status"]
            if (state is not None and state not in FABRIC_OK_STATES) or (
                status is not None and status not in FABRIC_OK_STATUSES
            ):
                problems.append(f"{host}: {label} fabric state {state!r}, status {status!r}: its NVSwitch fabric "
                                "is not ready and CUDA fails to start (error 802). Needs: nvidia-fabricmanager "
                                "running at the driver's version (journalctl -u nvidia-fabricmanager).")
    seen: dict[tuple[str, int], list[dict]] = {}
    for x in xids:
        if x["xid"] not in xid_ignore:
            seen.setdefault((x["pci_bus_id"], x["xid"]), []).append(x)
    for (pci, xid), found in sorted(seen.items()):
        problems.append(f"{host}: Xid {xid} on PCI {pci} ({len(found)} time(s) since boot), first: "
                        f"{found[0]['detail'][:200]}. Needs: NVIDIA's Xid catalogue for what it means; "
                        "most hardware Xids need a GPU reset or a reboot.")
    if dcgm_error:
        problems.append(f"{host}: dcgmi diag could not run: {dcgm_error}. Needs: the nvidia-dcgm service "
                        "running (systemctl enable --now nvidia-dcgm).")
    if dcgm is not None:
        for t in dcgm["failed"]:
            detail = " ".join(t["details"])[:300]
            problems.append(f"{host}: dcgmi diag test {t['test']!r} failed{': ' + detail if detail else ''}.")
        # A warning names something to fix on one GPU (persistence off, a pending row remap).
        for t in dcgm["warned"]:
            notes = " ".join(t["details"])[:300]
            problems.append(f"{host}: dcgmi diag test {t['test']!r} warned{': ' + notes if notes else ''}. Needs: "
                            "what the warning asks for, then dcgmi diag again.")
    return problems
