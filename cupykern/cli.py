"""The ``cupykern`` command: info, check, sweep, models, tune.

Parsing and printing only: a click layer over the registry (ops, inputs, references),
the model presets, the tuned-config file (cupykern/tuning.py) and the sweep engine
(cupykern/sweep.py: which points, validate then time, what --tune keeps); rich prints
the tables. Nothing imports this module.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from cupykern import _arrays, plans
from cupykern.models import NUM_TOKENS_LADDER

console = Console()


_INTEGER = re.compile(r"[+-]?[0-9]+")


def _int_list(ctx, param, value):
    """Comma-separated ASCII integers, each once (a repeat would time the same point
    again), in the order given."""
    if value is None:
        return None
    items = [v.strip() for v in str(value).split(",")]
    try:  # int() alone also took "1_6" and full-width digits; an empty item is "1,,2"
        if not all(_INTEGER.fullmatch(v) for v in items):
            raise ValueError
        return list(dict.fromkeys(int(v) for v in items))
    except ValueError:  # also int()'s limit of 4300 digits
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


#: The largest count a sweep takes: the kernels' sizes and grids are 32-bit.
_MAX_COUNT = _arrays.INT32_LIMIT - 1


def positive_int_list(ctx, param, value):
    """click callback: comma-separated ASCII integers from 1 to 2**31 - 1, each once, in the
    order given (None stays None); also bench/common.py's for the bench scripts."""
    values = _int_list(ctx, param, value)
    if values is not None and (not values or any(not 1 <= v <= _MAX_COUNT for v in values)):
        raise click.BadParameter(f"expected comma-separated integers from 1 to 2**31 - 1, got {value!r}")
    return values


def _choice_list(choices, what: str):
    """Callback: comma-separated integers, each one of ``choices``."""
    def callback(ctx, param, value):
        values = _int_list(ctx, param, value)
        bad = [v for v in values or () if v not in choices]
        if bad:
            raise click.BadParameter(f"{what} must be one of {', '.join(map(str, choices))}; got {bad}")
        return values
    return callback


def _pow2_list(ctx, param, value):
    values = positive_int_list(ctx, param, value)
    bad = [v for v in values or () if v & (v - 1)]
    if bad:
        raise click.BadParameter(f"expected powers of two, got {bad}")
    return values


def _block_size_list(ctx, param, value):
    values = positive_int_list(ctx, param, value)
    bad = [v for v in values or () if v % plans.WARP_SIZE or v > plans.MAX_BLOCK_SIZE]
    if bad:
        raise click.BadParameter(f"block sizes must be multiples of {plans.WARP_SIZE} up to "
                                 f"{plans.MAX_BLOCK_SIZE}, got {bad}")
    return values


_BOOLS = {"true": True, "false": False}


def _bool_list(ctx, param, value):
    """Callback: comma-separated true / false (either case), as bools."""
    if value is None:
        return None
    items = [v.strip().lower() for v in value.split(",")]
    bad = [v for v in items if v not in _BOOLS]
    if bad:
        raise click.BadParameter(f"expected comma-separated true / false, got {bad}")
    return [_BOOLS[v] for v in dict.fromkeys(items)]


def _model(ctx, param, value):
    from cupykern import models

    try:
        return models.get(value)
    except KeyError as exc:
        raise click.BadParameter(exc.args[0]) from None


def _dtype_list(ctx, param, value):
    from cupykern import _dtypes

    items = [v.strip() for v in value.split(",")]
    if not all(items):  # "," or "bf16,,fp16", as _int_list refuses "1,,2"
        raise click.BadParameter(f"expected comma-separated dtypes (bf16, fp16, fp32), got {value!r}")
    try:
        return list(dict.fromkeys(_dtypes.parse(v) for v in items))  # bf16,bfloat16 is one dtype
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _output_file(ctx, param, value):
    """A file path whose directory exists, checked before the sweep (it would fail after
    the first point, or at the end for --csv)."""
    if value is None:
        return None
    if not value.name:
        raise click.BadParameter(f"expected a file path, got {str(value)!r}")
    if not value.parent.is_dir():
        raise click.BadParameter(f"{value.parent} is not a directory")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cupykern")
