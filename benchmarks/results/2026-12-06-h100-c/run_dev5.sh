#!/usr/bin/env bash
# Device call 5 (2026-12-06 c): docs/host-work.md's step-graph design, its first check: can a CUDA graph
# hold an already-captured graph (a replay issued while capturing)? benchmarks/probe_child_graph.py.
set -u
source .device-bundle-fi/setup.sh
G=/tmp/gc5; rm -rf $G; mkdir -p $G
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $G/gpu.txt
timeout 120 python3 benchmarks/probe_child_graph.py 2>&1 | tee $G/probe_child_graph.txt
echo "rc ${PIPESTATUS[0]}" | tee -a $G/probe_child_graph.txt
cp $G/* $OUT/
