"""Peers: the sweep's ops and shapes through every other implementation importable here.

For each op of the registry, at the sweep's num_tokens ladder (1 to 16384) with the
row sizes and constants of a model preset (default llama-3.1-8b), bf16:

* cupykern itself and the plain-CuPy composition (bench/common.py's COMPOSITIONS over
  cupykern/compositions.py; always);
* PyTorch eager (fp32 math, one rounding, as the references), torch.compile of the
  same functions, torch.nn.functional.rms_norm, Liger-Kernel and FlashInfer, each only
  if importable (none is a dependency; torch is imported here only, guarded).

Every implementation's output is checked against the same float64 reference
(cupykern.validation on the registry's inputs, shared through DLPack without copies)
before it is timed the same way: CUDA-graph replay for decode sizes (torch peers
through torch.cuda.graph), cold-L2 CUDA events otherwise, on one stream. Every point
has the sweep engine's schema (cupykern/sweep.py): errors against the reference,
device memory one call allocates (torch peers: torch's allocator), and for cupykern
the plan it launched (None for peers). The table gives peer time / cupykern time
(> 1: cupykern is faster); the JSON goes to bench/results/ (and --out).

    python bench/peers.py [--model NAME] [--num-tokens 1,16,64,...] [--ops OP,...]
                          [--peers NAME,...] [--dtype bf16] [--repeat N] [--seed S] [--out DIR]
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (COMPOSITIONS, DEFAULT_SEED, dtype_option, positive_int, positive_int_list,  # noqa: E402
                          require_gpu, save)
from cupykern import _dtypes, environment, models, sweep, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402
from cupykern.validation import check_op  # noqa: E402

NUM_TOKENS = models.NUM_TOKENS_LADDER  # the default sweep's shapes
#: Calls per captured graph for torch peers (as cupykern.timing.time_graph).
OPS_PER_GRAPH = 100
#: Peer names in table order; "cupy composition" always runs.
PEER_NAMES = ("cupy composition", "torch eager", "torch.compile", "F.rms_norm", "liger", "flashinfer")


class Skip(Exception):
    """This peer has no implementation of this op (or not of this variant)."""


# ----------------------------------------------------------------- availability
def _importable(name: str) -> str | None:
    """None if ``name`` imports, else why not."""
    try:
        if importlib.util.find_spec(name) is None:
            return "not installed"
        importlib.import_module(name)
        return None
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not raised
        return f"import failed: {exc.__class__.__name__}: {exc}"


def availability() -> dict[str, str | None]:
    """Peer name -> None if it can run here, else the reason it is skipped."""
    torch_missing = _importable("torch")
    status = {"cupy composition": None, "torch eager": torch_missing}
    if torch_missing:
        status.update({name: f"needs torch ({torch_missing})" for name in PEER_NAMES[2:]})
        return status
    import torch

    if not torch.cuda.is_available():
        return {**status, **{name: "torch sees no CUDA device" for name in PEER_NAMES[1:]}}
    status["torch.compile"] = _importable("triton") and f"needs triton ({_importable('triton')})"
    status["F.rms_norm"] = None if hasattr(torch.nn.functional, "rms_norm") else "torch too old (no F.rms_norm)"
    status["liger"] = _importable("liger_kernel")
    status["flashinfer"] = _importable("flashinfer")
    return status


# ----------------------------------------------------------------- torch implementations
def _torch_ops(torch):
    """op -> f(t) on a dict of torch tensors (and the registry's scalars), returning the
    op's outputs; fp32 math and one rounding to the storage dtype, like the references."""
    F = torch.nn.functional

    def rms(xf, w, eps, offset):
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (w.float() + offset)

    def rms_norm(t):
        return (rms(t["x"].float(), t["weight"], t["eps"], t.get("weight_offset", 0.0)).to(t["x"].dtype),)

    def fused_add_rms_norm(t):
        x, r = t["x"], t["residual"]
        r.copy_(x.float() + r.float())
        x.copy_(rms(r.float(), t["weight"], t["eps"], t.get("weight_offset", 0.0)))
        return x, r

    def layer_norm(t):
        x = t["x"]
        return (F.layer_norm(x.float(), (x.shape[-1],), t["weight"].float(), t["bias"].float(), t["eps"]).to(x.dtype),)

    def softmax(t):
        return (torch.softmax(t["x"].float(), dim=-1),)

    def row_reduce(t):
        if t["op"] != "sum":
            raise Skip(f"row_reduce {t['op']}")
        return (t["x"].float().sum(-1),)

    def gated(act):
        def f(t):
            x = t["x"]
            d = x.shape[-1] // 2
            return ((act(t, x[..., :d].float()) * x[..., d:].float()).to(x.dtype),)
        return f

    def rotate(t, heads):
        cache = t["cos_sin_cache"]
        half = cache.shape[1] // 2
        rows = cache[t["positions"]]
        cos, sin = rows[:, None, :half], rows[:, None, half:]
        for x, xf, normalised in heads:
            x1, x2 = xf[..., :half], xf[..., half:2 * half]
            o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
            x[..., :half] = o1.to(x.dtype)
            x[..., half:2 * half] = o2.to(x.dtype)
            if normalised and xf.shape[-1] > 2 * half:  # normalised pass-through dims
                x[..., 2 * half:] = xf[..., 2 * half:].to(x.dtype)
        return t["q"], t["k"]

    def apply_rope(t):
        return rotate(t, [(t["q"], t["q"].float(), False), (t["k"], t["k"].float(), False)])

    def qk_rms_norm_rope(t):
        q, k = t["q"], t["k"]
        return rotate(t, [(q, rms(q.float(), t["q_weight"], t["eps"], 0.0), True),
                          (k, rms(k.float(), t["k_weight"], t["eps"], 0.0), True)])

    return {
        "rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm, "layer_norm": layer_norm,
        "softmax": softmax, "row_reduce": row_reduce,
        "silu_and_mul": gated(lambda t, g: F.silu(g)),
        "gelu_and_mul": gated(lambda t, g: F.gelu(g, approximate=t.get("approximate", "none"))),
        "apply_rope": apply_rope, "qk_rms_norm_rope": qk_rms_norm_rope,
    }


def _f_rms_norm(torch):
    def rms_norm(t):
        x = t["x"]
        w = t["weight"] if not t.get("weight_offset") else (t["weight"].float() + t["weight_offset"]).to(x.dtype)
        return (torch.nn.functional.rms_norm(x, (x.shape[-1],), weight=w, eps=t["eps"]),)
    return {"rms_norm": rms_norm}


def _liger(torch):
    from liger_kernel.ops.geglu import LigerGELUMulFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    def rms_norm(t):  # casting_mode "gemma": all in fp32, one rounding (as the reference)
        return (LigerRMSNormFunction.apply(t["x"], t["weight"], t["eps"], t.get("weight_offset", 0.0), "gemma"),)

    def halves(x):
        d = x.shape[-1] // 2
        return x[..., :d], x[..., d:]

    def silu_and_mul(t):
        return (LigerSiLUMulFunction.apply(*halves(t["x"])),)

    def gelu_and_mul(t):
        if t.get("approximate", "none") != "tanh":
            raise Skip("Liger's GEGLU is the tanh approximation only")
        return (LigerGELUMulFunction.apply(*halves(t["x"])),)

    def gather_cos_sin(t):  # per-token cos/sin at full head width, before (outside) the timed calls
        q, cache = t["q"], t["cos_sin_cache"]
        half = cache.shape[1] // 2
        if 2 * half != q.shape[-1]:
            raise Skip("Liger rope rotates whole heads only")
        rows = cache[t["positions"]]
        t["_cos"] = torch.cat([rows[:, :half]] * 2, -1).to(q.dtype)[None]
        t["_sin"] = torch.cat([rows[:, half:]] * 2, -1).to(q.dtype)[None]

    def apply_rope(t):
        q, k = t["q"], t["k"]
        tokens, head_dim = q.shape[0], q.shape[-1]
        q_out, k_out = LigerRopeFunction.apply(q.view(1, tokens, -1, head_dim).transpose(1, 2),
                                               k.view(1, tokens, -1, head_dim).transpose(1, 2), t["_cos"], t["_sin"])
        return q_out.transpose(1, 2).reshape(q.shape), k_out.transpose(1, 2).reshape(k.shape)

    apply_rope.setup = gather_cos_sin

    return {"rms_norm": rms_norm, "silu_and_mul": silu_and_mul, "gelu_and_mul": gelu_and_mul,
            "apply_rope": apply_rope}


def _flashinfer(torch):
    import flashinfer

    def rms_norm(t):
        if t.get("weight_offset") == 1.0:
            return (flashinfer.norm.gemma_rmsnorm(t["x"], t["weight"], t["eps"]),)
        if t.get("weight_offset"):
            raise Skip("weight offset other than 0 or 1")
        return (flashinfer.norm.rmsnorm(t["x"], t["weight"], t["eps"]),)

    def fused_add_rms_norm(t):
        if t.get("weight_offset") == 1.0:
            flashinfer.norm.gemma_fused_add_rmsnorm(t["x"], t["residual"], t["weight"], t["eps"])
        elif t.get("weight_offset"):
            raise Skip("weight offset other than 0 or 1")
        else:
            flashinfer.norm.fused_add_rmsnorm(t["x"], t["residual"], t["weight"], t["eps"])
        return t["x"], t["residual"]

    def gelu_and_mul(t):
        approx = t.get("approximate", "none")
        f = flashinfer.activation.gelu_tanh_and_mul if approx == "tanh" else flashinfer.activation.gelu_and_mul
        return (f(t["x"]),)

    def apply_rope(t):
        q, k = t["q"], t["k"]
        head_dim = q.shape[-1]
        flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
            t["positions"], q.view(q.shape[0], -1), k.view(k.shape[0], -1), head_dim, t["cos_sin_cache"], is_neox=True)
        return q, k

    return {"rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm,
            "silu_and_mul": lambda t: (flashinfer.activation.silu_and_mul(t["x"]),),
            "gelu_and_mul": gelu_and_mul, "apply_rope": apply_rope}


