"""A script that fails with a usage error on every node (faults.yml, f-usage)."""

import argparse

p = argparse.ArgumentParser()
p.add_argument("epochs", type=int)
p.add_argument("--batch_size", type=int, required=True)
args = p.parse_args()
