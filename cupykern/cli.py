"""The ``cupykern`` command: info, check, sweep, models, tune.

A thin click layer over registry (ops, inputs, references), models (presets), launch
(overrides), tuning (the tuned-config file), validation and measure (check then
time); rich prints the tables.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from cupykern.models import NUM_TOKENS_LADDER

console = Console()



def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return [int(v) for v in str(value).split(",")]
    except ValueError:  # also an empty item ("1,,2")
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _positive_int_list(ctx, param, value):
    values = _int_list(ctx, param, value)
    if values is not None and (not values or any(v < 1 for v in values)):
        raise click.BadParameter(f"expected comma-separated integers >= 1, got {value!r}")
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
    values = _positive_int_list(ctx, param, value)
    bad = [v for v in values or () if v & (v - 1)]
    if bad:
        raise click.BadParameter(f"expected powers of two, got {bad}")
    return values


def _block_size_list(ctx, param, value):
    from cupykern import launch

    values = _positive_int_list(ctx, param, value)
    bad = [v for v in values or () if v % launch.WARP_SIZE or v > launch.MAX_THREADS_PER_ROW]
    if bad:
        raise click.BadParameter(f"block sizes must be multiples of {launch.WARP_SIZE} up to "
                                 f"{launch.MAX_THREADS_PER_ROW}, got {bad}")
    return values


def _model(ctx, param, value):
    from cupykern import models

    try:
        return models.get(value)
    except KeyError as exc:
        raise click.BadParameter(exc.args[0]) from None


def _dtype_list(ctx, param, value):
    from cupykern import _dtypes

    try:
        return [_dtypes.parse(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cupykern")
def main():
    """Fused LLM kernels on CuPy: inspect, check and sweep them."""


# ----------------------------------------------------------------- info
@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the environment as JSON")
def info(as_json):
    """GPU, versions and the kernel cache location (works without a GPU)."""
    from cupykern import environment, tuning

    env = environment.describe()
    env["kernel_cache_dir"] = os.environ.get("CUPY_CACHE_DIR", str(Path.home() / ".cupy" / "kernel_cache"))
    env["tuned_configs"] = str(tuning.path())
    if as_json:
        click.echo(json.dumps(env, indent=1))
        return
    table = Table(title="cupykern info", show_header=False)
    for key, value in env.items():
        table.add_row(key, str(value))
    console.print(table)
    if not env["gpu_available"]:
        console.print("[yellow]No CUDA GPU is visible: kernels cannot run here; `cupykern check` still "
                      "compiles every kernel.[/]")


# ----------------------------------------------------------------- check
def _compile_job(job):
    from cupykern import jit

    filename, exprs, arch = job
    try:
        jit.nvrtc_compile(filename, exprs, arch)
        return filename, len(exprs), None
    except RuntimeError as exc:
        return filename, len(exprs), str(exc)


@main.command()
@click.option("--arch", default=None, help="compute capability to compile for (default: the GPU's, else 90)")
@click.option("--seed", default=0, show_default=True, help="seed of the validation inputs")
@click.option("--skip-compile", is_flag=True, help="only validate on the GPU")
def check(arch, seed, skip_compile):
    """Compile every kernel instantiation with NVRTC; with a GPU, validate each op."""
    from cupykern import environment, jit

    gpu = environment.gpu_available()
    if skip_compile and not gpu:
        raise click.UsageError("--skip-compile leaves nothing to do without a GPU (validation needs one)")
    if arch is not None:
        from cupy_backends.cuda.libs import nvrtc

        supported = [str(a) for a in nvrtc.getSupportedArchs()]
        if arch not in supported:
            raise click.BadParameter(f"expected a compute capability NVRTC supports ({', '.join(supported)}), "
                                     f"e.g. 90, got {arch!r}", param_hint="--arch")
    failures = 0
    if not skip_compile:
        if arch is None:
            import cupy

            arch = cupy.cuda.Device().compute_capability if gpu else "90"
        jobs = [(f, exprs[i:i + 64], arch) for f, exprs in jit.instantiations().items()
                for i in range(0, len(exprs), 64)]
        counts: dict = {}
        with Progress(console=console) as progress, ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            task = progress.add_task(f"NVRTC sm_{arch}", total=sum(len(j[1]) for j in jobs))
            for future in as_completed([pool.submit(_compile_job, j) for j in jobs]):
                filename, n, error = future.result()
                ok, bad = counts.get(filename, (0, 0))
                counts[filename] = (ok + (0 if error else n), bad + (n if error else 0))
                if error:
                    console.print(f"[red]{error}[/]")
                progress.advance(task, n)
        table = Table(title=f"compile (NVRTC, sm_{arch})")
        for column in ("source", "instantiations", "failed"):
            table.add_column(column)
        for filename, (ok, bad) in sorted(counts.items()):
            table.add_row(filename, str(ok + bad), f"[red]{bad}[/]" if bad else "0")
            failures += bad
        console.print(table)
    if gpu:
        failures += _validate_all(seed)
    else:
        console.print("[yellow]No CUDA GPU: kernels were compiled but not run against the reference.[/]")
    sys.exit(1 if failures else 0)


def _validate_all(seed: int) -> int:
    from cupykern import _dtypes
    from cupykern.registry import all_specs
    from cupykern.validation import check_op

    table = Table(title=f"validation against the float64 reference (seed {seed})")
    for column in ("op", "dtype", "num_tokens", "size", "error / tolerance", "result"):
        table.add_column(column)
    failures = 0
    for spec in all_specs().values():
        for dtype, num_tokens, size in itertools.product(_dtypes.DTYPES, (1, 257), spec.check_sizes):
            result = check_op(spec, num_tokens, size, dtype, seed)
            failures += not result.ok
            table.add_row(spec.name, _dtypes.short_name(dtype), str(num_tokens), str(size),
                          f"{result.worst_error_ratio:.3f}", "[green]ok[/]" if result.ok else f"[red]{result.message}[/]")
    console.print(table)
    return failures


# ----------------------------------------------------------------- sweep
#: Families planned by launch.plan_rows: the ones the layout options and --tune apply to.
ROW_FAMILIES = ("norm", "softmax", "row_reduce")
#: Ops whose kernel makes one pass (no register cache: vecs_per_thread does not apply).
ONE_PASS_OPS = ("row_reduce",)
_LAYOUT_KEYS = ("threads_per_row", "vec_width", "vecs_per_thread")
#: Options the activation kernel takes (launch.plan_activation).
_ACTIVATION_KEYS = ("block_size", "vec_width")


def _activation_plan(num_tokens: int, size: int, dtype, config: dict, limits):
    """``(overrides, plan)`` for an activation op on the registry's fresh contiguous
    inputs (16-byte aligned exactly when ``size`` is a multiple of the vector width);
    ValueError if the plan is illegal."""
    from cupykern import _dtypes, launch

    overrides = {k: v for k, v in config.items() if k in _ACTIVATION_KEYS and v is not None}
    plan = launch.plan_activation(num_tokens, size, dtype, aligned=size % _dtypes.vec_width(dtype) == 0,
                                  limits=limits, **overrides)
    return overrides, plan


def _row_plan(op: str, num_tokens: int, size: int, dtype, config: dict, limits):
    """``(overrides, plan)`` for a row op on the registry's inputs (fresh contiguous arrays:
    16-byte aligned exactly when ``size`` is a multiple of the vector width).

    ``block_size`` maps to ``rows_per_block = block_size / threads_per_row``, where
    threads_per_row is the ``--threads-per-row`` value of the config if given, else the
    one the op picks for this row size (tuned or heuristic); the layout is then pinned
    to that one. ValueError if the block size is not a multiple of it, or the plan is
    illegal.
    """
    from cupykern import _dtypes, launch

    aligned = size % _dtypes.vec_width(dtype) == 0
    overrides = {k: v for k, v in config.items() if k != "block_size" and v is not None}
    block_size = config.get("block_size")
    if block_size is not None:
        base = launch.plan_rows(num_tokens, size, dtype, aligned=aligned, limits=limits, op=op,
                                **{k: v for k, v in overrides.items() if k in _LAYOUT_KEYS})
        threads = base.layout.threads_per_row
        if block_size % threads:
            raise ValueError(f"block size {block_size} is not a multiple of threads_per_row {threads}")
        overrides.update(threads_per_row=threads, vec_width=base.layout.vec_width,
                         vecs_per_thread=base.layout.vecs_per_thread, rows_per_block=block_size // threads)
    plan = launch.plan_rows(num_tokens, size, dtype, aligned=aligned, limits=limits, op=op, **overrides)
    return overrides, plan


def _row_configs(op: str, size: int, dtype, options: dict, tune: bool) -> list[dict]:
    """Launch configurations to try for a row op: the crossed options, or with ``--tune``
    and no layout option, the default search space (tuning.candidate_configs) plus the
    op's own choice."""
    from cupykern import _dtypes, launch, tuning

    if tune and not any(options.values()):
        aligned = size % _dtypes.vec_width(dtype) == 0
        heuristic = launch.row_layout(size, dtype, aligned)
        vecs = (heuristic.vecs_per_thread,) if op in ONE_PASS_OPS else launch.VECS_PER_THREAD_CHOICES
        return [{}] + tuning.candidate_configs(size, heuristic.vec_width, threads_choices=launch.THREADS_PER_ROW_CHOICES,
                                               vecs_choices=vecs, min_block=launch.MIN_BLOCK_SIZE,
                                               max_block_of=launch.max_block_size, warp_size=launch.WARP_SIZE)
    return _crossed(options)


