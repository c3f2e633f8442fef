"""Renders the compatibility matrix as the Markdown table in roles/preflight/README.md.

  python tests/matrix_table.py           # print the table
  python tests/matrix_table.py --write   # replace the block between the markers in roles/preflight/README.md

tests/test_matrix_table.py fails when roles/preflight/README.md's block differs from this output.
"""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "roles" / "preflight" / "files" / "compat_matrix.yml"
README = ROOT / "roles/preflight/README.md"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"

HEADER = (
    "| torch | torchvision | variant | CUDA | toolkit package | cuDNN package | min driver (branch) "
    "| compute capabilities | OS | Python |"
)


def render(rows, torch_python=None):
    lines = [HEADER, "|" + "---|" * 10]
    for r in rows:
        gpu = r["variant"] != "cpu"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["torch"],
                    r["torchvision"],
                    r["variant"],
                    r.get("cuda", "-"),
                    f"{r['cuda_toolkit_package']} {r['cuda_toolkit_version']}" if gpu else "-",
                    f"{r['cudnn_package']} {r['cudnn_version']}" if gpu else "-",
                    f"{r['min_driver']} ({r['driver_branch']})" if gpu else "-",
                    ", ".join(r["compute_capabilities"]) or "-",
                    ", ".join(r["os"]),
                    _python_range((torch_python or {}).get(".".join(r["torch"].split(".")[:2]))),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _python_range(versions):
    return f"{versions[0]}-{versions[-1]}" if versions else "-"


def table():
    data = yaml.safe_load(MATRIX.read_text())
    return render(data["rows"], data.get("torch_python"))


def block(text):
    """The text between the markers, or None when the markers are missing."""
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0]


def write():
    text = README.read_text()
    if block(text) is None:
        raise SystemExit(f"{README}: markers {START} / {END} not found")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(head + START + "\n" + table() + END + tail)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        sys.stdout.write(table())