def main():
    """Fused LLM kernels on CuPy: inspect, check and sweep them."""


# ----------------------------------------------------------------- info
@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the environment as JSON")
def info(as_json):
    """GPU, versions and where the caches are (works without a GPU): CuPy's compiled
    kernels, cupykern's cache directory (models/ and the tuned file), the tuned file."""
    from cupykern import environment, tuning, user_cache

    env = environment.describe()
    env["kernel_cache_dir"] = os.environ.get("CUPY_CACHE_DIR", str(Path.home() / ".cupy" / "kernel_cache"))
    env["cache_dir"] = str(user_cache.cache_dir())
    env["tuned_configs"] = str(tuning.path())
    if as_json:
        click.echo(json.dumps(env, indent=1))
        return
    table = Table(title="cupykern info", show_header=False)
    for key, value in env.items():
        table.add_row(key, escape(str(value)))  # paths and names as they are: "[x]" is no style
    console.print(table)
    if not env["gpu_available"]:
        console.print("[yellow]No CUDA GPU is visible: kernels cannot run here; `cupykern check` still "
                      "compiles them (`--all`: every instantiation).[/]")


# ----------------------------------------------------------------- check
def _compile_job(job):
    from cupykern import jit

    filename, exprs, arch = job
    try:
        return filename, len(exprs), jit.nvrtc_spills(filename, exprs, arch), None
    except RuntimeError as exc:
        return filename, len(exprs), {}, str(exc)


#: The compute capability compiled for without a GPU (H100/H200).
NO_GPU_ARCH = "90"


#: Instantiations an NVRTC program compiles. gemv.cu's 46 of the covering set took 54 s of
#: the 133 s of CPU the set needs: in one program it held one of 2 cores while the other
#: finished the rest. 16 a program: `cupykern check` 93 -> 72 s on 2 cores, the same CPU
#: time (item 40). (The compile test's two architectures already balance its 64.)
COMPILE_CHUNK = 16


def _compile_all(arch: str, instantiations: dict) -> int:
    """Compiles ``instantiations`` ({source: [name expressions]}) with NVRTC for ``arch`` on
    every core and prints a table per source: how many failed, how many spill registers
    to local memory (ptxas), and how many of those the heuristics launch
    (covering.heuristic_picks, planned for the sources that spilled only;
    tests/data/known_spills.json is their ledger). Returns how many failed to compile."""
    from cupykern import covering

    jobs = [(f, exprs[i:i + COMPILE_CHUNK], arch) for f, exprs in instantiations.items()
            for i in range(0, len(exprs), COMPILE_CHUNK)]
    counts: dict = {}
    spilled: dict = {}
    with Progress(console=console) as progress, ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        task = progress.add_task(f"NVRTC sm_{arch}", total=sum(len(j[1]) for j in jobs))
        for future in as_completed([pool.submit(_compile_job, j) for j in jobs]):
            filename, n, spills, error = future.result()
            total, bad = counts.get(filename, (0, 0))
            counts[filename] = (total + n, bad + (n if error else 0))
            spilled.setdefault(filename, []).extend(expr for expr, size in spills.items() if size)
            if error:
                console.print(f"[red]{escape(error)}[/]")
            progress.advance(task, n)
    picks = covering.heuristic_picks(sources={f for f, exprs in spilled.items() if exprs})
    table = Table(title=f"compile (NVRTC, sm_{arch})",
                  caption="spilling: ptxas moved registers to local memory; the heuristics' spills are the ones "
                          "tests/data/known_spills.json accepts (ptxas trading a few bytes for occupancy)")
    for column in ("source", "instantiations", "failed", "spilling", "of them launched by the heuristics"):
        table.add_column(column)
    for filename, (total, bad) in sorted(counts.items()):
        launched = [expr for expr in spilled[filename] if expr in picks.get(filename, ())]
        table.add_row(filename, str(total), f"[red]{bad}[/]" if bad else "0", str(len(spilled[filename])),
                      str(len(launched)))
    console.print(table)
    return sum(bad for _, bad in counts.values())


@main.command()
@click.option("--arch", default=None,
              help="compute capability to compile for, 80 or newer (default: the GPU's, else 90)")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="seed of the validation inputs (an int >= 0, as numpy.random.default_rng takes)")
