"""make setup's first check: the controller's python3 against the ansible-core
that requirements.txt pins (playbooks/files/controller_python.py)."""

import subprocess
import sys

import pytest
from rolepy import ROOT, load

cp = load("playbooks/files/controller_python.py", "controller_python")
REQUIREMENTS = (ROOT / "requirements.txt").read_text()


def test_the_pin_is_read_from_requirements():
    core, pin = cp.pinned_core(REQUIREMENTS)
    assert pin.startswith("ansible-core==") and core in cp.CONTROLLER_PYTHON


def test_ubuntu_2204s_python_is_refused_naming_what_was_found_and_what_is_needed():
    msg = cp.problem("ansible-core==2.19.14\n", (3, 10, 12, "final", 0), "/usr/bin/python3")
    assert msg.startswith("torchrig's controller runs ansible-core==2.19.14 (requirements.txt), which needs "
                          "Python 3.11 to 3.13; this machine's python3 is Python 3.10.12 (/usr/bin/python3).")
    assert "Needs: a Python 3.11-3.13 as python3" in msg


@pytest.mark.parametrize("version", [(3, 11, 2), (3, 12, 3), (3, 13, 0)])
def test_supported_pythons_pass(version):
    assert cp.problem("ansible-core==2.19.14\n", version, "python3") is None


def test_a_python_too_new_is_refused():
    assert "needs Python 3.11 to 3.13" in cp.problem("ansible-core==2.19.14\n", (3, 14, 0), "python3")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("ansible==12.3.0\n", "pins no ansible-core (expected a line like ansible-core==2.19.14)"),
        ("ansible-core==2.99.1\n", "ansible-core==2.99.1 is not in controller_python.py's table"),
    ],
)
def test_bad_requirements_are_named(text, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        cp.problem(text, (3, 11, 0), "python3")


def test_the_script_passes_on_this_controller_and_fails_clearly_on_a_bad_pin(tmp_path):
    script = ROOT / "playbooks/files/controller_python.py"
    requirements = str(ROOT / "requirements.txt")
    ok = subprocess.run([sys.executable, str(script), requirements], check=False, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "requirements.txt"
    bad.write_text("ansible-core==2.17.1\n" if sys.version_info[:2] > (3, 12) else "ansible-core==2.20.1\n")
    r = subprocess.run([sys.executable, str(script), str(bad)], check=False, capture_output=True, text=True)
    assert r.returncode == 1 and "this machine's python3 is Python" in r.stderr


def test_make_setup_checks_before_making_the_venv():
    makefile = (ROOT / "Makefile").read_text()
    check = makefile.index("python3 playbooks/files/controller_python.py requirements.txt")
    assert check < makefile.index("python3 -m venv $(VENV_CACHE)")
