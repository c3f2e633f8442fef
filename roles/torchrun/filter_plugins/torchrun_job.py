"""A job's arguments, the results to fetch, and the failure report: plain functions
(unit-tested in tests/test_torchrun_job.py), exposed to the torchrun role and train.yml
as filters."""

from __future__ import annotations

import json
import re
import shlex


class JobError(ValueError):
    """A job setting that cannot be used. Not Ansible's own error class: importing Ansible
    in the test process patches sys.intern, which torch's compiler then refuses."""

MIB = 1024 * 1024

# ------------------------------------------------------------- the arguments


def args_problem(value) -> str:
    """'' when `value` is usable as extra_args, else what is wrong with it."""
    try:
        job_args(value)
    except ValueError as e:
        return str(e)
    return ""


def job_args(value) -> list[str]:
    """extra_args as the entry point's argument list.

    A list (YAML or JSON) is taken item by item; a string is split the way a shell
    would, so that quoted words stay whole: '7 "two words"' gives ['7', 'two words'].
    Ansible's own split of `-e extra_args=10 2` (it keeps only '10') cannot be undone
    here; train.yml refuses the leftover words.
    """
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:  # "No closing quotation"
            raise ValueError(f"extra_args {value!r} cannot be split into words: {e}") from None
    if isinstance(value, (list, tuple)):
        out = []
        for i, item in enumerate(value, 1):
            # bool first: it is an int to Python, and `yes` would quietly become 'True'.
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise ValueError(f"extra_args item {i} is {json.dumps(item)}, not a string or a "
                                 "number; quote it")
            out.append(str(item))
        return out
    raise ValueError(f"extra_args must be a list of strings or one string, got {json.dumps(value)}")


def _job_args_filter(value) -> list[str]:
    try:
        return job_args(value)
    except ValueError as e:
        raise JobError(str(e)) from None


def env_value(value) -> str:
    """`value` for a systemd EnvironmentFile, double-quoted.

    Inside double quotes systemd (like a POSIX shell) takes every character as it is
    except \\, ", ` and $, which are escaped here; a newline is refused, since it would end
    the assignment for other readers of the file.
    """
    text = str(value)
    if "\n" in text or "\r" in text:
        raise JobError(f"a job environment value cannot hold a line break: {text!r}")
    return '"' + re.sub(r'([\\"`$])', r"\\\1", text) + '"'


# ----------------------------------------------------------------- the results


# A name a node gives may hold neither a control character (it would end a line of
# rsync's list of files) nor a backslash.
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def name_problem(rel) -> str:
    """'' when `rel`, a path a node listed under its run directory, stays under the
    job's results directory on the controller; else why it does not.

    The node is not trusted: an absolute name, an empty, '.' or '..' part would put a file
    elsewhere on the controller, or over another node's files."""
    if not isinstance(rel, str) or not rel:
        return "it is empty or not a string"
    if rel.startswith("/"):
        return "it is absolute"
    if _BAD_CHARS.search(rel):
        return "it holds a control character or a backslash"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "it has an empty, '.' or '..' part"
    return ""


def _size(n: float) -> str:
    return f"{n / MIB:,.1f} MiB" if n < 1024 * MIB else f"{n / MIB / 1024:,.2f} GiB"


