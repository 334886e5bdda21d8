"""NOTES item 65: item 53's script with the far end (plans.ROPE_TOKEN_FAR_TO_TOKENS_PER_SM,
item 65) emptied in "lib" too, so that lib stays the wide kernel whatever its value.
Item 53's docstring follows.

NOTES item 53: when each block of apply_rope's kernels runs at 4096 tokens, beside
Liger's time. Item 52 found the wide kernel, both token kernels and Liger reading and
writing the same DRAM bytes with the DRAM active the same cycles, the wide kernel's SMs
active 4-5 % longer, and every SM idle about 12 % of the kernel (ramp and tail). Here a
copy of rope.cu whose two kernels record, for each block, %globaltimer at entry and at
thread 0's exit, thread 0's clock64 cycles between them and %smid (a guard object whose
destructor runs at every return), so that the span of the blocks, the ramp (when each
SM's first block starts) and the tail (when each SM's last block ends) can be read
against the kernel's event time. Variants (bf16, in place, cold L2; bits against lib's):
  lib      apply_rope_wide_kernel as the plan launches it with the token kernels off (8b:
           5 heads a thread, 64 threads, a block per token; 70b: 5 heads, 128 threads);
  token_p  apply_rope_token_kernel in the prefill heads where they fill it (8b: 5 heads);
  token_d  apply_rope_token_kernel as the decode plan launches it (8b: 2 heads, 160
           threads; 70b: 3 heads, 192 threads);
  split    apply_rope_token_kernel at 1 head a thread with a token's heads split over
           gridDim.y blocks (a source edit: slot += blockIdx.y * the block's slots; 8b 2
           blocks of 160 threads, 70b 3 of 192): half or a third of a token's bytes a
           block, so shorter blocks and a shorter tail of last blocks, if the tail is what
           Liger does not pay (call 8 on an H100: the wide kernel's SMs end over 5.6 us,
           a block's median time, with no block starting in the last 6 us);
  liger    LigerRopeFunction on fp32 cos/sin gathered before (bench/peers.py's form).
Each variant: the plain kernel and the probed copy timed (three interleaved rounds of
timing.time_cold), then one probed call after an L2 flush whose records are kept.
llama-3.1-8b and -70b at --sizes (default 4096). --tag names the files
(rope_blocks_<tag>.json and .npz). Seeded (numpy 20261206)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
TAG = sys.argv[sys.argv.index("--tag") + 1] if "--tag" in sys.argv else "run"
SIZES = tuple(int(n) for n in sys.argv[sys.argv.index("--sizes") + 1].split(",")) if "--sizes" in sys.argv \
    else (4096,)
LEAD = ("__nv_bfloat16", "float", "long long", True, 8)
THREADS_PER_HEAD, HEAD_SLOTS, TOKENS_PER_BLOCK = 22, 23, 24  # apply_rope kernels' argument indices
# The token kernels' ends at 1 token an SM and every window empty: the wide kernel at every size.
WIDE = {"ROPE_TOKEN_MAX_TOKENS_PER_SM": 1, "ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM": 1,
        "ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM": 1, "ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM": 1,
        "ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM": 1, "ROPE_TOKEN_FAR_TO_TOKENS_PER_SM": 0}
MAX_BLOCKS = 1 << 16

PROBE = r"""
__device__ unsigned long long ck_probe[4 * 65536];
__device__ __forceinline__ unsigned long long ck_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
struct CkProbe {
  unsigned long long g0;
  long long c0;
  __device__ CkProbe() : g0(ck_globaltimer()), c0(clock64()) {}
  __device__ ~CkProbe() {
    const unsigned b = blockIdx.x + gridDim.x * blockIdx.y;
    if (threadIdx.x == 0 && b < 65536) {
      unsigned long long* p = ck_probe + 4 * b;
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      p[0] = g0;
      p[1] = ck_globaltimer();
      p[2] = static_cast<unsigned long long>(clock64() - c0);
      p[3] = smid;
    }
  }
};
"""
SRC = jit.source("rope.cu")
MARK = "// ---------------------------------------------------------------- wide layout"
BODY = "int positions_row_stride, int mrope_t, int mrope_h, int mrope_w) {"


SLOT = "const int slot = threadIdx.x / kThreadsPerHead;"


def split_source(src):
    """apply_rope_token_kernel with blockIdx.y choosing the token's group of head slots."""
    at = src.index(SLOT, src.index("apply_rope_token_kernel(\n"))
    return src[:at] + "const int slot = threadIdx.x / kThreadsPerHead + blockIdx.y * (blockDim.x / kThreadsPerHead);" \
        + src[at + len(SLOT):]


