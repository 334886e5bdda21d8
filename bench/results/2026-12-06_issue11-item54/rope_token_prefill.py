"""NOTES item 54: item 53's rope_token_prefill.py (its arguments and output, run as it is)
where a preset named ``<preset>@<H>`` is that preset with H heads in all (q heads H - its
kv heads), so that shapes of no preset whose decode heads fill the token kernel at 8 lanes
(24, 48, 84, 96, 140, 160 heads of 128) are timed in the window and its 8-lane end:

    python bench/results/2026-12-06_issue11-item54/rope_token_prefill.py \\
        --models llama-3.1-8b@48,llama-3.1-8b@160 --sizes 2300,3036,4091,4092 --tag b54

Calls 3 and 4 ran a copy of item 53's script with this change written into it (a670b33);
this wrapper makes the same change without the copy."""
import dataclasses
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from cupykern import models  # noqa: E402

preset_of = models.get


def preset_with_heads(name):
    preset, _, total_heads = name.partition("@")
    model = preset_of(preset)
    if not total_heads:
        return model
    return dataclasses.replace(model, num_attention_heads=int(total_heads) - model.num_key_value_heads)


models.get = preset_with_heads  # item 53's script looks it up at each model
runpy.run_path(str(ROOT / "bench/results/2026-12-06_issue11-item53/rope_token_prefill.py"), run_name="__main__")