def _torch_compile(torch):
    # dynamic=None (the default): the first shape compiles static, a second one
    # recompiles with a dynamic num_tokens, so each op compiles about twice rather than
    # once per shape (dynamic=False took minutes per op over the token ladder).
    ops = _torch_ops(torch)
    return {op: torch.compile(f) for op, f in ops.items()}


BUILDERS = {"torch eager": _torch_ops, "torch.compile": _torch_compile, "F.rms_norm": _f_rms_norm,
            "liger": _liger, "flashinfer": _flashinfer}


def _prepare(torch, impl, inputs: dict):
    """A zero-argument callable running ``impl`` on torch views of ``inputs`` (no copies)."""
    import cupy

    t = {k: torch.from_dlpack(v) if isinstance(v, cupy.ndarray) else v for k, v in inputs.items() if k != "out"}
    setup = getattr(impl, "setup", None)
    if setup is not None:  # untimed preparation (Liger's rope: gather cos/sin)
        setup(t)
    return lambda: impl(t)


# ----------------------------------------------------------------- timing torch peers
def _torch_graph_time(torch, fn, replays: int) -> timing.Timing:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(OPS_PER_GRAPH):
            fn()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / OPS_PER_GRAPH)
    return timing.Timing.of(samples, "graph replay")


def measure_torch(torch, name: str, impl, spec, num_tokens: int, size: int, dtype, *, seed: int,
                  copy_gbps: float, repeat: int | None, model=None) -> sweep.Point:
    """Checks ``impl`` against the float64 reference on the registry's inputs, then times it
    (on CuPy's current stream, which must also be torch's). The point has no plan fields;
    its alloc_bytes count torch's allocator."""
    import cupy

    bound = spec.for_model(model)
    inputs = bound.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    if "out" in inputs:
        inputs["out"] = None
    fn = _prepare(torch, impl, inputs)
    checked = check_op(bound.with_run(lambda i: tuple(cupy.from_dlpack(o.detach()) for o in fn())),
                       num_tokens, size, dtype, seed, inputs=inputs)
    allocated = sweep.alloc_bytes(fn, bytes_in_use=torch.cuda.memory_allocated)
    if num_tokens <= sweep.DECODE_MAX_TOKENS:
        t = _torch_graph_time(torch, fn, repeat or 20)
    else:
        t = timing.time_cold(fn) if repeat is None else timing.time_cold(fn, repeat=repeat)
    return sweep.make_point(bound, impl=name, model=getattr(model, "name", None), num_tokens=num_tokens, size=size,
                            dtype=dtype, timed=t, checked=checked, min_bytes=bound.min_bytes(inputs),
                            copy_gbps=copy_gbps, alloc_bytes=allocated)