def fetch_plan(listings: dict, limit_mb: float, limit_files: int, job: str = "", output_dir: str = "") -> dict:
    """What to fetch from every node, from each node's torchrun_outputs listing.

    `listings` maps each node to its listing (`names` in one NUL-separated string, `bytes`
    and the `largest` few as [path, size]). Every name is checked (name_problem);
    `refused` names the first bad ones, and nothing is fetched while there is one. The
    limits are on the total across all nodes: `over` is the message when the files weigh
    more than limit_mb MB or number more than limit_files, '' when they fit.

    Returned per node: its figures, `top` (its names at the top of the run directory:
    rank 0's results) and `has_output` (whether any name is under output_dir); and
    `lists`: each node with names to them, a line each (rsync's --files-from; a checked
    name holds no newline). The names stay in strings, never a long list: see
    module_utils/torchrun_outputs.py.
    """
    nodes, lists, refused, largest = {}, {}, [], []
    total = count = 0
    prefix = output_dir.rstrip("/") + "/" if output_dir else None
    for node in sorted(listings):
        listing = listings[node] or {}
        raw = listing.get("names") or ""
        checked = [(rel, name_problem(rel)) for rel in (raw.split("\0") if isinstance(raw, str) and raw else [])]
        refused += [f"{node}: {json.dumps(rel)} ({problem})" for rel, problem in checked if problem][:10 - len(refused)]
        names = [rel for rel, problem in checked if not problem]
        size = int(listing.get("bytes") or 0)
        total += size
        count += len(names)
        largest += [(node, item[0], int(item[1])) for item in listing.get("largest") or []
                    if isinstance(item, (list, tuple)) and len(item) == 2 and not name_problem(item[0])]
        nodes[node] = {"count": len(names), "bytes": size, "top": [rel for rel in names if "/" not in rel],
                       "has_output": bool(prefix) and any(rel.startswith(prefix) for rel in names),
                       "links": int(listing.get("links_count") or 0), "link_names": listing.get("links") or []}
        if names:
            lists[node] = "\n".join(names)
    named = [f"{node}:{rel} ({_size(size)})" for node, rel, size in sorted(largest, key=lambda f: -f[2])[:5]]
    problems = []
    if total > float(limit_mb) * MIB:
        problems.append(f"{_size(total)}, more than torchrun_fetch_limit_mb ({float(limit_mb):,.0f} MB)")
    if count > int(limit_files):
        problems.append(f"{count:,} files, more than torchrun_fetch_limit_files ({int(limit_files):,})")
    over = ""
    if problems:
        over = (f"Job {job} left " + " and ".join(problems) + f" across its {len(nodes)} nodes, so nothing was "
                f"fetched; it is all still on the nodes. Largest: {', '.join(named)}. Fetch it with a higher "
                "limit (playbooks/fetch.yml -e job=" + job + " -e torchrun_fetch_limit_mb=N "
                "-e torchrun_fetch_limit_files=N), or copy what you need from the nodes.")
    return {"nodes": nodes, "lists": lists, "bytes": total, "files": count, "refused": refused,
            "over": over, "largest": named}


def newest_rank0(nodes: list[str], times: list) -> str:
    """The node whose rank 0 note (the contract's files.rank0) is newest (`times`: each node's mtime, '' for none);
    '' when no node has one.

    Rank 0 can move to another node when torchrun restarts the workers; the note of the
    last attempt is the newest."""
    found = {node: float(t) for node, t in zip(nodes, times, strict=True) if t is not None and t != ""}
    return max(found, key=lambda n: (found[n], n)) if found else ""


# ------------------------------------------------------------ the failure report

_TRACEBACK = "Traceback (most recent call last):"


def first_traceback(lines: list[str], keep: int = 12) -> list[str]:
    """The tail of the first Python traceback in `lines`: its innermost frames and the error.

    The first, because a failing worker prints its error first; what follows is its
    peers' and torchrun's consequences. Lines of the same traceback carry the same prefix
    (a worker's lines can start with `[rank0]: `), so other ranks' interleaved lines are
    left out. A chained exception ("During handling of the above exception ...") is
    followed to its last error, the one that ended the process.
    """
    chained = ("During handling of the above exception", "The above exception was the direct")
    for i, line in enumerate(lines):
        at = line.find(_TRACEBACK)
        if at < 0:
            continue
        prefix = line[:at]
        bodies = [nxt[len(prefix):] for nxt in lines[i + 1:] if nxt.startswith(prefix)]
        block = [line]
        for j, body in enumerate(bodies):
            block.append(prefix + body)
            # Frames are indented; the first line that is not is the error, and ends the
            # traceback unless a chained one follows.
            if body.strip() and not body[0].isspace() and not body.startswith(_TRACEBACK) \
                    and not body.startswith(chained):
                following = [b for b in bodies[j + 1:] if b.strip()][:1]
                if not (following and following[0].startswith(chained)):
                    break
        block = [b for b in block if b[len(prefix):].strip()]
        if len(block) > keep:
            block = [block[0], prefix + "  ..."] + block[-(keep - 1):]
        return block
    return []


def failure_lines(journal: list[str], tail: int = 15) -> list[str]:
    """The failing node's report: its first traceback's tail, then its journal's last lines.

    `journal` is `journalctl --output=short-iso-precise`; each line is cut to its message
    (time, host and process go), and systemd's own lines are left out.
    """
    messages = [re.sub(r"^\S+ \S+ [^:]+: ", "", line).rstrip() for line in journal
                if " systemd[1]: " not in line]
    messages = [m for m in messages if m.strip()]
    shown = []
    traceback = first_traceback(messages)
    if traceback:
        shown += ["First error in its journal:"] + traceback
    return shown + ["Last lines of its journal:"] + messages[-tail:]


class FilterModule:
    def filters(self):
        return {
            "torchrun_args": _job_args_filter,
            "torchrun_args_problem": args_problem,
            "torchrun_env_value": env_value,
            "torchrun_fetch_plan": fetch_plan,
            "torchrun_fetch_name_problem": name_problem,
            "torchrun_newest_rank0": newest_rank0,
            "torchrun_failure_lines": failure_lines,
        }
