"""Click commands ``generate`` and ``fetch-model`` (registered in ``cupykern/cli.py``'s group).

``cupykern fetch-model smollm2`` downloads, verifies and caches the GGUF;
``cupykern generate [PROMPT]`` streams a completion from SmolLM2-135M-Instruct on the
GPU (or, with ``--reference``, from the float64 CPU forward), then prints prefill and
decode tokens/s, the device memory (weights, KV cache, CuPy pool peak; GPU only) and
the time per stage between CUDA events.
"""

from __future__ import annotations

import sys

import click

from cupykern import environment
from cupykern.llm import generate

DEFAULT_PROMPT = "Once upon a time, there was a little"


@click.command("fetch-model")
@click.argument("name", default="smollm2")
@click.option("--force", is_flag=True, help="Download again even if a verified copy is cached.")
def fetch_model_command(name, force):
    """Download NAME's GGUF (default smollm2) into the cache and check its SHA-256.

    The file goes in models/ of the cupykern cache dir: $CUPYKERN_CACHE_DIR if set, else
    the platform's user cache dir (on Linux $XDG_CACHE_HOME/cupykern, by default
    ~/.cache/cupykern; `cupykern info` prints it). CUPYKERN_CACHE_DIR moves both the
    tuned file and the models. Prints the file's path.
    """
    from cupykern.llm import fetch

    try:
        path = fetch.fetch_model(name, force=force, log=lambda m: click.echo(m, err=True))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    except fetch.FetchError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


#: generate's options that only the GPU forward reads (parameter name: how it is spelled).
_GPU_FORWARD_OPTIONS = {"dtype": "--dtype", "ops_name": "--ops", "graph": "--graph/--no-graph",
                        "pdl": "--pdl/--no-pdl"}

#: Packages of the llm extra that every generate needs (jinja2 only with --chat: the
#: tokenizer module says so when it is missing).
LLM_PACKAGES = ("gguf", "tokenizers")


def missing_llm_packages() -> list[str]:
    """The packages of :data:`LLM_PACKAGES` that cannot be imported."""
    import importlib.util

    return [name for name in LLM_PACKAGES if importlib.util.find_spec(name) is None]


def _stage_table(prefill_ms: dict, decode_ms: dict, title: str):
    from rich.table import Table

    from cupykern.llm.stage_timer import STAGES

    table = Table(title=title)
    table.add_column("stage")
    for phase in ("prefill", "decode"):
        table.add_column(f"{phase} ms", justify="right")
        table.add_column("%", justify="right")
    totals = [sum(prefill_ms.values()) or 1.0, sum(decode_ms.values()) or 1.0]
    for stage in STAGES:
        if stage not in prefill_ms and stage not in decode_ms:
            continue
        row = [stage]
        for ms, total in zip((prefill_ms, decode_ms), totals):
            value = ms.get(stage, 0.0)
            row += [f"{value:.3f}", f"{100 * value / total:.1f}"]
        table.add_row(*row)
    table.add_row("total", f"{sum(prefill_ms.values()):.3f}", "", f"{sum(decode_ms.values()):.3f}", "")
    return table


def _graph_stage_table(rows: list, step_us: float, position: int):
    from rich.table import Table

    table = Table(title=f"decode step by CUDA-graph replay at position {position}: each launch alone "
                        f"(weights then in L2), and the whole step")
    for column in ("stage", "launches", "us each", "us per step", "%"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    total = sum(r["us"] * r["per_step"] for r in rows)
    for r in rows:
        table.add_row(r["stage"], str(r["per_step"]), f"{r['us']:.2f}", f"{r['us'] * r['per_step']:.1f}",
                      f"{100 * r['us'] * r['per_step'] / total:.1f}")
    table.add_row("sum of launches alone", str(sum(r["per_step"] for r in rows)), "", f"{total:.1f}", "")
    table.add_row("whole step", "", "", f"{step_us:.1f}", "")
    return table


@click.command("generate")
@click.argument("prompt", required=False, default=DEFAULT_PROMPT)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--dtype", type=click.Choice(["fp16", "bf16"]), default="fp16", show_default=True,
              help="Storage dtype of weights and activations on the GPU.")