# ----------------------------------------------------------------- the run
def ratio_rows(points: list[dict], peers) -> list[dict]:
    """One row per (op, num_tokens): cupykern's time and, per peer, peer time / cupykern
    time (None where the peer did not run; the check status alongside)."""
    by_key: dict = {}
    for p in points:
        by_key.setdefault((p["op"], p["num_tokens"], p["size"]), {})[p["impl"]] = p
    rows = []
    for (op, n, size), impls in by_key.items():
        own = impls.get("cupykern")
        row = {"op": op, "num_tokens": n, "size": size,
               "cupykern_us": own["median_us"] if own else None, "cupykern_ok": bool(own and own["check_ok"])}
        for peer in peers:
            p = impls.get(peer)
            row[peer] = None if p is None or not own else (p["median_us"] / own["median_us"], p["check_ok"])
        rows.append(row)
    return rows


def print_ratios(console: Console, rows: list[dict], peers, title: str) -> None:
    """:func:`ratio_rows` as a rich table: green where cupykern is faster, red where not."""
    table = Table(title=title)
    for column in ("op", "tokens", "size", "cupykern us", *peers):
        table.add_column(column, justify="left" if column == "op" else "right")
    for row in rows:
        cells = [row["op"], str(row["num_tokens"]), str(row["size"]),
                 "-" if row["cupykern_us"] is None else f"{row['cupykern_us']:.2f}" + ("" if row["cupykern_ok"]
                                                                                       else " [red]x[/]")]
        for peer in peers:
            value = row[peer]
            if value is None:
                cells.append("-")
            else:
                ratio, ok = value
                color = "green" if ratio >= 1 else "red"
                cells.append(f"[{color}]{ratio:.2f}[/]" + ("" if ok else " [red](wrong)[/]"))
        table.add_row(*cells)
    console.print(table)