def probed_source():
    src = SRC.replace(MARK, PROBE + MARK, 1)
    for head in ("apply_rope_wide_kernel(", "apply_rope_token_kernel("):
        at = src.index(BODY, src.index("__global__ void __launch_bounds__", src.index(MARK)) if head.startswith(
            "apply_rope_wide") else src.index(head + "\n")) + len(BODY)
        assert src[:at].rstrip().endswith(BODY) and head in src[at - 1200:at], head
        src = src[:at] + "\n  CkProbe ck_probe_guard;" + src[at:]
    assert src.count("CkProbe ck_probe_guard;") == 2
    return src


PROBED = probed_source()
SOURCES = {"plain": SRC, "probed": PROBED, "split": split_source(SRC), "split_probed": split_source(PROBED)}
_modules = {}


def module_kernel(expr, source):
    key = (expr, source)
    if key not in _modules:
        _modules[key] = cupy.RawModule(code=SOURCES[source], options=jit.COMPILE_OPTIONS, name_expressions=[expr])
    return _modules[key].get_function(expr), _modules[key]


def probed_kernel(expr, source="probed"):
    kernel, mod = module_kernel(expr, source)
    return kernel, cupy.ndarray((4 * MAX_BLOCKS,), cupy.uint64, mod.get_global("ck_probe"))


def record(q, k, positions, cache, constants):
    with variants.plan_constants(constants), launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    return launched[-1]


def token_args(args, threads_per_head, head_slots):
    return (*args[:THREADS_PER_HEAD], np.int32(threads_per_head), np.int32(head_slots), np.int32(1),
            *args[TOKENS_PER_BLOCK + 1:])


def summary(rec, blocks):
    """Times in us from the first block's start: the span, each SM's first start and last
    end (ramp and tail), block durations by thread 0's clock64 (cycles) and by globaltimer."""
    start, end, cycles, sm = (rec[:blocks, i].astype(np.float64) for i in range(4))
    t0 = start.min()
    start, end = (start - t0) / 1e3, (end - t0) / 1e3
    sms = np.unique(sm)
    first = np.array([start[sm == s].min() for s in sms])
    last = np.array([end[sm == s].max() for s in sms])
    per_sm = np.array([(sm == s).sum() for s in sms])
    steps = np.diff(np.unique(rec[:blocks, 0]))
    return {"blocks": int(blocks), "sms": int(len(sms)), "span_us": float(end.max()),
            "first_start_us": {"median": float(np.median(first)), "max": float(first.max())},
            "last_end_us": {"min": float(last.min()), "median": float(np.median(last)), "max": float(last.max())},
            "sm_busy_us_median": float(np.median(last - first)),
            "blocks_per_sm": {"min": int(per_sm.min()), "max": int(per_sm.max())},
            "block_us": {"median": float(np.median(end - start)), "p10": float(np.percentile(end - start, 10)),
                         "p90": float(np.percentile(end - start, 90))},
            "block_cycles_median": float(np.median(cycles)),
            "globaltimer_step_ns_min": float(steps[steps > 0].min()) if (steps > 0).any() else None}


