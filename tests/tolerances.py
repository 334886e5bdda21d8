"""The per-dtype tolerance table lives in the package (cupykern/tolerances.py), where
``cupykern check``, the sweep and the benchmarks use it too; tests import it from here."""

from cupykern.tolerances import TOLERANCES, tolerance  # noqa: F401
