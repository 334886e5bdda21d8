"""GPU time of the captured decode step of SmolLM2-135M's shapes, whole and launch by launch.

Random weights of the model's shapes (no model file needed: the timing does not depend
on the values), fp16 or bf16. Measures, by CUDA-graph replay (cupykern.timing.time_graph):

* the whole step as :class:`cupykern.llm.decode_graph.GraphDecoder` captures it, at a
  given cache position (the attention reads that many rows), and its tokens/s, with
  its kernels as programmatic dependent launches (where the GPU allows) and without;
* each launch of the step alone (the same arguments, 100 per graph), so the sum shows
  where the step's time goes, with the weight bytes each GEMV reads and its GB/s;
* a prefill of ``--prefill`` tokens by graph replays (what ``cupykern generate`` runs)
  and by the eager forward (wall time, GPU time, and the eager one's split by stage).

    python bench/bench_decode_step.py [--dtype fp16] [--position 136] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_SEED, HELP_OPTIONS, require_gpu, save  # noqa: E402
from cupykern import _dtypes, environment, sweep, timing  # noqa: E402

#: SmolLM2-135M-Instruct (HuggingFaceTB/SmolLM2-135M-Instruct config.json).
SMOLLM2 = dict(num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
               vocab_size=49152, context_length=8192, rope_base=100000.0, rotary_dim=64, rms_norm_eps=1e-5,
               tied_embeddings=True, name="SmolLM2-135M shapes, random weights")


def random_model(dtype, seed: int):
    """A LlamaModel of SmolLM2's shapes with random weights (std 1/sqrt(fan_in))."""
    from cupykern.llm.gguf_weights import LlamaConfig
    from cupykern.llm.model import LlamaModel, random_device_weights

    return LlamaModel(random_device_weights(LlamaConfig(**SMOLLM2), dtype, seed))


#: Plan constants (cupykern/plans.py) tried by --variants, each against the defaults.
VARIANTS = ({}, {"GEMV_AHEAD": 4}, {"GEMV_AHEAD": 8}, {"ATTENTION_WARPS": 8},
            {"ATTENTION_ONE_SPLIT_ROWS": 0, "ATTENTION_MIN_SPLIT_ROWS": 64},
            {"ATTENTION_ONE_SPLIT_ROWS": 0, "ATTENTION_MIN_SPLIT_ROWS": 32})


def time_variants(model, max_tokens: int, position: int) -> list[dict]:
    """The whole step captured and timed under each of :data:`VARIANTS` (plan constants
    set, the launch caches emptied, a new graph; the defaults restored after)."""
    from cupykern import launcher, plans
    from cupykern.llm.decode_graph import GraphDecoder

    rows = []
    for constants in VARIANTS:
        saved = {name: getattr(plans, name) for name in constants}
        try:
            for name, value in constants.items():
                setattr(plans, name, value)
            launcher.clear_caches()
            decoder = GraphDecoder(model, max_tokens)
            decoder.capture()
            rows.append({"constants": constants, "step_us": decoder.step_time_us(position),
                         "batched_step_us": decoder.steps_time_us(position)})
        finally:
            for name, value in saved.items():
                setattr(plans, name, value)
            launcher.clear_caches()
    return rows


def time_prefill(model, num_tokens: int, seed: int, repeat: int = 7) -> dict:
    """Median wall and GPU milliseconds of ``model.forward`` over ``num_tokens`` random ids
    into a fresh cache (host launches included: that is what a prompt costs), after a
    warm-up; and the host functions that took the most time in one more forward
    (cProfile, cumulative), to tell a host-bound prefill from a GPU-bound one."""
    import cProfile
    import io
    import pstats
    import time

    import cupy

    from cupykern.llm.stage_timer import CpuStageTimer, CudaStageTimer

    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, num_tokens)
    cache = model.new_cache(num_tokens)
    model.forward(ids, cache)  # compiles and cuBLAS start-up
    wall, gpu = [], []
    for _ in range(repeat):
        cache.length = 0
        cupy.cuda.Device().synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record()
        model.forward(ids, cache)
        end.record()
        end.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(cupy.cuda.get_elapsed_time(start, end))
    cache.length = 0
    profile = cProfile.Profile()
    profile.enable()
    model.forward(ids, cache)
    cupy.cuda.Device().synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(15)
    cache.length = 0
    timer = CudaStageTimer()
    model.forward(ids, cache, timer=timer)
    cache.length = 0
    host = CpuStageTimer()  # no synchronisation: the host's time per stage
    model.forward(ids, cache, timer=host)
    cupy.cuda.Device().synchronize()

    return {"wall_ms": float(np.median(wall)), "gpu_ms": float(np.median(gpu)), "profile": text.getvalue(),
            "stages_ms": timer.totals_ms(), "host_stages_ms": host.totals_ms()}


