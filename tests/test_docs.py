"""The project's Markdown points at what is there: every relative link resolves (to a
file in the repository, and to a heading of it when it names one), and every backticked
path that looks like one of the repository's files names one that exists.

A backticked span counts as a repository path when it has no spaces and either holds a
'/' and starts with a top-level entry of the repository (or of the Markdown file's own
directory: a role's README says `tasks/main.yml`), or ends in .md, .yml, .py or .j2 (a
bare file name, found anywhere in the repository). `file.py::test_name` must name a test
that the file defines. Placeholders (`runs/<job>/`), absolute paths (a node's `/etc/hosts`)
and paths git ignores (`inventory/local/hosts.yml`, which `make up` writes) are not
repository files and are skipped.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATHLIKE = re.compile(r"[\w.:/-]+")
FILE_NAME = re.compile(r"[\w.-]+\.(md|yml|py|j2)")


def git(*args: str) -> list[str]:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.splitlines()


TRACKED = [p for p in git("ls-files") if (REPO / p).exists()]
MARKDOWN = sorted(p for p in TRACKED if p.endswith(".md"))
NAMES = {Path(p).name for p in TRACKED}


def prose(path: Path) -> str:
    """The Markdown without its fenced blocks (commands and output, not references)."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", prose(path), re.M)}


def ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False).returncode == 0


def repo_path_problems(source: Path, root: Path = REPO) -> list[str]:
    here, md = source.parent, source.relative_to(root)
    top = {p.name for p in root.iterdir()}
    problems = []
    for found_span in SPAN.findall(prose(source)):
        span = found_span.rstrip(",.:")
        if not PATHLIKE.fullmatch(span) or span.startswith(("/", "-", "~")):
            continue
        path, _, test = span.partition("::")
        if "/" in path:
            first = path.split("/")[0]
            if first in (".", "..") or not (first in top or (here / first).exists()) or ignored(path):
                continue
        elif not FILE_NAME.fullmatch(path) or path in NAMES:
            continue
        found = next((p for p in (root / path, here / path) if p.exists()), None)
        if found is None:
            problems.append(f"{md}: `{span}` does not exist")
        elif test and not re.search(rf"^\s*def {re.escape(test.split('::')[-1])}\(",
                                    found.read_text(), re.M):
            problems.append(f"{md}: `{span}`: {path} defines no such test")
    return problems


def link_problems(source: Path, root: Path = REPO) -> list[str]:
    md = source.relative_to(root)
    problems = []
    for target in LINK.findall(prose(source)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (source.parent / path).resolve() if path else source
        if not resolved.is_relative_to(root):
            problems.append(f"{md}: ({target}) leads out of the repository")
        elif not resolved.exists():
            problems.append(f"{md}: ({target}) does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{md}: ({target}) names no heading of {path or md}")
    return problems


@pytest.mark.parametrize("md", MARKDOWN)
def test_links_and_file_names_resolve(md: str) -> None:
    problems = link_problems(REPO / md) + repo_path_problems(REPO / md)
    assert not problems, "\n".join(problems)


def test_the_checks_find_what_is_missing(tmp_path: Path) -> None:
    """Both checks on a stale page: a missing file, a test that is not there, a link to a
    missing file and one to a missing heading, one out of the repository."""
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / "roles" / "torchrig").mkdir(parents=True)
    (root / "README.md").write_text("# Quick start\n")
    (root / "tests" / "test_docs.py").write_text("def test_something():\n    pass\n")
    page = root / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("`roles/torchrig/tasks/gone.yml`, `tests/test_docs.py::test_nothing`,\n"
                    "`tests/test_docs.py::test_something`, `gone.py`, `runs/<job>/`, `/etc/hosts`\n"
                    "[a](../NOPE.md) [b](../README.md#no-such-heading) [c](../../x.md)\n"
                    "[d](../README.md#quick-start)\n")
    found = link_problems(page, root) + repo_path_problems(page, root)
    assert [p.split(": ", 1)[1] for p in found] == [
        "(../NOPE.md) does not exist",
        "(../README.md#no-such-heading) names no heading of ../README.md",
        "(../../x.md) leads out of the repository",
        "`roles/torchrig/tasks/gone.yml` does not exist",
        "`tests/test_docs.py::test_nothing`: tests/test_docs.py defines no such test",
        "`gone.py` does not exist",
    ], found


def test_no_tracked_file_cites_a_file_outside_the_repository() -> None:
    """Design notes and benchmarks kept beside the checkout are not in the repository.

    The names looked for are those of the Markdown files in the shared folder beside the
    checkout, read from it, so that no file of the project names them, this one included.
    """
    beside = REPO.parent / "shared"
    names = sorted(p.name for p in beside.glob("*.md")) if beside.is_dir() else []
    patterns = [arg for name in [*names, "../../shared/", "/work/"] for arg in ("-e", name)]
    hits = subprocess.run(["git", "grep", "-n", "-I", "-F", *patterns, "--", ".", ":!tests/test_docs.py"],
                          cwd=REPO, capture_output=True, text=True, check=False).stdout
    assert not hits, hits
