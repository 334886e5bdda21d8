"""NOTES item 66: bench/sanitize.py with plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM set (first
argument: its value; the rest go to sanitize.py), so compute-sanitizer sees apply_rope's
token kernel past its other ends (item 65's far end) before the constant lands, e.g.

    compute-sanitizer --tool memcheck python3 sanitize_far.py 64 --families rope \\
        --num-tokens 3600,5000 --dtypes bf16,fp16 --models llama-3.1-70b,qwen2.5-7b
"""
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from cupykern import plans  # noqa: E402

if len(sys.argv) < 2 or not sys.argv[1].isdigit():
    sys.exit("usage: sanitize_far.py TOKENS_PER_SM [sanitize.py's arguments]")
plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM = int(sys.argv[1])
sys.argv = [str(ROOT / "bench" / "sanitize.py"), *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