@click.option("--chat", is_flag=True, help="Wrap PROMPT in the model's chat template (a user turn).")
@click.option("--seed", type=click.IntRange(0, generate.MAX_SEED), default=0, show_default=True,
              help="Sampling seed (with --temperature > 0): an int in [0, 2**64).")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 is greedy.")
@click.option("--ops", "ops_name", type=click.Choice(["cupykern", "plain"]), default="cupykern", show_default=True,
              help="cupykern kernels, or plain-CuPy compositions of the same math.")
@click.option("--reference", is_flag=True, help="Run the float64 NumPy forward on the CPU instead (no GPU; slow).")
@click.option("--graph/--no-graph", default=True, show_default=True,
              help="Prefill and decode by replaying captured CUDA graphs (cupykern ops only); --no-graph "
                   "launches every op from Python (the eager path, and the only one for --ops plain).")
@click.option("--pdl/--no-pdl", default=None,
              help="Capture the graph's kernels as programmatic dependent launches (each starts while the one "
                   "before it finishes). Default: where the GPU allows it (sm_90+).")
@click.option("--stage-times/--no-stage-times", default=True, show_default=True,
              help="Replay the generation with a timer per stage and print the split.")
@click.option("--model", "model_path", type=click.Path(dir_okay=False), default=None,
              help="A llama GGUF file (default: the cached SmolLM2-135M-Instruct, fetched if missing).")
