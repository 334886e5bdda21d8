"""Does peers.enter_torch_graph_state enter the state of NOTES item 18, and does that
state reach rms_norm 8b at one token?"""
import json, os, sys
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
sys.path.insert(0, os.getcwd())
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern.timing import time_graph
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
x = cp.asarray(rng.standard_normal((1, 2 * 14336)).astype(bf)); out = cp.empty((1, 14336), bf)
w = cp.asarray(rng.standard_normal(4096).astype(bf))
x1 = cp.asarray(rng.standard_normal((1, 4096)).astype(bf)); o1 = cp.empty_like(x1)
x16 = cp.asarray(rng.standard_normal((16, 4096)).astype(bf)); o16 = cp.empty_like(x16)
def probe(event):
    r = {"event": event,
         "silu_and_mul 8b x1": time_graph(lambda: cupykern.silu_and_mul(x, out=out)).median_us,
         "rms_norm 8b x1": time_graph(lambda: cupykern.rms_norm(x1, w, 1e-6, out=o1)).median_us,
         "rms_norm 8b x16": time_graph(lambda: cupykern.rms_norm(x16, w, 1e-6, out=o16)).median_us}
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
probe("clean"); probe("clean again")
import torch
from bench import peers
torch.zeros(1, device="cuda"); probe("torch initialised")
peers.enter_torch_graph_state(torch); probe("after peers.enter_torch_graph_state")