def _crossed(options: dict) -> list[dict]:
    """Every combination of the option lists (an unset option: None, the op's choice)."""
    lists = {k: v or [None] for k, v in options.items()}
    return [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]


def _plan_fields(plan) -> dict:
    """The launch plan's fields of a sweep point (None where the kind of plan has none)."""
    from cupykern import launch

    fields = dict.fromkeys(("threads_per_row", "vec_width", "vecs_per_thread", "rows_per_block", "block_size",
                            "origin"))
    if isinstance(plan, launch.LaunchPlan):
        layout = plan.layout
        fields.update(threads_per_row=layout.threads_per_row, vec_width=layout.vec_width,
                      vecs_per_thread=layout.vecs_per_thread, rows_per_block=plan.rows_per_block)
    elif isinstance(plan, launch.ActivationPlan):
        fields.update(vec_width=plan.vec_width)
    if plan is not None:
        fields.update(block_size=plan.block_size, origin=plan.origin)
    return fields


@main.command()
@click.argument("ops", nargs=-1)
@click.option("--model", "model", callback=_model, default="llama-3.1-8b", show_default=True,
              help="model preset giving each op's row size and constants (see `cupykern models`)")
@click.option("--num-tokens", callback=_positive_int_list, default=",".join(map(str, NUM_TOKENS_LADDER)),
              show_default=True)
