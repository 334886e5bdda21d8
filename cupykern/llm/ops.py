"""The per-op switch of the GPU forward: cupykern's kernels, or plain-CuPy compositions.

Both sets compute the same math with the same numerics (fp32 arithmetic, one rounding
to the storage dtype per output), so swapping them changes speed, not results (up to
fp32 summation order inside a reduction). Each set has:

* ``rms_norm(x, weight, eps) -> y`` (new array);
* ``fused_add_rms_norm(x, residual, weight, eps) -> (x, residual)``, in place:
  ``residual <- round(x + residual)``, ``x <- rms_norm(residual)``;
* ``apply_rope(q, k, positions, cos_sin_cache)``: in place on q ``(T, H, D)`` and k
  ``(T, KV, D)`` (views of the fused QKV buffer), GGUF/GPT-J pairs (2i, 2i+1)
  (``is_neox=False``);
* ``silu_and_mul(x) -> silu(x[:, :d]) * x[:, d:]`` (new array);
* ``softmax(x) -> float32`` over the last axis (attention probabilities);
* ``fused_attention``: True when the set has ``rope_attention(q, k, v, positions,
  cos_sin_cache, k_cache, v_cache) -> (T, H, D)``: RoPE, the cache append and causal
  attention over the cache in two launches (:func:`cupykern.rope_kv_append`, then
  :func:`cupykern.decode_attention` for a few tokens or :func:`cupykern.prefill_attention`
  for many); else the model composes apply_rope, the cache write and attention itself.

``KERNELS`` runs one cupykern launch per op; ``PLAIN`` is the same math as several
CuPy elementwise/reduction launches (the way one would write it without cupykern),
taken from :mod:`cupykern.compositions`.
"""

from __future__ import annotations

#: From this many tokens the fused attention runs :func:`cupykern.prefill_attention`
#: (query tiles), below it :func:`cupykern.decode_attention` (a block per query head).
PREFILL_ATTENTION_MIN_TOKENS = 16


class KernelOps:
    """cupykern's fused kernels (``cupykern.rms_norm`` and friends)."""

    name = "cupykern"
    fused_attention = True

    @staticmethod
    def rope_attention(q, k, v, positions, cos_sin_cache, k_cache, v_cache):
        import cupykern

        # Positions come from the KV-cache length, checked by the model (no sync here).
        cupykern.rope_kv_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, is_neox=False,
                                check_positions=False)
        if q.shape[0] >= PREFILL_ATTENTION_MIN_TOKENS:  # query tiles share each k/v load
            return cupykern.prefill_attention(q, k_cache, v_cache, positions)
        return cupykern.decode_attention(q, k_cache, v_cache, positions)

    @staticmethod
    def rms_norm(x, weight, eps):
        import cupykern

        return cupykern.rms_norm(x, weight, eps)

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps):
        import cupykern

        return cupykern.fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def apply_rope(q, k, positions, cos_sin_cache):
        import cupykern

        # Positions come from the KV-cache length and are checked against the table
        # once per forward by the model, so the per-call min/max sync is skipped.
        return cupykern.apply_rope(q, k, positions, cos_sin_cache, is_neox=False, check_positions=False)

    @staticmethod
    def silu_and_mul(x):
        import cupykern

        return cupykern.silu_and_mul(x)

    @staticmethod
    def softmax(x):
        import cupykern

        return cupykern.softmax(x)


class PlainOps:
    """The same ops as CuPy compositions (several launches each, fp32 temporaries):
    :mod:`cupykern.compositions`, the one copy of that baseline, called with the
    model's arguments."""

    name = "plain CuPy"
    fused_attention = False

    # cupykern.compositions is imported per call, as cupykern is by KernelOps: it imports
    # CuPy at module level, and importing this module (model.py does) must not need CuPy.
    @staticmethod
    def rms_norm(x, weight, eps):
        from cupykern import compositions

        return compositions.rms_norm(x, weight, eps)

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps):
        from cupykern import compositions

        return compositions.fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def apply_rope(q, k, positions, cos_sin_cache):
        from cupykern import compositions

        # GGUF's permuted q/k rows: adjacent (GPT-J) pairs, as KernelOps.apply_rope.
        return compositions.apply_rope(q, k, positions, cos_sin_cache, is_neox=False)

    @staticmethod
    def silu_and_mul(x):
        from cupykern import compositions

        return compositions.silu_and_mul(x)

    @staticmethod
    def softmax(x):
        from cupykern import compositions

        return compositions.softmax(x)


KERNELS = KernelOps()
PLAIN = PlainOps()

#: ``--ops`` names -> op set.
OP_SETS = {"cupykern": KERNELS, "plain": PLAIN}
