"""NOTES item 65: runs item 53's rope_blocks4096.py or rope_token_prefill.py (the first
argument names it; the rest go to it) with plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM at 0.
Their "lib" empties the other token-kernel ends to plan the wide kernel; with the far end
set (item 65) it would plan the token kernel past the window's start instead. "rule" (in
rope_token_prefill.py) is then the committed plan without the far end: token_p and
token_d are what the far end would launch."""
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from cupykern import plans  # noqa: E402

SCRIPTS = ("rope_blocks4096.py", "rope_token_prefill.py")
if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
    sys.exit(f"usage: rope_map.py {{{','.join(SCRIPTS)}}} [its arguments]")
script = Path(__file__).resolve().parents[1] / "2026-12-06_issue11-item53" / sys.argv[1]
plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM = 0
sys.argv = [str(script), *sys.argv[2:]]
runpy.run_path(str(script), run_name="__main__")