@click.option("--hidden-size", "sizes", callback=_positive_int_list, default=None,
              help="row sizes overriding the model's: hidden_size (norms, softmax, row_reduce), d (activations), "
                   "head_dim (RoPE)")
@click.option("--dtype", "dtypes", callback=_dtype_list, default="bf16", show_default=True)
@click.option("--block-size", callback=_block_size_list, default=None,
              help="row kernels: threads per block = threads_per_row x rows_per_block (rows_per_block = "
                   "block size / threads_per_row; threads_per_row from --threads-per-row, else the op's own); "
                   "activations: threads per block")
@click.option("--threads-per-row", callback=_choice_list((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                                                         "threads per row"),
              default=None, help="row kernels: threads sharing a row")
@click.option("--vec-width", callback=_choice_list((1, 2, 4, 8), "vector widths"), default=None,
              help="row kernels and activations: elements per access, 1 or 16 bytes' worth (8 for fp16/bf16, "
                   "4 for fp32)")
@click.option("--vecs-per-thread", callback=_choice_list((1, 2, 4, 8), "vecs per thread"), default=None,
              help="row kernels: register cache per thread")
@click.option("--rows-per-block", callback=_pow2_list, default=None, help="row kernels: rows per block")
@click.option("--repeat", type=click.IntRange(min=1), default=None,
              help="timed samples per point (cold-L2 calls, or graph replays for decode sizes) [default: 50 / 20]")
@click.option("--seed", default=20261129, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--tune", is_flag=True,
              help="row kernels: keep the fastest validated layout over the num_tokens list in the tuned file "
                   "(see `cupykern tune`)")
def sweep(ops, model, num_tokens, sizes, dtypes, block_size, threads_per_row, vec_width, vecs_per_thread,
          rows_per_block, repeat, seed, json_path, csv_path, tune):
    """Validate and time OPS (default: all) over token counts, dtypes and launch configurations.

    Row sizes and op constants come from --model (default llama-3.1-8b) unless
    --hidden-size is given. The layout options are crossed; they apply to the row
    kernels (norms, softmax, row_reduce) and, --block-size and --vec-width, to the
    activations.
    """
    from cupykern import _dtypes, environment, launch, measure, timing, tuning
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
    row_ops = [op for op in chosen if specs[op].family in ROW_FAMILIES]
    if tune and not row_ops:
        raise click.UsageError(f"--tune tunes the row kernels ({', '.join(o for o in specs if specs[o].family in ROW_FAMILIES)}); "
                               "none was chosen")
    if not environment.gpu_available():
        console.print("[red]No CUDA GPU is visible: sweep times kernels and needs one.[/] "
                      "Run `cupykern check` to compile every kernel without a GPU.")
        sys.exit(2)

    limits = launch.DeviceLimits.of_device()
    options = dict(threads_per_row=threads_per_row, vec_width=vec_width, vecs_per_thread=vecs_per_thread,
                   rows_per_block=rows_per_block, block_size=block_size)
    points = []
    for op in chosen:
        for dtype in dtypes:
            for size in op_sizes[op]:
                if op in row_ops:
                    configs = _row_configs(op, size, dtype, options, tune)
                elif specs[op].family == "activation":
                    configs = _crossed({k: options[k] for k in _ACTIVATION_KEYS})
                else:
                    configs = [None]
                points += [(op, dtype, size, n, config) for config in configs for n in num_tokens]
    env = environment.describe()
    copy_gbps = timing.copy_bandwidth()
    rows, failures, measured = [], 0, {}
    with tuning.suspended() if tune else contextlib.nullcontext(), Progress(console=console) as progress:
        task = progress.add_task(f"sweep ({model.name})", total=len(points))
        for op, dtype, size, n, config in points:
            progress.advance(task)
            plan, overrides = None, {}
            try:
                if op in row_ops:
                    overrides, plan = _row_plan(op, n, size, dtype, config, limits)
                elif config is not None:
                    overrides, plan = _activation_plan(n, size, dtype, config, limits)
                with launch.overrides(**overrides):
                    point = measure.measure(specs[op].for_model(model), n, size, dtype, seed=seed,
                                            copy_gbps=copy_gbps, repeat=repeat)
            except ValueError as exc:  # an illegal launch configuration for this shape
                if not tune:
                    console.print(f"[yellow]skipped {op} {n}x{size} {_dtypes.short_name(dtype)} {config}: {exc}[/]")
                continue
            row = {**point.as_dict(), "model": model.name, **_plan_fields(plan)}
            rows.append(row)
            failures += not point.check_ok
            if tune and op in row_ops and point.check_ok:
                measured.setdefault((op, _dtypes.short_name(dtype), size), []).append(tuning.Measured(
                    row["threads_per_row"], row["vec_width"], row["vecs_per_thread"], row["rows_per_block"], n,
                    point.median_us))
            if json_path:  # written as it goes, so an interrupted sweep keeps its points
                _write_json(json_path, env, seed, copy_gbps, rows)
    if not rows:
        console.print("[red]Every point was skipped: no launch configuration given was legal for these shapes.[/]")
        sys.exit(2)
    _print_sweep(rows, model, copy_gbps, seed, tune)
    if json_path:
        _write_json(json_path, env, seed, copy_gbps, rows)
    if csv_path and rows:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if tune:
        _save_tuned(measured, num_tokens, limits.name, env)
    sys.exit(1 if failures else 0)


def _plan_text(row: dict) -> str:
    if row["block_size"] is None:
        return "-"
    if row["threads_per_row"] is None:  # activation: block size x vector width
        return f"b{row['block_size']} x{row['vec_width']} {row['origin']}"
    return (f"{row['threads_per_row']}x{row['vec_width']}x{row['vecs_per_thread']} "
            f"r{row['rows_per_block']} {row['origin']}")


def _print_sweep(rows: list, model, copy_gbps: float, seed: int, tune: bool) -> None:
    if tune:  # every candidate would be a row: show the fastest per point instead
        best: dict = {}
        for row in rows:
            key = (row["op"], row["dtype"], row["size"], row["num_tokens"])
            if row["check_ok"] and (key not in best or row["median_us"] < best[key]["median_us"]):
                best[key] = row
        rows = list(best.values())
    title = f"sweep {model.name}: copy {copy_gbps:.0f} GB/s (same run), seed {seed}" + (
        " (fastest validated configuration per point)" if tune else "")
    table = Table(title=title)
    columns = ("op", "dtype", "size", "num_tokens", "plan", "median_us", "gbps", "pct_of_copy", "method", "check")
    for column in columns:
        table.add_column(column)
    for row in rows:
        cells = []
        for column in columns:
            if column == "plan":
                value = _plan_text(row)
            elif column == "check":
                value = "[green]ok[/]" if row["check_ok"] else f"[red]{row['check']}[/]"
            else:
                value = row[column]
                if isinstance(value, float):
                    value = f"{value:.2f}" if column == "median_us" else f"{value:.1f}"
            cells.append(str(value))
        table.add_row(*cells)
    Console(width=max(console.width, 160)).print(table)


def _save_tuned(measured: dict, ladder, gpu: str, env: dict) -> None:
    from cupykern import tuning

    entries = []
    for (op, dtype, size), ms in measured.items():
        entry = tuning.choose(ms, ladder, gpu=gpu, op=op, dtype=dtype, size=size, commit=str(env.get("commit", "")),
                              date=str(env.get("date", "")))
        if entry is None:
            console.print(f"[yellow]{op} {dtype} {size}: no layout validated at every num_tokens; nothing stored[/]")
        else:
            entries.append(entry)
    if not entries:
        return
    path = tuning.save(entries)
    _print_tuned(entries, f"tuned on {gpu}, saved to {path}")


def _print_tuned(entries, title: str) -> None:
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("gpu", "op", "dtype", "size", "threads x vec x cache", "rows_per_block by num_tokens", "score",
                   "commit"):
        table.add_column(column, no_wrap=True)
    for e in entries:
        table.add_row(e.gpu, e.op, e.dtype, str(e.size), f"{e.threads_per_row} x {e.vec_width} x {e.vecs_per_thread}",
                      " ".join(f"{n}:{r}" for n, r in e.rows_per_block), f"{e.score:.3f}", e.commit)
    Console(width=max(console.width, 160)).print(table)


def _write_json(path: Path, env: dict, seed: int, copy_gbps: float, rows: list) -> None:
    path.write_text(json.dumps({"environment": env, "seed": seed, "copy_gbps": copy_gbps, "points": rows}, indent=1))


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

    The file is $CUPYKERN_TUNE_FILE if set, else $XDG_CACHE_HOME/cupykern/tuned.json
    (~/.cache/cupykern/tuned.json).
    """
    from cupykern import tuning

    if show and clear:
        raise click.UsageError("give --show or --clear, not both")
    path = tuning.path()
    if clear:
        removed = tuning.clear()
        click.echo(f"removed {path}" if removed else f"nothing to remove: {path} does not exist")
        return
    if not path.exists():
        if as_json:  # still JSON, for scripts: the file's format with no entries
            click.echo(json.dumps({"format": tuning.FORMAT, "entries": []}))
        else:
            click.echo(f"no tuned configurations: {path} does not exist (run `cupykern sweep --tune`)")
        return
    if as_json:
        click.echo(path.read_text())
        return
    entries = list(tuning.load(path).values())
    _print_tuned(entries, f"{path}: {len(entries)} tuned configuration(s)")


# ----------------------------------------------------------------- llm commands
# The real-model commands (`generate`, `fetch-model`) live with the pipeline in cupykern/llm/.
from cupykern.llm.cli import COMMANDS as _LLM_COMMANDS  # noqa: E402

for _command in _LLM_COMMANDS:
    main.add_command(_command)


if __name__ == "__main__":
    main()