@click.option("--skip-compile", is_flag=True, help="only validate on the GPU")
@click.option("--all", "compile_all", is_flag=True,
              help="compile the full cross product of instantiations (cupykern.families; minutes), not the "
                   "covering set")
def check(arch, seed, skip_compile, compile_all):
    """Compile the kernels with NVRTC; with a GPU, validate each op.

    By default NVRTC compiles the covering set (cupykern/covering.py): every source,
    every value of every template parameter, and every instantiation the planner picks
    for the model presets; --all compiles every instantiation the ops can launch.
    """
    from cupykern import covering, environment, families, jit

    gpu = environment.gpu_available()
    if skip_compile and not gpu:
        raise click.UsageError("--skip-compile leaves nothing to do without a GPU (validation needs one)")
    if arch is not None:
        try:
            jit.check_arch(arch)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--arch") from None
    gpu_arch = None
    if gpu:
        import cupy

        problem = jit.device_arch_problem()  # helper 87: it compiled for the GPU's 75 and exited 0
        if problem:
            raise click.UsageError(f"{problem} (compile without it: CUDA_VISIBLE_DEVICES= cupykern check --arch 90)")
        gpu_arch = cupy.cuda.Device().compute_capability
    failures = 0
    if not skip_compile:
        if arch is None:
            arch = gpu_arch or NO_GPU_ARCH
        failures += _compile_all(arch, families.instantiations() if compile_all else covering.instantiations())
    if gpu:
        failures += _validate_all(seed)
    else:
        console.print("[yellow]No CUDA GPU: kernels were compiled but not run against the reference.[/]")
    sys.exit(1 if failures else 0)


def _validate_all(seed: int) -> int:
    from cupykern import _dtypes, models
    from cupykern.registry import all_specs
    from cupykern.validation import check_op

    table = Table(title=f"validation against the float64 reference (seed {seed})")
    for column in ("op", "dtype", "num_tokens", "size", "error / tolerance", "max ulp", "result"):
        table.add_column(column)
    failures = 0
    cases = [(spec, spec.name) for spec in all_specs().values()]
    cases += [(spec.for_model(models.get(name)), f"{spec.name} ({name})") for spec in all_specs().values()
              for name in spec.check_models]
    for spec, label in cases:
        for dtype, num_tokens, size in itertools.product(_dtypes.DTYPES, spec.check_token_counts,
                                                            spec.check_sizes):
            result = check_op(spec, num_tokens, size, dtype, seed)
            failures += not result.ok
            table.add_row(label, _dtypes.short_name(dtype), str(num_tokens), str(size),
                          f"{result.worst_error_ratio:.3f}", f"{result.max_ulp_err:.1f}",
                          "[green]ok[/]" if result.ok else f"[red]{escape(result.message)}[/]")
    console.print(table)
    return failures


# ----------------------------------------------------------------- sweep
def _flags(keys) -> str:
    """Override keys as the sweep's options: ``--block-size, --vec-width``."""
    return ", ".join("--" + k.replace("_", "-") for k in keys)


def _plan_text(point: dict) -> str:
    """The launched plan in a few characters (``-`` for none)."""
    kind = point["plan_kind"]
    if kind is None:
        return "-"
    if kind == "rows":  # exact: the leaf walk without bounds; reread: pass 2 from L2 (absent in older files)
        text = (f"{point['threads_per_row']}x{point['vec_width']}x{point['vecs_per_thread']} "
                f"r{point['rows_per_block']}{' exact' if point.get('exact') else ''}"
                f"{' reread' if point.get('reread') else ''}")
    elif kind == "activation":  # walk: grid-stride over the work items; item: a block per item
        text = f"b{point['block_size']} x{point['vec_width']} {'walk' if point['grid_stride'] else 'item'}"
    else:  # rope: threads per head x vector width, head slots, tokens per block
        text = f"{point['threads_per_head']}x{point['vec_width']} h{point['head_slots']} t{point['tokens_per_block']}"
    return f"{text} {point['origin']}"