@click.pass_context
def generate_command(ctx, prompt, max_new_tokens, dtype, chat, seed, temperature, ops_name, reference, graph, pdl,
                     stage_times, model_path):
    """Generate text after PROMPT with SmolLM2-135M-Instruct (greedy by default).

    Decoding replays a captured CUDA graph of the decode step (five kernels per layer,
    plus the embedding, the LM head, the sampler and the position update: the next token
    chosen on the GPU; batches of replays launch a graph of 8 steps;
    cupykern/llm/decode_graph.py), and the prompt's forward as captured graphs too
    (cupykern/llm/prefill_graph.py), unless --no-graph or --ops plain.
    Streams the text, then prints prefill and decode tokens/s, the device memory
    (weights, KV cache, and the peak bytes CuPy's memory pool held during the run) and
    the time per stage: of the graph's launches by replay with the graph, else of the
    eager forward between CUDA events (norm, rope, activation, matmul, attention). Needs
    a CUDA GPU and cuBLAS (the llm extra's nvidia-cublas wheel) unless --reference.
    """
    from rich.console import Console
    from rich.markup import escape

    from cupykern import _dtypes
    from cupykern.llm import fetch, gguf_weights, memory, stage_timer, tokenizer

    console = Console(stderr=True)
    try:  # FloatRange(min=0) lets nan and inf through
        generate.check_args(max_new_tokens, temperature)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--temperature") from None
    from cupykern.ops.tokens import MAX_TEMPERATURE
    if graph and not reference and ops_name == "cupykern" and temperature > MAX_TEMPERATURE:
        # The graph samples with sample_tokens, which takes at most MAX_TEMPERATURE; say so
        # before the model loads (helper 74), not after.
        raise click.BadParameter(f"the graph's sampler takes at most {MAX_TEMPERATURE:g}, got {temperature!r} "
                                 f"(--no-graph samples on the host at any finite value)", param_hint="--temperature")
    if reference:  # helper 67: they were taken without a word, as sweep does not
        gpu_only = [flag for name, flag in _GPU_FORWARD_OPTIONS.items()
                    if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if gpu_only:
            raise click.UsageError(f"{', '.join(gpu_only)}: the GPU forward's options; --reference runs the float64 "
                                   f"forward on the CPU")
    if not reference:
        problem = environment.gpu_problem()
        if problem:
            raise click.ClickException(f"no GPU: {problem}. `cupykern generate` runs the model on an NVIDIA GPU; "
                                       "pass --reference to run the float64 forward on the CPU instead (slow).")
    missing = missing_llm_packages()
    if missing:  # before a 98 MB download that could not be read
        raise click.ClickException(f"`cupykern generate` needs the llm extra: pip install -e '.[llm]' in the "
                                   f"cupykern checkout (missing: {', '.join(missing)})")
    if not reference:  # the GPU forward's matmuls: cuBLAS, loaded through ctypes (cupykern/llm/blas.py)
        from cupykern.llm import blas

        try:
            blas.load()
        except (ImportError, OSError) as exc:
            raise click.ClickException(f"`cupykern generate` needs cuBLAS for its matmuls. {exc}") from None
    try:
        path = model_path or fetch.fetch_model("smollm2", log=lambda m: console.print(escape(m)))
        reader = gguf_weights.open_reader(path)
        tok = tokenizer.load_tokenizer(reader)
        text = tok.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
        prompt_ids = tok.encode(text)
        # Checked before the weights load: an empty prompt, or more tokens than the context.
        if not prompt_ids:
            raise click.BadParameter("the prompt encodes to no tokens: give some text", param_hint="PROMPT")
        context = gguf_weights.read_config(reader).context_length
        if len(prompt_ids) + max_new_tokens > context:
            raise click.BadParameter(f"{len(prompt_ids)} prompt tokens + {max_new_tokens} new exceed the model's "
                                     f"context of {context} tokens", param_hint="--max-new-tokens")
        if reference:
            from cupykern.llm.reference import ReferenceLlama

            model = ReferenceLlama(gguf_weights.load_weights(path, reader=reader, dtype="float64"))
            make_timer, what = stage_timer.CpuStageTimer, "float64 NumPy on the CPU"
        else:
            import cupy

            from cupykern.llm.model import LlamaModel, to_device
            from cupykern.llm.ops import OP_SETS

            # Empty the pool first, so what it holds after the generation is the most this
            # run held at once (the pool keeps freed blocks until free_all_blocks).
            pool = cupy.get_default_memory_pool()
            pool.free_all_blocks()
            weights = to_device(gguf_weights.load_weights(path, reader=reader), _dtypes.parse(dtype))
            model = LlamaModel(weights, ops=OP_SETS[ops_name])
            make_timer, what = stage_timer.CudaStageTimer, f"{dtype} on the GPU, {OP_SETS[ops_name].name} ops"
    except (fetch.FetchError, FileNotFoundError, ImportError, KeyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None

    console.print(f"[dim]{escape(str(model.config.name or path))}: {len(prompt_ids)} prompt tokens, {what}[/dim]")
    streamed = {"ids": [], "printed": ""}

    def on_token(token_id):
        streamed["ids"].append(token_id)
        text_now = tok.decode(streamed["ids"], skip_special_tokens=True)
        if not text_now.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text_now[len(streamed["printed"]):])
            sys.stdout.flush()
            streamed["printed"] = text_now

    if not reference:
        # Throwaway steps first, so the tokens/s below exclude first-use compiles (NVRTC,
        # CuPy's elementwise kernels) and cuBLAS start-up (a 5-token prompt's prefill read
        # 933 ms without them on the H200): the whole prompt's prefill, so that the timed
        # one loads no kernel (prefill_attention from ops.PREFILL_ATTENTION_MIN_TOKENS
        # tokens, decode_attention below; the planner's instantiations for this many rows;
        # the plain ops' causal mask), then a one-token decode step, into a cache of the
        # generation's rows (decode_attention splits one past 1024 rows: other kernels).
        warm = model.new_cache(len(prompt_ids) + max_new_tokens)
        model.forward(prompt_ids, warm)
        model.forward(prompt_ids[:1], warm)
        del warm  # its blocks go back to the pool for the generation's cache
    use_graph = graph and not reference and ops_name == "cupykern"
    if use_graph:
        from cupykern.llm import decode_graph

        try:
            decoder = decode_graph.GraphDecoder(model, len(prompt_ids) + max_new_tokens, temperature=temperature,
                                                seed=seed, enable_pdl=pdl)
        except (ValueError, RuntimeError) as exc:
            raise click.ClickException(str(exc)) from None
        capture_s = decoder.capture()
        prefill_capture_s = decoder.prefill.prepare(len(prompt_ids))
        console.print(f"[dim]decode step captured as CUDA graphs of 1 and {decoder.steps_per_graph} steps in "
                      f"{capture_s * 1e3:.0f} ms "
                      f"(warm-up step included; {'dependent' if decoder.pdl else 'plain'} launches); the prompt's "
                      f"prefill graph in {prefill_capture_s * 1e3:.0f} ms[/dim]")
    sys.stdout.write(prompt if not chat else "")
    try:
        stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
        if use_graph:
            result = decode_graph.generate(decoder, prompt_ids, max_new_tokens, stop_ids=stop, on_token=on_token)
        else:
            result = generate.generate(model, prompt_ids, max_new_tokens, temperature=temperature, seed=seed,
                                       stop_ids=stop, on_token=on_token)
    except ValueError as exc:
        sys.stdout.write("\n")  # helper 67: the message read "HiError: ..." after the echoed prompt
        sys.stdout.flush()
        raise click.ClickException(str(exc)) from None
    sys.stdout.write("\n")
    sys.stdout.flush()
    path = ("the float64 forward on the CPU" if reference else
            "replays of the captured decode graph" if use_graph else "eager (a Python launch per op)")
    console.print(f"decode path: {path}")
    console.print(f"prefill: {_tokens(len(result.prompt_ids))} in {result.prefill_s * 1e3:.1f} ms "
                  f"({result.prefill_tokens_per_s:.1f} tokens/s); decode: {_tokens(len(result.new_ids) - 1)} in "
                  f"{result.decode_s * 1e3:.1f} ms ({result.decode_tokens_per_s:.1f} tokens/s)")
    if not reference:
        pool_peak = pool.total_bytes()  # before the stage replay below allocates its own cache
        console.print(memory.report(memory.weights_nbytes(model.weights), memory.kv_cache_nbytes(result.cache),
                                    pool_peak, dtype_name=dtype, num_layers=len(result.cache.k),
                                    max_tokens=result.cache.max_tokens,
                                    tables=model.lm_head_f32.nbytes + model.cos_sin_cache.nbytes))
    result.cache = None  # measured: let the replay reuse its blocks
    if use_graph and stage_times:
        # The graph's own split: each kind of launch replayed alone, and the whole step.
        position = len(result.prompt_ids) + len(result.new_ids) // 2
        console.print(_graph_stage_table(decoder.stage_split(position), decoder.step_time_us(position), position))
        return
    if stage_times:
        prefill_ms, decode_ms = generate.profile_stages(model, make_timer, result.prompt_ids, result.new_ids)
        kind = "wall time" if reference else "CUDA events around each stage"
        console.print(_stage_table(prefill_ms, decode_ms, f"time per stage ({kind}; a replay of this generation)"))
        if not reference:
            console.print("Between events the GPU runs a stage's kernels or waits for the host to launch them: "
                          "one-token decode steps are host-bound (2-3 us kernels, tens of us of Python per launch), "
                          "so their split is mostly launch time; bench/bench_host_overhead.py measures it per op.")


COMMANDS = (generate_command, fetch_model_command)


def _tokens(n: int) -> str:
    """n and "token" or "tokens" after it."""
    return f"{n} token" + ("" if n == 1 else "s")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def _standalone():
    """The llm commands on their own: python -m cupykern.llm.cli generate|fetch-model."""


for _command in COMMANDS:
    _standalone.add_command(_command)

if __name__ == "__main__":
    _standalone()
