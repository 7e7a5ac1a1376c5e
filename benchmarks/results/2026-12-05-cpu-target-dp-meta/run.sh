set -x
for i in 1 2 3; do
  PYTHONPATH=/tmp/oldshim:/tmp/oldtree TRITON_INTERPRET=1 /work/main/.venv/bin/python /tmp/oldtree/benchmarks/bench_plugin_load.py --slots default --repeats 1 --server-arg=--device --server-arg=cpu --json benchmarks/results/2026-12-05-cpu-target-dp-meta/old_$i.json > benchmarks/results/2026-12-05-cpu-target-dp-meta/old_$i.txt 2>&1
  TRITON_INTERPRET=1 /work/main/.venv/bin/python /work/main/benchmarks/bench_plugin_load.py --slots default --repeats 1 --server-arg=--device --server-arg=cpu --json benchmarks/results/2026-12-05-cpu-target-dp-meta/new_$i.json > benchmarks/results/2026-12-05-cpu-target-dp-meta/new_$i.txt 2>&1
done