def _print_sweep(points: list, model_name: str, copy_gbps: float, seed: int, tune: bool) -> None:
    if tune:  # every candidate would be a row: show the fastest validated one per point instead
        best: dict = {}
        for p in points:
            key = (p["op"], p["dtype"], p["size"], p["num_tokens"])
            if p["check_ok"] and (key not in best or p["median_us"] < best[key]["median_us"]):
                best[key] = p
        points = list(best.values())
    title = f"sweep {model_name}: copy {copy_gbps:.0f} GB/s (same run), seed {seed}" + (
        " (fastest validated configuration per point)" if tune else "")
    table = Table(title=title)
    columns = ("op", "dtype", "size", "num_tokens", "plan", "median_us", "gbps", "pct_of_copy", "method",
               "max_ulp_err", "alloc_bytes", "check")
    for column in columns:
        table.add_column(column)
    for p in points:
        cells = []
        for column in columns:
            if column == "plan":
                value = _plan_text(p)
            elif column == "check":
                value = "[green]ok[/]" if p["check_ok"] else f"[red]{escape(str(p['check']))}[/]"
            else:
                value = p[column]
                if value is None:
                    value = "-"
                elif isinstance(value, float):
                    value = f"{value:.2f}" if column == "median_us" else f"{value:.1f}"
            cells.append(str(value))
        table.add_row(*cells)
    Console(width=max(console.width, 180)).print(table)


@main.command()
@click.argument("ops", nargs=-1)
@click.option("--model", "model", callback=_model, default="llama-3.1-8b", show_default=True,
              help="model preset giving each op's row size and constants (see `cupykern models`)")
@click.option("--num-tokens", callback=positive_int_list, default=",".join(map(str, NUM_TOKENS_LADDER)),
              show_default=True,
              help="rows per call (tokens), comma-separated: decode sizes to prefill sizes (the gemv ops take "
                   "at most 16; larger counts are left out for them)")
@click.option("--hidden-size", "sizes", callback=positive_int_list, default=None,
              help="row sizes overriding the model's, for every chosen op (name the ops): hidden_size (norms, "
                   "softmax, row_reduce, the gemv ops' k, embedding), d (activations), head_dim (RoPE, "
                   "rope_kv_append, decode_attention, prefill_attention), vocab_size (sample_tokens), history length "
                   "(append_tokens)")
@click.option("--dtype", "dtypes", callback=_dtype_list, default="bf16", show_default=True,
              help="storage dtypes, comma-separated: bf16, fp16, fp32 (or bfloat16, float16, float32)")
@click.option("--block-size", callback=_block_size_list, default=None,
              help="row kernels: threads per block = threads_per_row x rows_per_block (threads_per_row from "
                   "--threads-per-row, else the heuristic's); activations: threads per block")
@click.option("--threads-per-row", callback=_choice_list(plans.THREADS_PER_ROW_CHOICES, "threads per row"),
              default=None, help="row kernels: threads sharing a row")
@click.option("--vec-width", callback=_choice_list((1, 2, 4, 8), "vector widths"), default=None,
              help="row kernels: elements per access, 1 or 16 bytes' worth (8 for fp16/bf16, 4 for fp32); "
                   "activations: 1 or 4, 8 or 16 bytes' worth (fp16/bf16 2, 4, 8; fp32 2, 4)")
@click.option("--vecs-per-thread", callback=_choice_list(plans.VECS_PER_THREAD_CHOICES, "vecs per thread"),
              default=None, help="row kernels: reduction-tree columns (leaves kept in registers) per thread; "
                                 "by default the number threads_per_row needs")
@click.option("--rows-per-block", callback=_pow2_list, default=None, help="row kernels: rows per block")
@click.option("--grid-stride", callback=_bool_list, default=None,
              help="activations: true for one wave of blocks walking the (row, chunk) work items grid-stride, "
                   "false for a block per item (true,false compares both)")
@click.option("--repeat", type=click.IntRange(min=1), default=None,
              help="timed samples per point (cold-L2 calls, or graph replays for decode sizes) [default: 50 / 20]")
@click.option("--seed", default=20261129, show_default=True, type=click.IntRange(min=0),
              help="seed of the inputs (validated and timed; an int >= 0)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=_output_file,
              help="write the points to this JSON file, with GPU, driver, CuPy version, commit, seed and date "
                   "(updated as the sweep goes)")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=_output_file,
              help="write the points alone to this CSV file (the columns of cupykern/sweep.py's POINT_FIELDS)")
