"""NOTES item 46: two probes of the points the peers tables put below 1.00 where the
kernels' own durations do not (item 41's ncu: rms_norm 70b at 256 rows 4.48 against
Liger's 4.45 us, the fused add 70b 6.43 against torch.compile's 6.66), and of item 45's
two readings of one peer (Liger's RoPE, llama-3.1-8b, 4096 tokens: 25.4 us in
bench/peers.py, 28.0-28.2 in item 44's rope_token_prefill.py on the same H100).

Part A, 256 rows, bf16, rms_norm and fused_add_rms_norm, llama-3.1-8b and -70b rows,
cold L2 (timing.time_cold), five interleaved rounds, one stream for CuPy and torch:
  lib        the public op, as the peers run calls it (the registry's run);
  bare       the kernel lib launches, launched bare with lib's recorded arguments;
  carve_l1   bare after cuFuncSetAttribute(preferred shared memory carveout = 0);
  carve_smem bare with carveout 100 (each bare form sets its own value first; -1 for bare);
  empty      a kernel of lib's grid and block that returns at once (the floor of the
             event pair and the launch at that grid);
  peer       the peer of the peers table: Liger's rms_norm, torch.compile's out-of-place
             fused add (bench/peers.py's formulations).
Part B, Liger's RoPE in the two scripts' forms in one process, interleaved with the
library (8b and 70b, 1024 and 4096 tokens, three rounds):
  lib          cupykern.apply_rope through the registry's run (the peers run's call);
  liger_peers  bench/peers.py's "liger (cos/sin fp32)" (cos/sin gathered by torch);
  liger_rows   bench/variants.liger_rope_on_rows (cos/sin gathered by CuPy), item 44's.
Kernel attributes (registers, static shared memory) of lib's kernels are printed.
Seed 20261205; writes gap_probe.json under --out (default $OUT)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import peers, variants  # noqa: E402
from cupykern import bfloat16, launcher, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SEED = 20261205
EMPTY = cupy.RawKernel(r'extern "C" __global__ void empty_kernel() {}', "empty_kernel")
ATTRS = ("num_regs", "shared_size_bytes", "local_size_bytes", "max_threads_per_block")

specs = all_specs()
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows256": [], "rope": []}
stream = cupy.cuda.Stream(non_blocking=True)
compiled = peers._torch_compile(torch)
liger = peers._liger(torch)


def recorded(run, inputs):
    with launcher.recording() as launched:
        run(inputs)
    return launched[-1]


def bare(r, carveout):
    def call():
        r.kernel.preferred_shared_memory_carveout = carveout
        r.kernel(r.grid, r.block, r.args, shared_mem=r.shared_mem)
    return call


with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
        model = models.get(model_name)
        for op, peer in (("rms_norm", liger["rms_norm"][""]),
                         ("fused_add_rms_norm", compiled["fused_add_rms_norm"]["out of place"])):
            spec = specs[op].for_model(model)
            size = specs[op].size_for_model(model)
            inputs = spec.make_inputs(np.random.default_rng(SEED), 256, size, bfloat16)
            r = recorded(spec.run, inputs)
            attrs = {a: getattr(r.kernel, a) for a in ATTRS}
            fns = {"lib": lambda s=spec, i=inputs: s.run(i), "bare": bare(r, -1), "carve_l1": bare(r, 0),
                   "carve_smem": bare(r, 100),
                   "empty": lambda g=r.grid, b=r.block: EMPTY(g, b, ()),
                   "peer": peers._prepare(torch, peer, peers._copy_inputs(inputs))}
            for name in ("peer", "peer", "lib"):  # torch.compile's first calls compile; warm both
                fns[name]()
            stream.synchronize()
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=50), rounds=5)
            r.kernel.preferred_shared_memory_carveout = -1
            results["rows256"].append({"model": model_name, "op": op, "grid": r.grid, "block": r.block,
                                       "attributes": attrs, "us": med})
            print(f"{model_name} {op} 256 rows: grid {r.grid} block {r.block} {attrs}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del inputs, fns

    for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
        model = models.get(model_name)
        spec = specs["apply_rope"].for_model(model)
        for n in (1024, 4096):
            inputs = spec.make_inputs(np.random.default_rng(SEED), n, model.head_dim, bfloat16)
            q, k = inputs["q"], inputs["k"]
            fns = {"lib": lambda s=spec, i=inputs: s.run(i),
                   "liger_peers": peers._prepare(torch, liger["apply_rope"]["cos/sin fp32"], inputs),
                   "liger_rows": variants.liger_rope_on_rows(
                       q, k, cupy.ascontiguousarray(inputs["cos_sin_cache"][inputs["positions"]]), model.head_dim)}
            for f in fns.values():
                f()
            stream.synchronize()
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=50), rounds=3)
            results["rope"].append({"model": model_name, "num_tokens": n, "us": med})
            print(f"{model_name} apply_rope {n}: " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}"
                                                                for f, v in med.items()), flush=True)
            del inputs, fns
json.dump(results, open(os.path.join(OUT, "gap_probe.json"), "w"), indent=1)
