"""The installed stack as the venv's torch sees it, one JSON line on stdout:
{"torch": "2.14.1+cu130", "cuda": "13.0" or null, "gpus": 0}.

Run on each node by roles/health/tasks/stack.yml with the venv's python
(ansible.builtin.script); tested in tests/test_health_stack.py.
"""

import json

import torch

print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}))
