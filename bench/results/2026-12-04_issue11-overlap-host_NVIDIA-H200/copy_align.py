"""cudaMemcpy (device to device, cold L2) at the byte counts of call C's apply_rope and
qk_rms_norm_rope points and their neighbours: does a size that is not a multiple of 512
bytes take a slower copy (NOTES item 37, call D)?"""
import json
import os

from cupykern import timing

sizes = {}
for base in (10752000, 43008000):  # apply_rope 8b at 1024 / 4096 tokens: bytes a direction
    for extra in (0, 16, 256, 512, 4096):
        sizes[base + extra] = None
runs = []
for run in range(3):
    row = {n: timing.copy_bandwidth(n, repeat=20) for n in sizes}
    runs.append(row)
    print(f"run {run + 1}: " + ", ".join(f"{n} B {gbps:.0f} GB/s" for n, gbps in row.items()), flush=True)
json.dump({"bytes_a_direction": list(sizes), "gbps": [[r[n] for n in sizes] for r in runs]},
          open(os.path.join(os.environ.get("OUT", "."), "copy_align.json"), "w"), indent=1)