def run(model_name: str, num_tokens, ops, peers, *, seed: int, repeat: int | None, dtype="bf16",
        out_dir: Path | None = None) -> dict:
    """Measures ``ops`` at each of ``num_tokens`` through cupykern and each of ``peers``
    that can run here (the others are listed as skipped); prints the ratio table, saves
    the result file after every op and returns its content."""
    import cupy

    console = Console(width=160)
    model = models.get(model_name)
    specs = all_specs()
    dtype = _dtypes.parse(dtype)
    status = availability()
    chosen_peers = [p for p in PEER_NAMES if p in peers]
    skipped = {p: status[p] for p in chosen_peers if status[p]}
    running = [p for p in chosen_peers if not status[p]]
    torch = None
    impls: dict = {}
    if any(p in BUILDERS for p in running):
        import torch as torch_module

        torch = torch_module
        for p in [p for p in running if p in BUILDERS]:
            try:
                impls[p] = BUILDERS[p](torch)
            except Exception as exc:  # noqa: BLE001 - e.g. an API this version lacks
                skipped[p] = f"setup failed: {exc.__class__.__name__}: {exc}"
                running.remove(p)
    env = environment.describe()
    copy_gbps = timing.copy_bandwidth()
    console.print(f"[bold]peers[/] on {env.get('gpu')}, model {model.name}, {_dtypes.short_name(dtype)}: "
                  f"copy {copy_gbps:.0f} GB/s (same run)")
    for p, why in skipped.items():
        console.print(f"[yellow]skipped {p}: {why}[/]")
    points, errors = [], []

    def document():
        return sweep.result_document("peers", environment=env, seed=seed, copy_gbps=copy_gbps, model=model.name,
                                     points=points, peers_run=running, skipped=skipped, errors=errors)

    stream = cupy.cuda.Stream(non_blocking=True)
    for op in ops:
        spec = specs[op]
        size = spec.size_for_model(model)
        for n in num_tokens:
            for name in ["cupykern", *running]:
                try:
                    with stream:
                        if name == "cupykern":
                            point = sweep.measure(spec, n, size, dtype, seed=seed, copy_gbps=copy_gbps, model=model,
                                                  repeat=repeat)
                        elif name == "cupy composition":
                            if op not in COMPOSITIONS:
                                continue
                            point = sweep.measure(spec, n, size, dtype, seed=seed, copy_gbps=copy_gbps, model=model,
                                                  impl=name, run=COMPOSITIONS[op], repeat=repeat)
                        else:
                            if op not in impls[name]:
                                continue
                            with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
                                point = measure_torch(torch, name, impls[name][op], spec, n, size, dtype, seed=seed,
                                                      copy_gbps=copy_gbps, repeat=repeat, model=model)
                    stream.synchronize()
                except Skip as why:
                    errors.append({"op": op, "num_tokens": n, "impl": name, "skipped": str(why)})
                    continue
                except Exception as exc:  # noqa: BLE001 - one failing peer must not end the run
                    stream.synchronize()
                    errors.append({"op": op, "num_tokens": n, "impl": name,
                                   "error": f"{exc.__class__.__name__}: {exc}",
                                   "traceback": traceback.format_exc(limit=3)})
                    console.print(f"[red]{name} {op} {n}: {exc.__class__.__name__}: {exc}[/]")
                    continue
                points.append(point.as_dict())
                if not point.check_ok:
                    console.print(f"[red]CHECK FAILED[/] {op} {name} {n}x{size}: {point.check}")
        save(document(), out_dir)  # after every op, so a run cut short keeps what it measured
    print_ratios(console, ratio_rows(points, running), running,
                 f"peer time / cupykern time (> 1: cupykern faster), {model.name}, {_dtypes.short_name(dtype)}")
    result = document()
    console.print(f"saved {save(result, out_dir)}")
    return result