seed = 20261206
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}
raw = {}
flusher = timing._L2Flusher()  # time_cold's own L2 flush
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
        model = models.get(model_name)
        num_heads = model.num_attention_heads + model.num_key_value_heads
        small = _rope_inputs(rng, 16, model.head_dim, cupykern.bfloat16, model=model)
        dec = record(small["q"], small["k"], small["positions"], small["cos_sin_cache"], {})
        assert dec.template is rope_ops.APPLY_ROPE_TOKEN, dec
        dec_tph, dec_slots, dec_heads = int(dec.args[THREADS_PER_HEAD]), int(dec.args[HEAD_SLOTS]), \
            dec.plan.heads_per_thread
        del small
        for n in SIZES:
            i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            lib = record(q, k, positions, cache, WIDE)
            assert lib.template is rope_ops.APPLY_ROPE_WIDE, lib
            heads, lanes = lib.plan.heads_per_thread, lib.plan.threads_per_head
            launches = {"lib": (lib.kernel, lib.grid, lib.block, lib.args,
                                rope_ops.APPLY_ROPE_WIDE.expr(*LEAD, 0, heads, True))}
            slots = num_heads // heads
            if heads * slots == num_heads and (slots * lanes) % 32 == 0:
                launches["token_p"] = (jit.get_kernel(rope_ops.APPLY_ROPE_TOKEN, *LEAD, lanes, heads), (n, 1, 1),
                                       (slots * lanes, 1, 1), token_args(lib.args, lanes, slots),
                                       rope_ops.APPLY_ROPE_TOKEN.expr(*LEAD, lanes, heads))
            launches["token_d"] = (dec.kernel, (n, 1, 1), dec.block, token_args(lib.args, dec_tph, dec_slots),
                                   rope_ops.APPLY_ROPE_TOKEN.expr(*LEAD, dec_tph, dec_heads))
            split = next(s_ for s_ in (2, 3, 4) if num_heads % s_ == 0 and (num_heads // s_ * lanes) % 32 == 0
                         and num_heads // s_ * lanes <= 256)
            split_expr = rope_ops.APPLY_ROPE_TOKEN.expr(*LEAD, lanes, 1)
            launches["split"] = (module_kernel(split_expr, "split")[0], (n, split, 1), (num_heads // split * lanes, 1, 1),
                                 token_args(lib.args, lanes, num_heads // split), split_expr)
            fns, regs, bufs = {}, {}, {}
            for name, (kernel, grid, block, args, expr) in launches.items():
                pk, buf = probed_kernel(expr, "split_probed" if name == "split" else "probed")
                fns[name] = lambda f=kernel, g=grid, b=block, a=args: f(g, b, a)
                fns[name + "_probed"] = lambda f=pk, g=grid, b=block, a=args: f(g, b, a)
                regs[name] = [kernel.num_regs, pk.num_regs]
                bufs[name] = (buf, grid[0] * grid[1])
            outs = variants.outputs_from(fns, (q, k), (q0, k0))
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            blocks = {}
            for name, (buf, grid_x) in bufs.items():
                flusher.flush(stream)
                buf.fill(0)
                fns[name + "_probed"]()
                stream.synchronize()
                rec = cupy.asnumpy(buf).reshape(-1, 4)[:grid_x]
                assert (rec[:, 0] > 0).all(), name
                raw[f"{model_name}_{n}_{name}"] = rec
                blocks[name] = summary(rec, grid_x)
            results["points"].append({"model": model_name, "num_tokens": n, "lib_heads": heads,
                                      "blocks": {k_: (launches[k_][1], launches[k_][2]) for k_ in launches},
                                      "registers": regs, "bitwise": bitwise, "us": med, "timeline": blocks})
            print(f"{model_name} {n}: regs {regs} bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            for name, s in blocks.items():
                print(f"   {name}: span {s['span_us']:.2f} us, first start median/max {s['first_start_us']['median']:.2f}"
                      f"/{s['first_start_us']['max']:.2f}, last end min/median/max {s['last_end_us']['min']:.2f}/"
                      f"{s['last_end_us']['median']:.2f}/{s['last_end_us']['max']:.2f}, block us median "
                      f"{s['block_us']['median']:.3f} (p10 {s['block_us']['p10']:.3f}, p90 {s['block_us']['p90']:.3f}),"
                      f" blocks/SM {s['blocks_per_sm']}, timer step {s['globaltimer_step_ns_min']} ns", flush=True)
            del i, q, k, q0, k0, outs, fns
json.dump(results, open(os.path.join(OUT, f"rope_blocks_{TAG}.json"), "w"), indent=1)
np.savez_compressed(os.path.join(OUT, f"rope_blocks_{TAG}.npz"), **raw)
