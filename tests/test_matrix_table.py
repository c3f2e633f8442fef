"""roles/preflight/README.md's matrix table is the one generated from compat_matrix.yml."""

import yaml
from matrix_table import MATRIX, README, block, render, table


def test_readme_table_matches_matrix():
    current = block(README.read_text())
    assert current is not None, f"{README} lacks the <!-- matrix:start --> / <!-- matrix:end --> markers"
    stale = "roles/preflight/README.md's matrix table is stale: run python tests/matrix_table.py --write"
    assert current.strip() == table().strip(), stale


def test_table_has_a_line_per_row():
    data = yaml.safe_load(MATRIX.read_text())
    rows = data["rows"]
    lines = render(rows, data["torch_python"]).splitlines()
    assert len(lines) == len(rows) + 2
    assert "| 2.14.1 | 0.29.1 | cu132 | 13.2 | cuda-toolkit-13-2 13.2.1-1 |" in lines[2]
    assert "| 2.14.1 | 0.29.1 | cu130 | 13.0 | cuda-toolkit-13-0 13.0.2-1 |" in lines[3]
    assert lines[2].endswith("| debian12, ubuntu2204, ubuntu2404 | 3.10-3.15 |")
    assert lines[-1].endswith("| debian12, ubuntu2204, ubuntu2404 | 3.9-3.13 |")
