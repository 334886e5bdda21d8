#!/usr/bin/env bash
cd "$(dirname "$0")/.."
OPS="silu_and_mul gelu_and_mul swiglu"
N="--num-tokens 1,16,64,4096,16384"
AB_JOBS="base a8 $OPS $N;new a8 $OPS $N;base f32 $OPS --dtype fp32 $N;new f32 $OPS --dtype fp32 $N;new a8again $OPS $N" DEADLINE=330 bash ab/run.sh
