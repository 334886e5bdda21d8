"""Fixed-seed outputs of every op through its public API, as SHA-256 digests of the bytes.

The launch path may change (plans cached per signature, a new launcher) but, for the
default plans, not one output bit: ``tests/test_golden.py`` compares the digests of
this commit with ``tests/data/golden_outputs.json``, written by an earlier commit on the
GPU named in it. Only the public API is used, so the same file runs against any commit:

    PYTHONPATH=/path/to/old/checkout python tests/golden_outputs.py --write old.json
    python tests/golden_outputs.py --write new.json

Inputs are drawn with NumPy from a fixed seed, per case, so they do not depend on the
machine or on which cases run.

A commit that is meant to change bits re-records the file on the GPU it names (an H200),
from the repository root, and commits it with the change that explains it:

    PYTHONPATH=. python tests/golden_outputs.py --write tests/data/golden_outputs.json

(The row reduction tree of issue 11 changed the bits of rms_norm, fused_add_rms_norm,
layer_norm, softmax and row_reduce; rope and the activations were not touched.)
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib

import numpy as np

SEED = 20261130
DTYPES = ("float32", "float16", "bfloat16")


def _dtype(name):
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(np.ascontiguousarray(a.get()).view(np.uint8).tobytes())
    return h.hexdigest()


def _cases():
    """(case id, function of a seeded rng returning the output arrays) for every case."""
    import cupy

    import cupykern

    def dev(rng, shape, dtype, scale=1.0, loc=0.0):
        return cupy.asarray((rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(_dtype(dtype)))

    for dtype in DTYPES:
        for tokens, hidden in ((1, 4096), (7, 4096), (300, 4096), (5, 127), (3, 65536)):
            tag = f"{dtype}-{tokens}x{hidden}"

            def rms(rng, t=tokens, h=hidden, d=dtype):
                return (cupykern.rms_norm(dev(rng, (t, h), d), dev(rng, (h,), d, 0.1, 1.0), 1e-6),)

            def fused(rng, t=tokens, h=hidden, d=dtype):
                return cupykern.fused_add_rms_norm(dev(rng, (t, h), d), dev(rng, (t, h), d), dev(rng, (h,), d, 0.1, 1.0),
                                                   1e-5, weight_offset=1.0)

            def layer(rng, t=tokens, h=hidden, d=dtype):
                return (cupykern.layer_norm(dev(rng, (t, h), d), dev(rng, (h,), d, 0.1, 1.0), dev(rng, (h,), d, 0.1)),)

            def soft(rng, t=tokens, h=hidden, d=dtype):
                x = dev(rng, (t, h), d, 3.0)
                return cupykern.softmax(x), cupykern.softmax(x, out=cupy.empty_like(x), temperature=0.7)

            def reduce(rng, t=tokens, h=hidden, d=dtype):
                x = dev(rng, (t, h), d)
                return tuple(cupykern.row_reduce(x, op) for op in ("sum", "mean", "sumsq", "max", "min"))

            def strided(rng, t=tokens, h=hidden, d=dtype):
                wide = dev(rng, (t, h + 24), d)
                return (cupykern.rms_norm(wide[:, 3:3 + h], dev(rng, (h,), d, 0.1, 1.0)),)

            yield f"rms_norm-{tag}", rms
            yield f"fused_add_rms_norm-{tag}", fused
            yield f"layer_norm-{tag}", layer
            yield f"softmax-{tag}", soft
            yield f"row_reduce-{tag}", reduce
            yield f"rms_norm_strided-{tag}", strided
        for tokens, d in ((1, 14336), (64, 14336), (300, 11008), (3, 11)):
            tag = f"{dtype}-{tokens}x{d}"

            def acts(rng, t=tokens, n=d, dt=dtype):
                x = dev(rng, (t, 2 * n), dt, 2.0)
                return (cupykern.silu_and_mul(x), cupykern.gelu_and_mul(x), cupykern.gelu_and_mul(x, approximate="tanh"),
                        cupykern.swiglu(x[:, :n], x[:, n:]))

            yield f"activations-{tag}", acts
        # The FP8 norms (quant.cu): 16-bit 1024-element rows take the 64 x 8 x 2 decode layout.
        for tokens, hidden in ((1, 4096), (16, 1024), (300, 4096), (5, 127), (70, 8192)):
            tag = f"{dtype}-{tokens}x{hidden}"

            def quant(rng, t=tokens, h=hidden, d=dtype):
                x, residual, weight = dev(rng, (t, h), d), dev(rng, (t, h), d), dev(rng, (h,), d, 0.1, 1.0)
                scale = cupy.asarray([0.02], dtype=cupy.float32)
                outs = [cupykern.rms_norm_quant(x, weight, scale), *cupykern.rms_norm_dynamic_per_token_quant(x, weight)]
                outs += cupykern.fused_add_rms_norm_quant(x, residual.copy(), weight, scale)
                outs += cupykern.fused_add_rms_norm_dynamic_per_token_quant(x, residual.copy(), weight)
                return tuple(outs)

            yield f"fp8_norms-{tag}", quant
        for tokens in (1, 16, 700):
            for head_dim, rotary_dim in ((128, 128), (128, 64), (64, 64)):
                tag = f"{dtype}-{tokens}-{head_dim}-{rotary_dim}"

                def rope(rng, t=tokens, hd=head_dim, rd=rotary_dim, d=dtype):
                    cache = cupykern.rope_cos_sin_cache(4096, rd, 500000.0)
                    positions = cupy.asarray(rng.integers(0, 4096, t))
                    outs = []
                    for is_neox in (True, False):
                        qkv = dev(rng, (t, (32 + 2 * 8) * hd), d)
                        q, k = qkv[:, :32 * hd].reshape(t, 32, hd), qkv[:, 32 * hd:40 * hd].reshape(t, 8, hd)
                        outs += cupykern.apply_rope(q, k, positions, cache, is_neox=is_neox, inplace=False)
                        outs += cupykern.apply_rope(q, k, positions.astype(cupy.int32), cache, is_neox=is_neox)
                    return tuple(outs)

                def qk_norm(rng, t=tokens, hd=head_dim, rd=rotary_dim, d=dtype):
                    cache = cupykern.rope_cos_sin_cache(4096, rd, 1000000.0)
                    positions = cupy.asarray(rng.integers(0, 4096, t))
                    q, k = dev(rng, (t, 32, hd), d), dev(rng, (t, 8, hd), d)
                    return cupykern.qk_rms_norm_rope(q, k, dev(rng, (hd,), d, 0.1, 1.0), dev(rng, (hd,), d, 0.1, 1.0),
                                                     positions, cache, 1e-6)

                yield f"apply_rope-{tag}", rope
                yield f"qk_rms_norm_rope-{tag}", qk_norm


def digests() -> dict[str, str]:
    """{case id: SHA-256 of its outputs' bytes} on the current GPU."""
    return {case: _digest(*run(np.random.default_rng([SEED, zlib.crc32(case.encode())]))) for case, run in _cases()}


def gpu_name() -> str:
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def main(argv) -> int:
    if len(argv) != 2 or argv[0] != "--write":
        print(__doc__, file=sys.stderr)
        return 2
    import cupykern

    result = {"gpu": gpu_name(), "seed": SEED, "cupykern": cupykern.__file__, "digests": digests()}
    with open(argv[1], "w") as f:
        json.dump(result, f, indent=1)
    print(f"{len(result['digests'])} cases on {result['gpu']} -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
