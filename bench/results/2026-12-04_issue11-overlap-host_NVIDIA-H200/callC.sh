#!/usr/bin/env bash
# Call C (NOTES item 37), two device calls back to back at 0311a9f:
# 1. the whole GPU suite (the overlap rules' new GPU test among it), results in $OUT:
CUPYKERN_COMMIT=0311a9f SANITIZE= BENCHES= PYTEST_ARGS="-n 15" bash bench/gpu_session.sh
# 2. the whole peers run (README's table; the same-bytes copy the fastest of three medians):
# CUPYKERN_COMMIT=0311a9f TESTS= BENCHES= PEERS="" DEADLINE_S=592 bash bench/gpu_session.sh
