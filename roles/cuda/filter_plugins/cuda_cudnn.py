"""The cuDNN packages the cuda role installs, pinned and held together, for a
meta package and version of the matrix (cuda_cudnn_packages' default).

From cuDNN 9.10 NVIDIA's repositories ship the C headers in their own package,
libcudnn9-headers-cuda-N, and libcudnn9-dev-cuda-N Depends on it at exactly its
own version (the repositories' Packages indexes,
https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/Packages;
NVIDIA's cuDNN Linux installation guide installs the three together,
https://docs.nvidia.com/deeplearning/cudnn/installation/latest/linux.html).
Pinned meta, lib and dev without it fail as soon as the repository holds a
newer headers package: apt takes that one, which the dev package refuses.
The stand-in repository (tests/fixtures/nvidia_repo/build.py) follows the same rule.
"""

from __future__ import annotations

import re

HEADERS_FROM = (9, 10)
_META = re.compile(r"cudnn(?P<major>\d+)-cuda-(?P<cuda>\d+)")


def cudnn_packages(meta, version):
    """'cudnn9-cuda-13', '9.13.0.50-1' -> the meta, lib, dev (and, from 9.10, headers) packages."""
    meta, version = str(meta), str(version)
    # A CPU host has no stack row: the role's argument spec still evaluates this default there.
    if not meta and not version:
        return []
    if not _META.fullmatch(meta):
        raise ValueError(
            f"cuda_cudnn_package {meta!r} is not a cuDNN meta package name; expected one like cudnn9-cuda-13"
        )
    m = re.fullmatch(r"(\d+)\.(\d+)[\w.+~-]*", version)
    if not m:
        raise ValueError(f"cuda_cudnn_version {version!r} is not a package version; expected one like 9.13.0.50-1")
    packages = [meta, "lib" + meta, "lib" + meta.replace("-cuda-", "-dev-cuda-")]
    if (int(m.group(1)), int(m.group(2))) >= HEADERS_FROM:
        packages.append("lib" + meta.replace("-cuda-", "-headers-cuda-"))
    return packages


class FilterModule:
    def filters(self):
        return {"cuda_cudnn_packages": cudnn_packages}
