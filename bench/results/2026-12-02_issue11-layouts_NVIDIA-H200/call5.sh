#!/usr/bin/env bash
# Call 5 (NOTES item 25): the peers whole run at 949fe9c timed rms_norm 8b at 256 tokens
# at 6.22 us where call 2's sweeps gave 5.34-5.68: the same tree, sweep and peers harness
# in turn, twice (the peers run with Liger only: no torch.compile builds). The peers JSON
# is named after the device copy's stale git HEAD (05abb68); its tree was 949fe9c.
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
for i in 1 2; do
  python3 -m cupykern.cli sweep rms_norm layer_norm --num-tokens 256,1024 --json $OUT/sweep$i.json > $OUT/sweep$i.log 2>&1
  timeout 150 python3 bench/peers.py --models llama-3.1-8b --ops rms_norm,layer_norm --num-tokens 256,1024 --peers liger --out $OUT/p$i > $OUT/peers$i.log 2>&1
done
