"""Device-to-device copy bandwidth (cold L2) by size, against the 1 GiB copy the % of copy
columns use: what a copy of an op's own bytes reaches at that size (NOTES item 28)."""
import json
import os
import sys

from cupykern import timing

MIB = 1 << 20
sizes = [16, 32, 64, 128, 256, 512, 1024]  # bytes read (and written) per copy, MiB
runs = []
for run in range(2):
    row = {n: timing.copy_bandwidth(n * MIB, repeat=30) for n in sizes}
    runs.append(row)
    print(f"run {run + 1}: " + ", ".join(f"{n} MiB {gbps:.0f} GB/s ({100 * gbps / row[1024]:.1f} %)" for n, gbps in row.items()))
json.dump({"sizes_mib": sizes, "gbps": [[r[n] for n in sizes] for r in runs]},
          open(os.path.join(os.environ.get("OUT", "."), "copy_sizes.json"), "w"), indent=1)
