"""Every `ansible-playbook` example in README.md and JOBS.md (and in train.yml's header)
goes through what train.yml would check, so the examples cannot go stale.

Each command is split as a shell splits it. A `train.yml` example's `-e` values become the
request as Ansible hands them over: key=value pairs as strings (a value ends at a space,
the rest kept as `_raw_params`), YAML/JSON as parsed. The request goes to train.yml's own
check, `request()` of the torchrun_request role's filter plugin, on the local cluster's
hosts node1..node4 (`make up NODES=4`). An example whose comment says "refused" must be
refused; every other must be accepted. A script the example names is created first, in
an empty directory, as the user would have it. Every other playbook named must exist,
and a `job=` it is given must be a valid job name.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from rolepy import ROOT, load

req = load("roles/torchrun_request/filter_plugins/torchrun_request.py", "torchrun_request_examples")
DOCS = ("README.md", "JOBS.md")
HOSTS = ["node1", "node2", "node3", "node4"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def examples() -> list[tuple[str, str]]:
    """(doc, command line) of every ansible-playbook command, in fences or inline code."""
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        lines = [ln for block in FENCE.findall(text) for ln in block.splitlines()]
        lines += re.findall(r"`(ansible-playbook [^`]+)`", FENCE.sub("", text))
        found += [(doc, ln.strip()) for ln in lines if ln.strip().startswith("ansible-playbook ")]
    header = re.findall(r"^#\s+(ansible-playbook .*)$", (ROOT / "train.yml").read_text(), re.M)
    return found + [("train.yml", line.strip()) for line in header]


def kv(text: str) -> dict[str, Any]:
    """Ansible's -e key=value: quote-aware words; a word without '=' goes to _raw_params."""
    values: dict[str, Any] = {}
    raw = []
    for word in shlex.split(text):
        key, eq, value = word.partition("=")
        if eq and re.fullmatch(r"\w+", key):
            values[key] = value
        else:
            raw.append(word)
    if raw:
        values["_raw_params"] = " ".join(raw)
    return values


def parse(line: str) -> tuple[str, dict[str, Any], str]:
    """The playbook, the -e values merged as Ansible merges them, and the comment."""
    command, _, comment = line.partition(" #")
    words = shlex.split(command)
    playbook, values = "", {}
    i = 1
    while i < len(words):
        word = words[i]
        if word in ("-e", "--extra-vars"):
            arg = words[i + 1]
            values.update(yaml.safe_load(arg) if arg.lstrip()[:1] in "{[" else kv(arg))
            i += 2
        elif word in ("-i", "--inventory", "--tags", "-t", "--limit", "-l"):
            i += 2
        elif word.endswith(".yml") and not playbook:
            playbook = word
            i += 1
        else:
            i += 1
    return playbook, values, comment


def check_train_request(values: dict[str, Any], datasets: dict[str, str] | None = None) -> dict[str, Any]:
    """train.yml's check: request() with the values given, every name typed with -e, the
    inventory's torchrig_datasets."""
    return req.request(values, HOSTS, "cluster", typed=list(values), datasets=datasets)


EXAMPLES = examples()


def test_the_docs_have_train_examples_and_a_refusal() -> None:
    train = [line for _, line in EXAMPLES if parse(line)[0] == "train.yml"]
    assert len(train) >= 6, EXAMPLES
    assert any("refused" in parse(line)[2] for line in train)


@pytest.mark.parametrize("doc, line", EXAMPLES, ids=[f"{d}:{i}" for i, (d, _) in enumerate(EXAMPLES)])
def test_example(doc: str, line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    playbook, values, comment = parse(line)
    assert (ROOT / playbook).is_file(), f"{doc}: {line}: no playbook {playbook}"
    if playbook != "train.yml":
        if "job" in values:
            assert req.job_name_problem(values["job"]) == "", f"{doc}: {line}"
        return
    monkeypatch.chdir(tmp_path)  # the user's own files, where the example says they are
    script = str(values.get("script", ""))
    if script.endswith("/"):
        entry = tmp_path / script / str(values.get("entry", "train.py"))
        entry.parent.mkdir(parents=True)
        entry.write_text("print('a job')\n")
    elif script:
        (tmp_path / script).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / script).write_text("print('a job')\n")
    # -e data=: a directory the example names, or a name the inventory would give.
    data, datasets = str(values.get("data", "")), {}
    if "/" in data:
        (tmp_path / data).mkdir(parents=True)
    elif data:
        datasets = {data: str(tmp_path)}
    if "refused" in comment:
        with pytest.raises(req.RequestError):
            check_train_request(values, datasets)
    else:
        try:
            check_train_request(values, datasets)
        except req.RequestError as e:
            pytest.fail(f"{doc}: {line}\nrefused: {e}")


def test_the_check_catches_a_stale_example() -> None:
    """What the test would say of an example gone stale: a dataset, node count or -e name
    that is not there, a value Ansible split."""
    for line in ("ansible-playbook train.yml -e nodes=2 -e dataset=imagenet",
                 "ansible-playbook train.yml -e nodes=2 -e epoch=3",
                 "ansible-playbook train.yml -e nodes=5",
                 "ansible-playbook train.yml -e nodes=2 -e 'extra_args=10 2'"):
        with pytest.raises(req.RequestError):
            check_train_request(parse(line)[1])
