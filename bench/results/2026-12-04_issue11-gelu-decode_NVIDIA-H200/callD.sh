#!/usr/bin/env bash
# Call D (NOTES item 36): the whole peers run at 5708c93 (README's table), as run:
CUPYKERN_COMMIT=5708c93 TESTS= BENCHES= PEERS="" DEADLINE_S=592 bash bench/gpu_session.sh