@click.option("--tune", is_flag=True,
              help="row kernels: keep the fastest validated layout over the num_tokens list in the tuned file "
                   "(see `cupykern tune`)")
def sweep(ops, model, num_tokens, sizes, dtypes, block_size, threads_per_row, vec_width, vecs_per_thread,
          rows_per_block, grid_stride, repeat, seed, json_path, csv_path, tune):
    """Validate and time OPS (default: all) over token counts, dtypes and launch configurations.

    Row sizes and op constants come from --model (default llama-3.1-8b) unless
    --hidden-size is given. The launch options are crossed and applied to the ops
    whose plan takes them: the row kernels' five to the norms, softmax and row_reduce;
    --block-size, --vec-width and --grid-stride to the activations; none to RoPE or the
    decode ops (gemv, attention and tokens families); an option that none of the
    chosen ops takes is a usage error. A combination the plan rejects for a shape is
    skipped with a yellow line. Each point reports the plan that was
    launched, its errors against the float64 reference and the device memory one call
    allocates. Exits 1 if any point disagreed with the reference.

    Without a GPU it says so and runs the compile check of `cupykern check` on the
    covering set of the chosen ops' kernels instead (exit 1 if one fails to compile).
    """
    from cupykern import environment, timing, tuning
    from cupykern import sweep as engine
    from cupykern.registry import all_specs

    specs = all_specs()
    unknown = [op for op in ops if op not in specs]
    if unknown:
        raise click.BadParameter(f"unknown op(s) {unknown}; known: {sorted(specs)}", param_hint="OPS")
    if block_size and rows_per_block:
        raise click.UsageError("--block-size and --rows-per-block set the same thing (block size = "
                               "threads_per_row x rows_per_block); give one of them")
    chosen = list(dict.fromkeys(ops)) or list(specs)
    op_sizes = {op: sizes or [specs[op].size_for_model(model)] for op in chosen}
    for op, op_size_list in op_sizes.items():
        for size in op_size_list:
            problem = specs[op].size_error(size)
            if problem:
                raise click.BadParameter(problem + ("; choose the ops with OPS" if not ops else ""),
                                         param_hint="--hidden-size")
    if tune and not any(engine.tunable(op) for op in chosen):
        raise click.UsageError(f"--tune tunes the row kernels ({', '.join(o for o in specs if engine.tunable(o))}); "
                               "none was chosen")
    options = dict(threads_per_row=threads_per_row, vec_width=vec_width, vecs_per_thread=vecs_per_thread,
                   rows_per_block=rows_per_block, block_size=block_size, grid_stride=grid_stride)
    ignored = {op: engine.ignored_options(op, options) for op in chosen}
    unused = [key for key in options if all(key in keys for keys in ignored.values())]
    if unused:  # helper 61: `sweep apply_rope --block-size 128` ran RoPE's own plans, saying nothing without a GPU
        takes = "; ".join(f"{op} takes {_flags(engine.launch_options(op)) or 'none'}" for op in chosen)
        raise click.UsageError(f"{_flags(unused)} {'applies' if len(unused) == 1 else 'apply'} to none of the "
                               f"chosen ops: {takes}")
    if not environment.gpu_available():
        reason = environment.gpu_problem() or "CuPy sees no CUDA GPU"
        if tune:
            raise click.UsageError(f"--tune times the kernels on this machine's GPU: {reason}")
        # The main job still does what it can here: the compile check of `cupykern check`.
        console.print(f"[yellow]No CUDA GPU ({escape(reason)}): nothing can be timed or validated here. Running the "
                      f"compile check instead (as `cupykern check` does without a GPU): NVRTC compiles the "
                      f"covering set of the chosen ops' kernels for sm_{NO_GPU_ARCH} (every source, every template "
                      f"parameter value, the model presets' picks; `cupykern check --all` compiles every "
                      f"instantiation).[/]", soft_wrap=True)
        if json_path or csv_path:
            console.print("[yellow]--json/--csv: no points, nothing written.[/]")
        shaping = [flag for flag, value in (("--hidden-size", sizes), *((_flags([k]), v) for k, v in options.items()))
                   if value]
        if shaping:  # helper 62: they were taken without a word
            console.print(f"[yellow]{', '.join(shaping)}: no effect on the compile check (they shape the timed "
                          f"points).[/]")
        from cupykern import covering

        failures = _compile_all(NO_GPU_ARCH, covering.instantiations({specs[op].family for op in chosen}))
        console.print("[red]compile check failed[/]" if failures else
                      "[green]compile check passed[/] (run `cupykern sweep` on a GPU to validate and time)")
        sys.exit(1 if failures else 0)

    for op, keys in ignored.items():
        if keys:
            takes = _flags(engine.launch_options(op)) or "none"
            console.print(f"[yellow]{op} ignores {_flags(keys)} (its launch options: {takes})[/]", soft_wrap=True)
    for op in chosen:
        dropped = [n for n in num_tokens if not specs[op].takes_tokens(n)]
        if dropped:
            console.print(f"[yellow]{op} takes at most {specs[op].max_tokens} tokens: skips num_tokens "
                          f"{','.join(map(str, dropped))}[/]", soft_wrap=True)
    if tune:  # before the sweep: an invalid file would refuse its results at the end
        try:
            tuning.read()
        except tuning.TunedFileError as exc:
            raise click.ClickException(str(exc)) from None
    limits = engine.current_device_limits()
    cases = engine.plan_cases(chosen, sizes=op_sizes, dtypes=dtypes, num_tokens=num_tokens, options=options,
                              tune=tune, model=model, seed=seed)
    env = environment.describe()
    copy_gbps = timing.copy_bandwidth()

    def document():
        return engine.result_document("sweep", environment=env, seed=seed, copy_gbps=copy_gbps, model=model.name,
                                      points=points, tune=tune)

    points, failures = [], 0
    with Progress(console=console) as progress:
        task = progress.add_task(f"sweep ({model.name})", total=len(cases))
        for outcome in engine.run_cases(cases, seed=seed, copy_gbps=copy_gbps, model=model, repeat=repeat,
                                        ignore_tuned=tune):
            progress.advance(task)
            if isinstance(outcome, engine.Skipped):
                if not tune:  # a candidate illegal for one shape is no news
                    console.print(f"[yellow]skipped {escape(outcome.case.describe())}: {escape(outcome.reason)}[/]",
                                  soft_wrap=True)
                continue
            points.append(outcome.as_dict())
            failures += not outcome.check_ok
            if json_path:  # written as it goes, so an interrupted sweep keeps its points
                engine.write_json(json_path, document())
    if not points:
        console.print("[red]Every point was skipped: no launch configuration given was legal for these shapes.[/]")
        sys.exit(2)
    _print_sweep(points, model.name, copy_gbps, seed, tune)
    if json_path:
        engine.write_json(json_path, document())
    if csv_path:
        engine.write_csv(csv_path, points)
    if tune:
        entries, untuned = engine.tuned_entries(points, num_tokens, gpu=limits.name, commit=str(env.get("commit", "")),
                                                date=str(env.get("date", "")))
        for op, dtype, size in untuned:
            console.print(f"[yellow]{op} {dtype} {size}: no layout validated at every num_tokens; nothing stored[/]",
                          soft_wrap=True)
        if entries:
            try:
                path = tuning.save(entries)
            except tuning.TunedFileError as exc:
                raise click.ClickException(str(exc)) from None
            _print_tuned(entries, f"tuned on {limits.name}, saved to {path}")
    sys.exit(1 if failures else 0)