def _name_list(known, what: str):
    """click callback: comma-separated names, each one of ``known`` (None: all of them)."""
    def callback(ctx, param, value):
        if value is None:
            return list(known)
        names = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in names if v not in known]
        if bad or not names:
            raise click.BadParameter(f"unknown {what} {bad or value!r}; known: {', '.join(known)}")
        return names
    return callback


def _model_name(ctx, param, value):
    if value not in models.names():
        raise click.BadParameter(f"unknown model {value!r}; known: {', '.join(models.names())}")
    return value


@click.command(help=__doc__.splitlines()[0], context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", default=models.DEFAULT_MODEL, show_default=True, callback=_model_name,
              help=f"model preset giving the row sizes and constants ({', '.join(models.names())})")
@click.option("--num-tokens", callback=positive_int_list, default=",".join(map(str, NUM_TOKENS)), show_default=True,
              help="comma-separated integers >= 1")
@click.option("--ops", callback=_name_list(tuple(all_specs()), "op"), default=None,
              help="comma-separated ops [default: every op]")
@click.option("--peers", callback=_name_list(PEER_NAMES, "peer"), default=None,
              help=f"comma-separated of: {', '.join(PEER_NAMES)} [default: all]")
@click.option("--dtype", callback=dtype_option, default="bf16", show_default=True)
@click.option("--repeat", type=int, callback=positive_int, default=None, help="timed samples per point (>= 1)")
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="also write the JSON here")
def main(model, num_tokens, ops, peers, dtype, repeat, seed, out) -> None:
    """Runs the comparison; exits 0 if every cupykern point validated, 1 if not, 2
    without a GPU or on bad arguments."""
    require_gpu("peers.py")
    result = run(model, num_tokens, ops, peers, seed=seed, repeat=repeat, dtype=dtype, out_dir=out)
    own = [p for p in result["points"] if p["impl"] == "cupykern"]
    sys.exit(0 if own and all(p["check_ok"] for p in own) else 1)


if __name__ == "__main__":
    main()
