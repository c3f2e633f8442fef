"""The digest of a job's data on the controller (train.yml's -e data=PATH), with its file
count and bytes. Hashing gigabytes takes a while, so each file's hash is cached by its
size and mtime (the collection's module_utils/torchrun_data.py, cached_manifest): a second staging of the
same data reads no file again."""

from __future__ import annotations

DOCUMENTATION = r"""
name: torchrun_data_manifest
short_description: The content digest of a directory or file on the controller
description:
  - Returns one dict per term, {digest, files, bytes}; the digest is the sha256 of the
    manifest (each file's relative name, size and sha256; each directory's name).
options:
  _terms: {description: Paths on the controller., required: true}
  cache_dir: {description: Where the per-path caches of file hashes are kept., type: str, required: true}
"""

RETURN = r"""
_raw:
  description: "{digest, files, bytes} per path."
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402
from ansible_collections.torchrig.cluster.plugins.module_utils import torchrun_data as data  # noqa: E402


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        out = []
        for term in terms:
            try:
                out.append(data.cached_manifest(str(term), self.get_option("cache_dir")))
            except (data.DataError, OSError) as e:
                raise AnsibleLookupError(f"data={term}: {e}. No job was started.") from None
        return out
