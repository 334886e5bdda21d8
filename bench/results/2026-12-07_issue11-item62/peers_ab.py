"""NOTES item 62: bench/peers.py with cupykern.timing.FLUSHED_WARMUP set to N (time_cold's
untimed flush-and-call pairs before the timed ones), for the A/B of the peers method:

    python peers_ab.py N [peers.py's options]

The result file's name gets "-fwN" after the commit (CUPYKERN_COMMIT), so runs of one
tree side by side keep their own files."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import peers  # noqa: E402
from cupykern import timing  # noqa: E402

# Only as the script: peers.py's torch.compile workers (spawned) import this file again as
# __mp_main__, where argv is theirs (item 63's call 10: all 8 workers failed on it, and the
# run compiled in its own process instead).
if __name__ == "__main__":
    timing.FLUSHED_WARMUP = int(sys.argv.pop(1))
    os.environ["CUPYKERN_COMMIT"] = f"{os.environ.get('CUPYKERN_COMMIT', '?')}-fw{timing.FLUSHED_WARMUP}"
    peers.main()
