"""The control of bench/imagefolder_limit.py: a job that reads every file of its staged
data set into memory at once, which the job's memory limit must stop."""

import os

blobs = []
for root, _, files in os.walk(os.environ["TORCHRIG_DATA_DIR"]):
    for name in files:
        with open(os.path.join(root, name), "rb") as f:
            blobs.append(f.read())
print(f"read {sum(map(len, blobs))} bytes into memory")