def _sweep_epilog() -> str:
    """The op names and dtypes sweep takes, from the registry and the dtype table."""
    from cupykern import _dtypes
    from cupykern.registry import all_specs

    return (f"OPS: {', '.join(all_specs())}. DTYPES (--dtype): "
            f"{', '.join(_dtypes.short_name(d) for d in _dtypes.DTYPES)}.")


sweep.epilog = _sweep_epilog()


def _print_tuned(entries, title: str) -> None:
    table = Table(title=escape(title), box=box.SIMPLE_HEAD)
    for column in ("gpu", "op", "dtype", "size", "threads x vec x cache", "rows_per_block by num_tokens", "score",
                   "commit"):
        table.add_column(column, no_wrap=True)
    for e in entries:
        # The file's strings as they are (a hand-edited "[/x]" is no style, nor an error).
        table.add_row(escape(e.gpu), escape(e.op), escape(e.dtype), str(e.size),
                      f"{e.threads_per_row} x {e.vec_width} x {e.vecs_per_thread}",
                      " ".join(f"{n}:{r}" for n, r in e.rows_per_block), f"{e.score:.3f}", escape(e.commit))
    Console(width=max(console.width, 160)).print(table)


# ----------------------------------------------------------------- models
@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the presets as JSON")
def models(as_json):
    """The model presets (shapes from each model's Hugging Face config.json)."""
    from dataclasses import asdict

    from cupykern import models as presets

    if as_json:
        data = {}
        for p in presets.PRESETS.values():
            d = asdict(p)
            d["rope_scaling"] = p.rope_scaling
            del d["rope_scaling_items"]
            data[p.name] = d
        click.echo(json.dumps(data, indent=1))
        return
    table = Table(title=f"model presets (default: {presets.DEFAULT_MODEL})", box=box.SIMPLE_HEAD)
    for column in ("name", "config.json of", "hidden", "interm.", "heads q/kv", "head_dim", "rotary", "rope_theta",
                   "rope_scaling", "eps", "act", "w offset", "qk norm"):
        table.add_column(column, no_wrap=True)
    for p in presets.PRESETS.values():
        table.add_row(p.name, p.hf_repo, str(p.hidden_size), str(p.intermediate_size),
                      f"{p.num_attention_heads}/{p.num_key_value_heads}", str(p.head_dim), str(p.rotary_dim),
                      f"{p.rope_theta:.0f}", p.rope_type, f"{p.rms_norm_eps:g}", p.activation, f"{p.norm_weight_offset:g}",
                      "yes" if p.qk_norm else "no")
    wide = Console(width=max(console.width, 200))  # one line per preset, even when piped
    wide.print(table)
    for p in presets.PRESETS.values():
        if p.notes:
            console.print(f"[bold]{p.name}[/]: {p.notes}")