def time_prefill_graph(model, num_tokens: int, seed: int, repeat: int = 7) -> dict:
    """A prefill of ``num_tokens`` random ids by :class:`cupykern.llm.prefill_graph.PrefillGraphs`
    (what ``cupykern generate`` runs): the seconds its capture took (once per bucket), then
    the median wall and GPU milliseconds of a prefill (the ids' and positions' copies,
    the replays and the last row's logits) into a fresh cache; and the relative difference
    of its logits from the eager forward's."""
    import time

    import cupy

    from cupykern.llm.prefill_graph import PrefillGraphs

    ids = np.random.default_rng(seed).integers(0, model.config.vocab_size, num_tokens)
    cache = model.new_cache(num_tokens)
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = PrefillGraphs(model, cache, stream)
    capture_s = graphs.prepare(num_tokens)
    wall, gpu = [], []
    for _ in range(repeat):
        cache.length = 0
        stream.synchronize()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t0 = time.perf_counter()
        start.record(stream)
        logits = graphs.run(ids)
        end.record(stream)
        end.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        gpu.append(cupy.cuda.get_elapsed_time(start, end))
    eager = model.forward(ids, model.new_cache(num_tokens)).get().astype(np.float64)
    got = logits.get().astype(np.float64)
    return {"capture_ms": capture_s * 1e3, "wall_ms": float(np.median(wall)), "gpu_ms": float(np.median(gpu)),
            "rel_diff_from_eager": float(np.linalg.norm(got - eager) / np.linalg.norm(eager))}


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--dtype", default="fp16", type=click.Choice(["fp16", "bf16"]), show_default=True)
@click.option("--position", default=136, type=click.IntRange(min=0), show_default=True,
              help="Cache position of the timed step (SmolLM2's 9-token prompt + 256 new: 136 on average).")
@click.option("--max-tokens", default=265, type=click.IntRange(min=1), show_default=True,
              help="Rows of the static KV cache (prompt + new tokens).")
@click.option("--prefill", default=512, type=click.IntRange(min=1), show_default=True,
              help="Also time a prefill of this many prompt tokens, by graph replays and eager (after a warm-up).")
@click.option("--variants", is_flag=True,
              help="Also capture and time the whole step under other plan constants (VARIANTS).")
