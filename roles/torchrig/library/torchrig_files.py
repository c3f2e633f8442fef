#!/usr/bin/python
"""Files and directories on a node, written and removed in one module call.

A role that writes several small files (train.yml: a job's drop-in, firewall
element, environment, GPU list and run id; package_source: the apt key, source
and configuration) would otherwise make a copy, template or file task of each.
Every such task starts Python on the node and imports Ansible's module code
afresh, about 0.2 s of CPU, and a copy is two of them (a stat, then the write):
on the 2 cores the local cluster shares, a launch or a failure report waited for
all of them.
"""

from __future__ import annotations

import base64
import grp
import os
import pwd
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: torchrig_files
short_description: Write, make and remove files and directories on a node, in order
description:
  - Each entry is a file with its content, a directory, or a path to remove. A file is
    written (to a temporary file beside it, then renamed) only when its content differs;
    its owner, group and mode are set when they differ. A link at a file's path is
    replaced, never followed. A directory is made (parents as root's, 0755) when missing.
  - Check mode says what would change and changes nothing.
options:
  files:
    description: The entries, done in their order.
    type: list
    elements: dict
    required: true
    suboptions:
      path: {description: An absolute path., type: path, required: true}
      state: {description: file, directory or absent., type: str, default: file, choices: [file, directory, absent]}
      content: {description: The file's text (state file)., type: str, default: ""}
      content_base64: {description: The file's bytes in base64 (state file), instead of content., type: str}
      owner: {description: Its owner (not for absent)., type: str, default: root}
      group: {description: Its group (not for absent)., type: str, default: root}
      mode: {description: Its mode in octal, as "0640" (not for absent)., type: str, default: "0644"}
"""

RETURN = r"""
changed_paths: {description: The entries' paths that changed (or would), in order, type: list, returned: always}
diff:
  description: With --diff, a before and after for each text file that changed (or would).
  type: list
  returned: with --diff
"""


def ids(owner: str, group: str, check: bool = False) -> tuple[int, int]:
    """The uid and gid of owner and group; ValueError names the one that does not exist.

    In check mode a user or group an earlier task would have made (a job's user, in
    train.yml --check) is -1: no file has that owner, so the entry shows as a change."""
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        if not check:
            raise ValueError(f"no user {owner}") from None
        uid = -1
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        if not check:
            raise ValueError(f"no group {group}") from None
        gid = -1
    return uid, gid


def lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def set_attrs(path: str, st: os.stat_result, uid: int, gid: int, mode: int, check: bool) -> bool:
    """Give path (st: its lstat) this owner, group and mode where they differ; whether they did."""
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, mode):
        return False
    if not check:
        os.chown(path, uid, gid)
        os.chmod(path, mode)
    return True


def read_text(path: str) -> str | None:
    """A regular file's text for a diff; None where there is none (missing, a link, not text)."""
    st = lstat_or_none(path)
    if st is None or not stat.S_ISREG(st.st_mode):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (UnicodeDecodeError, OSError):
        return None


def put_file(path: str, content: bytes, uid: int, gid: int, mode: int, check: bool) -> bool:
    """Write path when its content, owner, group or mode differ; whether it did (or would)."""
    st = lstat_or_none(path)
    if st is not None and stat.S_ISREG(st.st_mode):
        with open(path, "rb") as f:
            if f.read() == content:
                return set_attrs(path, st, uid, gid, mode, check)
    if check:
        return True
    if st is not None and stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        # rename replaces a link at path; it does not write through it.
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return True


def make_dir(path: str, uid: int, gid: int, mode: int, check: bool) -> bool:
    """Make directory path (its parents root's, 0755) or set its attributes; whether it changed."""
    st = lstat_or_none(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return set_attrs(path, st, uid, gid, mode, check)
    if check:
        return True
    if st is not None:
        os.unlink(path)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.mkdir(path, mode)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return True


def remove(path: str, check: bool) -> bool:
    """Remove path: a file, a link (not what it points to) or a directory tree."""
    st = lstat_or_none(path)
    if st is None:
        return False
    if not check:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={"files": {"type": "list", "elements": "dict", "required": True, "options": {
            "path": {"type": "path", "required": True},
            "state": {"type": "str", "default": "file", "choices": ["file", "directory", "absent"]},
            "content": {"type": "str", "default": ""},
            "content_base64": {"type": "str"},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
        }}},
        supports_check_mode=True,
    )
    check = module.check_mode
    changed_paths = []
    diffs = []
    for entry in module.params["files"]:
        path = entry["path"]
        if not os.path.isabs(path):
            module.fail_json(msg=f"{path}: the path must be absolute", changed_paths=changed_paths)
        try:
            if entry["state"] == "absent":
                changed = remove(path, check)
            else:
                uid, gid = ids(entry["owner"], entry["group"], check)
                mode = int(entry["mode"], 8)
                if entry["state"] == "directory":
                    changed = make_dir(path, uid, gid, mode, check)
                else:
                    content = (base64.b64decode(entry["content_base64"], validate=True)
                               if entry["content_base64"] is not None else entry["content"].encode())
                    before = read_text(path) if module._diff else None
                    changed = put_file(path, content, uid, gid, mode, check)
                    if changed and module._diff and entry["content_base64"] is None and before != entry["content"]:
                        diffs.append({"before_header": path, "after_header": path,
                                      "before": before or "", "after": entry["content"]})
        except (ValueError, OSError) as e:  # binascii.Error is a ValueError
            module.fail_json(msg=f"{path}: {e}", changed_paths=changed_paths)
        if changed:
            changed_paths.append(path)
    if module._diff:
        module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths, diff=diffs)
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
