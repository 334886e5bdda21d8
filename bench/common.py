"""What the bench scripts share: the plain-CuPy baselines, the case runner, the results
table, the result file and the command line.

A case is (op name, num_tokens, size, dtype). Each is measured by the sweep engine
(cupykern/sweep.py: checked against the float64 reference, then timed, graph replay
for decode sizes and cold-L2 events otherwise), beside the plain-CuPy composition of
the same math where there is one (:data:`COMPOSITIONS`), and beside a device-to-device
copy measured at the start of the same run. Results use the engine's one schema
(``sweep.result_document``) and go to bench/results/ (and ``--out``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cupykern import _dtypes, compositions, environment, models, sweep, timing  # noqa: E402
from cupykern import cli  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_SEED = 20261129
#: click context settings of the bench scripts: -h as well as --help, as the cupykern CLI
#: (bench/sass.py spells them out: it imports no bench module).
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


# ----------------------------------------------------------------- baselines on registry inputs
def _qk_rms_norm_then_apply_rope(i: dict) -> tuple:
    """The unfused split of qk_rms_norm_rope: cupykern.rms_norm per head in place, then
    cupykern.apply_rope (two of cupykern's own launches instead of one)."""
    from cupykern import apply_rope, rms_norm

    rms_norm(i["q"], i["q_weight"], i["eps"], out=i["q"])
    rms_norm(i["k"], i["k_weight"], i["eps"], out=i["k"])
    return apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False)


#: op name -> baseline taking the op's registry inputs (cupykern/registry) and returning
#: the op's outputs as a tuple, like ``OpSpec.run``: the plain-CuPy compositions of
#: cupykern/compositions.py, and for qk_rms_norm_rope the unfused split.
COMPOSITIONS = {
    "rms_norm": lambda i: (compositions.rms_norm(i["x"], i["weight"], i["eps"],
                                                 weight_offset=i.get("weight_offset", 0.0), out=i.get("out")),),
    "fused_add_rms_norm": lambda i: compositions.fused_add_rms_norm(i["x"], i["residual"], i["weight"], i["eps"],
                                                                    weight_offset=i.get("weight_offset", 0.0)),
    "layer_norm": lambda i: (compositions.layer_norm(i["x"], i["weight"], i["bias"], i["eps"], out=i.get("out")),),
    "softmax": lambda i: (compositions.softmax(i["x"], out=i.get("out")),),
    "silu_and_mul": lambda i: (compositions.silu_and_mul(i["x"], out=i.get("out")),),
    "apply_rope": lambda i: compositions.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], is_neox=True),
    "qk_rms_norm_rope": _qk_rms_norm_then_apply_rope,
}

#: How each baseline is labelled in tables (default: "cupy composition").
LABELS = {"qk_rms_norm_rope": "rms_norm then apply_rope"}
COMPOSITION_LABEL = "cupy composition"


# ----------------------------------------------------------------- running cases
def run_cases(name: str, cases, *, seed: int = DEFAULT_SEED, out_dir: Path | None = None,
              baselines=COMPOSITIONS) -> dict:
    """Measures every case through cupykern and its baseline (if any); prints the table,
    saves the result file (:func:`save`) and returns its content."""
    console = Console(width=180)
    specs = all_specs()
    env = environment.describe()
    copy_gbps = timing.copy_bandwidth()
    console.print(f"[bold]{name}[/] on {env.get('gpu')}: device-to-device copy {copy_gbps:.0f} GB/s (same run)")
    points = []
    for op, num_tokens, size, dtype in cases:
        impls = [("cupykern", None)]
        if op in baselines:
            impls.append((LABELS.get(op, COMPOSITION_LABEL), baselines[op]))
        for impl, run in impls:
            point = sweep.measure(specs[op], num_tokens, size, dtype, seed=seed, copy_gbps=copy_gbps, impl=impl,
                                  run=run)
            points.append(point)
            if not point.check_ok:
                console.print(f"[red]CHECK FAILED[/] {op} {impl} {num_tokens}x{size} {dtype}: {point.check}")
    result = sweep.result_document(name, environment=env, seed=seed, copy_gbps=copy_gbps, points=points)
    print_table(console, result)
    console.print(f"saved {save(result, out_dir)}")
    return result


