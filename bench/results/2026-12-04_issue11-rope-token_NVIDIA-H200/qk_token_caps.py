"""NOTES item 39, call C: the whole peers run of ed56e23 put qk_rms_norm_rope 70b at 44.24 /
171.17 us at 4096 / 16384 tokens, against 41.22 / 152.83 in 5fe4b27's run and 40.1-40.3 /
153.9-154.1 for call J's build of the guard-free kernel under 96 registers (80 used). The
committed kernel (46ebea2) takes 92 registers for 3 heads under __maxnreg__(96): 3 blocks
of 192 threads an SM, where 80 leave 4. Its register cap by heads a thread, bare launches
with the library's recorded arguments, bf16, three interleaved rounds, bits against the
library's: cap 96 (committed), 88, 80, 72, none; 70b (3 heads) and 8b (5 heads) at
1024-16384 tokens (cold L2), both at 1-64 tokens (graph replay: 2 and 3 heads).
"""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SRC = jit.source("rope.cu")
OLD = "__global__ void __maxnreg__(kQkTokenMaxRegisters) qk_rms_norm_rope_token_kernel("
assert SRC.count(OLD) == 1
CAPS = (88, 80, 72, 0)
_built = {}


def kernel(cap, expr):
    if (cap, expr) not in _built:
        code = SRC.replace(OLD, "__global__ void " + (f"__maxnreg__({cap}) " if cap else "") +
                           "qk_rms_norm_rope_token_kernel(")
        _built[cap, expr] = cupy.RawModule(code=code, options=jit.COMPILE_OPTIONS,
                                           name_expressions=[expr]).get_function(expr)
    return _built[cap, expr]


seed = 20261206
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": []}
for model_name, counts in (("llama-3.1-70b", (1, 16, 64, 1024, 4096, 16384)), ("llama-3.1-8b", (1, 64, 4096, 16384))):
    model = models.get(model_name)
    for n in counts:
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, with_weights=True, model=model)
        q0, k0 = i["q"].copy(), i["k"].copy()

        def qk(i=i):
            return cupykern.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                             i["cos_sin_cache"], i["eps"], check_positions=False)

        with launcher.recording() as launched:
            qk()
        lib = launched[-1]
        assert lib.template is rope_ops.QK_RMS_NORM_ROPE_TOKEN, lib
        expr = rope_ops.QK_RMS_NORM_ROPE_TOKEN.expr("__nv_bfloat16", "float", "long long", True, 8,
                                                    lib.plan.threads_per_head, lib.plan.heads_per_thread)
        fns = {"cap96": lambda r=lib: r.kernel(r.grid, r.block, r.args)}
        regs = {"cap96": lib.kernel.num_regs}
        for cap in CAPS:
            k = kernel(cap, expr)
            regs[f"cap{cap}"] = k.num_regs
            fns[f"cap{cap}"] = lambda r=lib, k=k: k(r.grid, r.block, r.args)
        outs = {}
        for name, fn in fns.items():
            i["q"][...], i["k"][...] = q0, k0
            fn()
            outs[name] = (i["q"].copy(), i["k"].copy())
        bitwise = {name: variants.same_bits(outs[name], outs["cap96"]) for name in fns}
        timer = timing.time_graph if n <= 64 else (lambda f: timing.time_cold(f, repeat=30))
        med = variants.time_rounds(fns, timer)
        results["points"].append({"model": model_name, "num_tokens": n, "heads_per_thread": lib.plan.heads_per_thread,
                                  "registers": regs, "bitwise": bitwise, "us": med})
        print(f"{model_name} {n}: heads {lib.plan.heads_per_thread} regs {regs} bitwise {all(bitwise.values())}",
              flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, q0, k0, outs, fns
json.dump(results, open(os.path.join(OUT, "qk_token_caps.json"), "w"), indent=1)
