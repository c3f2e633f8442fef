"""cuDNN's packages as the cuda role installs them, against the stand-in NVIDIA
repository, which follows NVIDIA's packaging: from cuDNN 9.10 the dev package
Depends on libcudnn9-headers-cuda-N at exactly its version."""

import pytest
import yaml
from rolepy import MATRIX_TEXT, ROOT, load
from test_standin_repo import apt, built  # noqa: F401  (built: the stand-in, a fixture)

cudnn = load("roles/cuda/filter_plugins/cuda_cudnn.py", "cuda_cudnn")
ROWS = {(r["torch"], r["variant"]): r for r in yaml.safe_load(MATRIX_TEXT)["rows"]}
DEFAULTS = yaml.safe_load((ROOT / "roles/cuda/defaults/main.yml").read_text())


def test_the_role_default_uses_the_filter():
    assert DEFAULTS["cuda_cudnn_packages"] == "{{ cuda_cudnn_package | cuda_cudnn_packages(cuda_cudnn_version) }}"


@pytest.mark.parametrize(
    "meta,version,expected",
    [
        ("cudnn9-cuda-13", "9.13.0.50-1",
         ["cudnn9-cuda-13", "libcudnn9-cuda-13", "libcudnn9-dev-cuda-13", "libcudnn9-headers-cuda-13"]),
        ("cudnn9-cuda-12", "9.10.1.4-1",
         ["cudnn9-cuda-12", "libcudnn9-cuda-12", "libcudnn9-dev-cuda-12", "libcudnn9-headers-cuda-12"]),
        ("cudnn9-cuda-12", "9.8.0.87-1", ["cudnn9-cuda-12", "libcudnn9-cuda-12", "libcudnn9-dev-cuda-12"]),
    ],
)
def test_headers_package_from_cudnn_9_10(meta, version, expected):
    assert cudnn.cudnn_packages(meta, version) == expected


def test_a_host_without_a_stack_row_has_no_cudnn_packages():
    """A CPU host: the role's argument spec evaluates the default there too, and must not fail."""
    assert cudnn.cudnn_packages("", "") == []


@pytest.mark.parametrize(
    "meta,version,needle",
    [
        ("libcudnn9-cuda-13", "9.13.0.50-1", "'libcudnn9-cuda-13' is not a cuDNN meta package name; expected one like"),
        ("cudnn9-cuda-13", "latest", "cuda_cudnn_version 'latest' is not a package version; expected one like"),
        ("cudnn9-cuda-13\n", "9.13.0.50-1", "is not a cuDNN meta package name"),
        ("cudnn9-cuda-13", "9.13.0.50-1\n", "is not a package version"),
        ("", "9.13.0.50-1", "'' is not a cuDNN meta package name"),
    ],
)
def test_bad_input_is_named(meta, version, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        cudnn.cudnn_packages(meta, version)


def stanza(built, name, version):  # noqa: F811
    for s in (built / "repo" / "Packages").read_text().split("\n\n"):
        if f"Package: {name}\n" in s and f"Version: {version}\n" in s:
            return s
    return None


def test_standin_dev_package_wants_its_headers_at_exactly_its_version(built):  # noqa: F811
    cu130 = ROWS[("2.14.1", "cu130")]
    v = cu130["cudnn_version"]
    dev = stanza(built, "libcudnn9-dev-cuda-13", v)
    assert dev and f"libcudnn9-headers-cuda-13 (= {v})" in dev
    assert stanza(built, "libcudnn9-headers-cuda-13", v)
    # Before 9.10 there is no headers package (the cu126 row's 9.5.1).
    old = ROWS[("2.14.1", "cu126")]["cudnn_version"]
    assert "headers" not in stanza(built, "libcudnn9-dev-cuda-12", old)


def pinned(packages, version):
    return [f"{p}={version}" for p in packages]


def test_the_cu130_rows_cudnn_installs_while_a_newer_one_is_in_the_repository(built, tmp_path):  # noqa: F811
    # The stand-in also has the cu132 row's newer cuDNN 9.20 for CUDA 13, as
    # NVIDIA's repository always has newer ones: the cu130 row's 9.13 pinned.
    row = ROWS[("2.14.1", "cu130")]
    meta, v = row["cudnn_package"], row["cudnn_version"]
    assert stanza(built, "libcudnn9-headers-cuda-13", ROWS[("2.14.1", "cu132")]["cudnn_version"])
    r = apt(built, tmp_path, "repo", [], "install", *pinned(cudnn.cudnn_packages(meta, v), v))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Inst libcudnn9-headers-cuda-13 ({v}" in r.stdout
    # What the role asked for before (meta, lib and dev only) cannot be installed.
    old_list = [meta, "lib" + meta, "lib" + meta.replace("-cuda-", "-dev-cuda-")]
    r = apt(built, tmp_path / "old", "repo", [], "install", *pinned(old_list, v))
    assert r.returncode != 0
    assert f"Depends: libcudnn9-headers-cuda-13 (= {v})" in r.stdout + r.stderr