@click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the JSON here (it always goes to bench/results/).")
def main(dtype, position, max_tokens, prefill, variants, seed, out_dir):
    if position >= max_tokens:  # the kernels would clamp it on the device: a step never run would be timed
        raise click.BadParameter(f"expected a cache position below --max-tokens {max_tokens}, got {position}",
                                 param_hint="--position")
    require_gpu("bench_decode_step.py")

    from cupykern.llm.decode_graph import GraphDecoder

    console = Console()
    model = random_model(_dtypes.parse(dtype), seed)
    decoder = GraphDecoder(model, max_tokens)
    capture_s = decoder.capture()

    copy_gbps = timing.copy_bandwidth()
    rows = decoder.stage_split(position)
    for r in rows:
        r["gbps"] = r["weight_bytes"] / r["us"] / 1e3 if r["weight_bytes"] else None
    step_us = decoder.step_time_us(position)
    batched_step_us = decoder.steps_time_us(position)  # steps_per_graph steps in one graph launch
    plain = GraphDecoder(model, max_tokens, enable_pdl=False)  # every kernel waits for the one before it
    plain.capture()
    step_us_plain = plain.step_time_us(position)
    del plain
    prefill_graph = time_prefill_graph(model, prefill, seed)
    prefill_timing = time_prefill(model, prefill, seed)
    prefill_ms = prefill_timing["wall_ms"]
    variant_rows = time_variants(model, max_tokens, position) if variants else []
    launches_per_step = sum(r["per_step"] for r in rows)
    table = Table(title=f"decode step of SmolLM2-135M shapes, {dtype}, position {position} "
                        f"({launches_per_step} launches; copy {copy_gbps:.0f} GB/s)")
    for column in ("launch", "x per step", "us each", "us per step", "% of sum", "weight GB/s"):
        table.add_column(column, justify="right" if column != "launch" else "left")
    total = sum(r["us"] * r["per_step"] for r in rows)
    for r in rows:
        per = r["us"] * r["per_step"]
        table.add_row(r["stage"], str(r["per_step"]), f"{r['us']:.2f}", f"{per:.1f}",
                      f"{100 * per / total:.1f}", f"{r['gbps']:.0f}" if r["gbps"] else "")
    table.add_row("sum of launches alone", "", "", f"{total:.1f}", "", "")
    table.add_row(f"whole step (graph replay{', dependent launches' if decoder.pdl else ''})", "", "",
                  f"{step_us:.1f}", "", "")
    table.add_row("whole step (graph replay, plain launches)", "", "", f"{step_us_plain:.1f}", "", "")
    table.add_row(f"whole step ({decoder.steps_per_graph} steps a graph)", "", "", f"{batched_step_us:.1f}", "", "")
    console.print(table)
    console.print(f"{1e6 / batched_step_us:.0f} tokens/s batched, {1e6 / step_us:.0f} with a graph a step, at this "
                  f"position (graphs captured in {capture_s * 1e3:.0f} ms)")
    console.print(f"prefill of {prefill} tokens by graph replays: {prefill_graph['wall_ms']:.2f} ms wall, "
                  f"{prefill_graph['gpu_ms']:.2f} ms between CUDA events (captured once in "
                  f"{prefill_graph['capture_ms']:.0f} ms); logits {prefill_graph['rel_diff_from_eager']:.2e} "
                  "relative from the eager forward's")
    console.print(f"prefill of {prefill} tokens (eager forward): {prefill_ms:.2f} ms wall, "
                  f"{prefill_timing['gpu_ms']:.2f} ms between CUDA events")
    console.print("prefill GPU ms by stage (CUDA events): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in prefill_timing["stages_ms"].items()))
    console.print("prefill host ms by stage (no sync): " +
                  ", ".join(f"{k} {v:.2f}" for k, v in prefill_timing["host_stages_ms"].items()))
    console.print(prefill_timing["profile"], markup=False, highlight=False)
    for v in variant_rows:
        console.print(f"variant {v['constants']}: whole step {v['step_us']:.1f} us, batched {v['batched_step_us']:.1f} "
                      f"({1e6 / v['batched_step_us']:.0f} tokens/s)")
    result = {"format": sweep.RESULT_FORMAT, "suite": f"decode_step_{dtype}", "dtype": dtype, "position": position,
              "max_tokens": max_tokens, "seed": seed, "copy_gbps": copy_gbps, "step_us": step_us,
              "tokens_per_s": 1e6 / step_us, "pdl": decoder.pdl, "step_us_plain_launches": step_us_plain,
              "steps_per_graph": decoder.steps_per_graph, "batched_step_us": batched_step_us,
              "launches": rows, "prefill_tokens": prefill, "prefill_graph": prefill_graph,
              "prefill_eager_ms": prefill_ms,
              "prefill_gpu_ms": prefill_timing["gpu_ms"], "prefill_profile": prefill_timing["profile"],
              "prefill_stages_ms": prefill_timing["stages_ms"],
              "prefill_host_stages_ms": prefill_timing["host_stages_ms"], "variants": variant_rows,
              "environment": environment.describe()}
    console.print(f"wrote {save(result, Path(out_dir) if out_dir else None)}")


if __name__ == "__main__":
    main()
