#!/usr/bin/env bash
# Call A (NOTES item 38): streams.py through gpu_session.sh, nothing else.
CUPYKERN_COMMIT=$(git rev-parse --short HEAD) TESTS= BENCHES="bench/results/2026-12-04_issue11-fused-add-streams_NVIDIA-H200/streams.py" bash bench/gpu_session.sh
