#!/usr/bin/env bash
# Call B (NOTES item 37): the whole peers run at d4ad7b3 (README's table, now with the copy of each point's own bytes), as run:
CUPYKERN_COMMIT=d4ad7b3 TESTS= BENCHES= PEERS="" DEADLINE_S=592 bash bench/gpu_session.sh
