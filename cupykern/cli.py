"""The ``cupykern`` command: info, check, sweep.

A thin click layer over registry (ops, inputs, references), launch (overrides),
validation and measure (check then time); rich prints the tables.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

console = Console()

NUM_TOKENS_LADDER = (1, 16, 64, 256, 1024, 4096, 16384)


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return [int(v) for v in str(value).split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _dtype_list(ctx, param, value):
    from cupykern import _dtypes

    try:
        return [_dtypes.parse(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _gpu_available() -> bool:
    import cupy

    try:
        return cupy.cuda.is_available()
    except Exception:  # noqa: BLE001 - no driver, no GPU
        return False


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cupykern")
def main():
    """Fused LLM kernels on CuPy: inspect, check and sweep them."""


# ----------------------------------------------------------------- info
@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the environment as JSON")
def info(as_json):
    """GPU, versions and the kernel cache location (works without a GPU)."""
    from cupykern import environment

    env = environment.describe()
    env["kernel_cache_dir"] = os.environ.get("CUPY_CACHE_DIR", str(Path.home() / ".cupy" / "kernel_cache"))
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
    from cupykern import jit

    gpu = _gpu_available()
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
@main.command()
@click.argument("ops", nargs=-1)
@click.option("--num-tokens", callback=_int_list, default=",".join(map(str, NUM_TOKENS_LADDER)), show_default=True)
@click.option("--hidden-size", "sizes", callback=_int_list, default=None,
              help="row sizes: hidden_size (norms), d (activations), head_dim (RoPE); "
                   "default: each op's standard size (4096, 11008, 128)")
@click.option("--dtype", "dtypes", callback=_dtype_list, default="bf16", show_default=True)
@click.option("--threads-per-row", callback=_int_list, default=None, help="override: threads sharing a row")
@click.option("--vec-width", callback=_int_list, default=None, help="override: elements per access")
@click.option("--vecs-per-thread", callback=_int_list, default=None, help="override: register cache per thread")
@click.option("--rows-per-block", callback=_int_list, default=None, help="override: rows per block")
@click.option("--seed", default=20261129, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def sweep(ops, num_tokens, sizes, dtypes, threads_per_row, vec_width, vecs_per_thread, rows_per_block, seed,
          json_path, csv_path):
    """Validate and time OPS (default: all) over shapes and launch configurations."""
    from cupykern import _dtypes, environment, launch, measure, timing
    from cupykern.registry import all_specs

    specs = all_specs()
    unknown = [op for op in ops if op not in specs]
    if unknown:
        raise click.BadParameter(f"unknown op(s) {unknown}; known: {sorted(specs)}", param_hint="OPS")
    if not _gpu_available():
        console.print("[red]No CUDA GPU is visible: sweep times kernels and needs one.[/] "
                      "Run `cupykern check` to compile every kernel without a GPU.")
        sys.exit(2)
    choices = dict(threads_per_row=threads_per_row or [None], vec_width=vec_width or [None],
                   vecs_per_thread=vecs_per_thread or [None], rows_per_block=rows_per_block or [None])
    configs = [dict(zip(choices, combo)) for combo in itertools.product(*choices.values())]
    points = [(op, dtype, size, n, config) for op in (ops or list(specs)) for dtype in dtypes
              for size in (sizes or specs[op].check_sizes) for n in num_tokens for config in configs]
    copy_gbps = timing.copy_bandwidth()
    rows, failures = [], 0
    with Progress(console=console) as progress:
        task = progress.add_task("sweep", total=len(points))
        for op, dtype, size, n, config in points:
            try:
                with launch.overrides(**config):
                    point = measure.measure(specs[op], n, size, dtype, seed=seed, copy_gbps=copy_gbps)
            except ValueError as exc:  # an illegal launch configuration for this shape
                console.print(f"[yellow]skipped {op} {n}x{size} {_dtypes.short_name(dtype)} {config}: {exc}[/]")
                progress.advance(task)
                continue
            row = {**point.as_dict(), **{k: v for k, v in config.items()}}
            rows.append(row)
            failures += not point.check_ok
            progress.advance(task)
            if json_path:  # written as it goes, so an interrupted sweep keeps its points
                _write_json(json_path, environment.describe(), seed, copy_gbps, rows)
    table = Table(title=f"sweep: copy {copy_gbps:.0f} GB/s (same run), seed {seed}")
    columns = ("op", "dtype", "size", "num_tokens", *[k for k in choices if choices[k] != [None]],
               "median_us", "gbps", "pct_of_copy", "method", "check")
    for column in columns:
        table.add_column(column)
    for row in rows:
        cells = []
        for column in columns:
            value = row[column]
            if column == "check":
                value = "[green]ok[/]" if row["check_ok"] else f"[red]{value}[/]"
            elif isinstance(value, float):
                value = f"{value:.2f}" if column == "median_us" else f"{value:.1f}"
            cells.append(str(value))
        table.add_row(*cells)
    console.print(table)
    if json_path:
        _write_json(json_path, environment.describe(), seed, copy_gbps, rows)
    if csv_path and rows:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    sys.exit(1 if failures else 0)


def _write_json(path: Path, env: dict, seed: int, copy_gbps: float, rows: list) -> None:
    path.write_text(json.dumps({"environment": env, "seed": seed, "copy_gbps": copy_gbps, "points": rows}, indent=1))


if __name__ == "__main__":
    main()