# ----------------------------------------------------------------- tune
@main.command()
@click.option("--show", is_flag=True, help="print the tuned configurations (the default)")
@click.option("--clear", is_flag=True, help="remove the tuned file (back to the heuristics)")
@click.option("--json", "as_json", is_flag=True, help="with --show: print the file as is")
def tune(show, clear, as_json):
    """Show or remove the tuned row-kernel configurations written by `cupykern sweep --tune`.

    The file is $CUPYKERN_TUNE_FILE if set, else tuned.json in the cupykern cache directory
    ($CUPYKERN_CACHE_DIR if set, else the platform's user cache directory, on Linux
    $XDG_CACHE_HOME/cupykern or ~/.cache/cupykern). --show exits 1 with one line saying what is wrong if
    the file is invalid (the ops then ignore it and use the heuristics).
    """
    from cupykern import tuning

    if clear and (show or as_json):
        raise click.UsageError("--clear removes the file: give it without --show and --json")
    path = tuning.path()
    if clear:
        try:
            removed = tuning.clear()
        except tuning.TunedFileError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"removed {path}" if removed else f"nothing to remove: {path} does not exist")
        return
    if not path.exists():
        if as_json:  # still JSON, for scripts: the file's format with no entries
            click.echo(json.dumps({"format": tuning.FORMAT, "entries": []}))
        else:
            click.echo(f"no tuned configurations: {path} does not exist (run `cupykern sweep --tune`)")
        return
    try:
        entries = list(tuning.read(path).values())
    except tuning.TunedFileError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(path.read_text())
        return
    _print_tuned(entries, f"{path}: {len(entries)} tuned configuration(s)")


# ----------------------------------------------------------------- llm commands
# The real-model commands (`generate`, `fetch-model`) live with the pipeline in cupykern/llm/.
from cupykern.llm.cli import COMMANDS as _LLM_COMMANDS  # noqa: E402

for _command in _LLM_COMMANDS:
    main.add_command(_command)


if __name__ == "__main__":
    main()