def _bytes_text(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 \
        else str(n)


def print_table(console: Console, result: dict) -> None:
    """The result's points as a rich table."""
    table = Table(title=f"{result['suite']}: copy {result['copy_gbps']:.0f} GB/s, seed {result['seed']}")
    columns = ("op", "impl", "tokens", "size", "dtype", "median us", "GB/s", "% copy", "timing", "max ulp", "alloc",
               "check")
    for column in columns:
        table.add_column(column, justify="left" if column in ("op", "impl", "timing", "check") else "right")
    for p in result["points"]:
        check = "[green]ok[/]" if p["check_ok"] else f"[red]{p['check']}[/]"
        ulp = "-" if p["max_ulp_err"] is None else f"{p['max_ulp_err']:.1f}"
        table.add_row(p["op"], p["impl"], str(p["num_tokens"]), str(p["size"]), p["dtype"], f"{p['median_us']:.2f}",
                      f"{p['gbps']:.0f}", f"{p['pct_of_copy']:.1f}", p["method"], ulp, _bytes_text(p["alloc_bytes"]),
                      check)
    console.print(table)


def save(result: dict, out_dir: Path | None) -> Path:
    """Writes ``result`` to bench/results/<date>_<suite>_<gpu>_<commit>.json (and into
    ``out_dir`` if given); returns the bench/results path."""
    env = result["environment"]
    gpu = str(env.get("gpu", "nogpu")).replace(" ", "-")
    name = f"{env['date'][:10]}_{result['suite']}_{gpu}_{env['commit']}.json"
    for folder in {RESULTS_DIR, *([out_dir] if out_dir else [])}:
        folder.mkdir(parents=True, exist_ok=True)
        sweep.write_json(folder / name, result)
    return RESULTS_DIR / name


def exit_code(result: dict) -> int:
    """0 if every cupykern point passed its float64 check, else 1. A baseline that fails
    (the unfused "rms_norm then apply_rope" rounds twice) is reported, not failed on."""
    return 0 if all(p["check_ok"] for p in result["points"] if p["impl"] == "cupykern") else 1


# ----------------------------------------------------------------- command line
#: click callback of the bench scripts' --num-tokens: cupykern sweep's (ASCII integers
#: from 1 to 2**31 - 1, each once; helper 76: int() took "1_6" and full-width digits).
positive_int_list = cli.positive_int_list


def positive_int(ctx, param, value):
    """click callback: an integer >= 1 (None stays None)."""
    if value is not None and value < 1:
        raise click.BadParameter(f"expected an integer >= 1, got {value!r}")
    return value


def dtype_option(ctx, param, value):
    """click callback: a supported dtype from its name (bf16, fp16, fp32, ...)."""
    try:
        return _dtypes.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def dtype_list(ctx, param, value):
    """click callback: supported dtypes from comma-separated names (bf16,fp32)."""
    try:
        return [_dtypes.parse(name.strip()) for name in value.split(",")]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def model_names(ctx, param, value):
    """click callback: model names (``--model`` repeated, or ``--models`` comma-separated)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    names = [v.strip().lower() for item in items for v in item.split(",") if v.strip()]
    if items and not names:  # helper 76: "--models ' , '" reached the run as None
        raise click.BadParameter(f"expected comma-separated model names; known: {', '.join(models.names())}; "
                                 f"got {value!r}")
    for name in names:
        if name not in models.names():
            raise click.BadParameter(f"unknown model {name!r}; known: {', '.join(models.names())}")
    return names or None


def require_gpu(script: str, what: str = "times kernels") -> None:
    """Exits 2 with "<script> <what> and needs a CUDA GPU" on stderr when none is visible."""
    problem = environment.gpu_problem()
    if problem:
        click.echo(f"{script} {what} and needs a CUDA GPU; none is visible ({problem}); "
                   "`cupykern check` compiles every kernel without one", err=True)
        sys.exit(2)


def command(name: str, description: str, cases, quick_cases=None) -> click.Command:
    """The command line of a bench script: ``[--out DIR] [--seed S]``, and ``[--quick]``
    given ``quick_cases``; runs the cases and exits 1 on a failed check of cupykern's, 2
    without a GPU."""
    cases, quick_cases = list(cases), None if quick_cases is None else list(quick_cases)

    def bench(out, seed, quick=False):
        require_gpu(f"the {name} bench")
        sys.exit(exit_code(run_cases(name, quick_cases if quick else cases, seed=seed, out_dir=out)))

    if quick_cases is not None:
        bench = click.option("--quick", is_flag=True, help="the smaller case list")(bench)
    bench = click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True,
                         help="seed of the inputs")(bench)
    bench = click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
                         help="also write the JSON here")(bench)
    return click.command(help=description, context_settings=HELP_OPTIONS)(bench)


def main(name: str, description: str, cases, quick_cases=None) -> None:
    """Runs :func:`command` on the script's arguments (click: usage errors exit 2)."""
    command(name, description, cases, quick_cases)(prog_name=Path(sys.argv[0]).name)
