"""NOTES item 66: reads rope_blocks_<tag>.json and rope_token_prefill_<tag>.json (item 53's
scripts, run through item 65's rope_map.py) into one line a point: the median of each
variant's interleaved rounds, the token kernels against lib (the wide kernel) and the best
token kernel against Liger.

    python3 read_map.py FILE.json [FILE.json ...]
"""
import json
import statistics
import sys


def line(device: str, point: dict) -> str:
    med = {name: statistics.median(us) for name, us in point["us"].items() if not name.endswith("_probed")}
    lib = med["lib"]
    cells = [f"{device:5s} {point['model']:14s} {point['num_tokens']:6d}: lib {lib:7.2f}"]
    tokens = [name for name in ("token_p", "token_d") if name in med]
    for name in tokens:
        cells.append(f"{name} {med[name]:7.2f} ({100 * (med[name] / lib - 1):+5.1f} %)")
    if "liger" in med:
        best = min(tokens, key=med.get)
        cells.append(f"liger {med['liger']:7.2f}  {best}/liger {100 * (med[best] / med['liger'] - 1):+5.1f} %")
    return "  ".join(cells)


for path in sys.argv[1:]:
    data = json.load(open(path))
    device = data["device"].replace("NVIDIA ", "")[:5]
    for point in data["points"]:
        print(line(device, point))
