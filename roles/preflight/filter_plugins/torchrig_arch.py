"""Filter torchrig_architecture_problem: whether torchrig can provision a host's CPU architecture."""

from __future__ import annotations

# NVIDIA's repository path in nvidia_driver_repo_url and the wheels the pytorch role
# installs are the x86_64 ones.
SUPPORTED_ARCHITECTURES = ("x86_64",)


def architecture_problem(host: str, arch: str) -> str:
    """A message naming the host, or "" when torchrig can provision its architecture."""
    if arch in SUPPORTED_ARCHITECTURES:
        return ""
    hint = ""
    if arch in ("aarch64", "arm64"):
        hint = (
            " (Grace Hopper GH200 and Grace Blackwell hosts are aarch64: NVIDIA publishes their packages under "
            "the sbsa repository path, which torchrig does not set up)"
        )
    return (
        f"{host}: CPU architecture {arch}{hint}; torchrig installs from NVIDIA's x86_64 repository and "
        f"installs x86_64 wheels only. Needs: an x86_64 host."
    )


class FilterModule:
    def filters(self):
        return {"torchrig_architecture_problem": architecture_problem}
