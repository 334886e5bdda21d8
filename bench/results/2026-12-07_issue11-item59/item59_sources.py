"""NOTES item 59: rope.cu as the probes of this folder compile it beside the tree's own.

before_fence()  the token kernels as they were before item 59: the out-of-range return
                straight after the q/k loads, which ptxas sank below it (so behind the
                position's load; item 59's SASS), no write-back;
by_token()      the tree's source with every position read replaced by the token index
                (item 57's rope_rows_probe.py "tok"): rows gathered before the call, no
                position load at all.
kernel(source, template, instantiation)  one instantiation compiled from such a source.
"""
import re

import cupy

from cupykern import jit

POSITION_READ = "static_cast<int64_t>(positions[token * positions_stride])"
# The token kernels' range check since item 59: a fence, then the token's values written
# back where the position is out of range (so its loads have a use on both paths).
FENCED_RETURN = re.compile(r"  loads_issued_here\(\);\n  if \(pos < 0 \|\| pos >= max_position\) \{\n.*?\n    return;\n  \}\n",
                           re.S)
OLD_RETURN = "  if (pos < 0 || pos >= max_position) return;  // the token is left as it is (the whole block)\n"


def before_fence() -> str:
    # Two fenced returns when item 59's call ran (eaff40f); one since qk_rms_norm_rope's
    # went back to its plain return (item 59: slower there), the old source for that kernel.
    text, count = FENCED_RETURN.subn(OLD_RETURN, jit.source("rope.cu"))
    assert count in (1, 2), f"expected the token kernels' fenced returns, found {count}"
    return text


def by_token() -> str:
    text = jit.source("rope.cu")
    assert text.count(POSITION_READ) >= 3, "rope.cu's position read changed: update POSITION_READ"
    return text.replace(POSITION_READ, "static_cast<int64_t>(token)")


def kernel(source: str, template, instantiation: tuple):
    expr = template.expr(*instantiation)
    return cupy.RawModule(code=source, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)
