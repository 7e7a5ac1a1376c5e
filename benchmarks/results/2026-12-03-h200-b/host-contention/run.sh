# 2026-12-03 09:49 on the H200 machine (bash run.sh; writes smt.txt, work.txt to $OUT). A pure-Python loop pinned to
# CPU 0, alone and beside busy-spinning processes. "spin_on_sibling": CPU 0 has no SMT sibling on this VM, so
# that spinner shared CPU 0 itself.
G=/tmp/g5; mkdir -p $G; cd $G
{ lscpu | grep -iE 'model name|thread|core|socket|numa|^cpu\(s\)'; echo "cpu0 siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)"; echo "cpu2 siblings: $(cat /sys/devices/system/cpu/cpu2/topology/thread_siblings_list)"; } > smt.txt 2>&1
cat > work.py <<'PY'
import time, sys
d = {"a": 1}
class O: pass
o = O(); o.x = 1
def run(n=400000):
    s = 0
    for i in range(n):
        d["a"] = i; o.x = d["a"] + o.x; s += len(str(i & 7))
    return s
best = []
for _ in range(7):
    t = time.perf_counter(); run(); best.append(time.perf_counter() - t)
best.sort(); print("%s %.1f %.1f" % (sys.argv[1], best[0] * 1e3, best[3] * 1e3))
PY
spin='import time
while True: pass'
SIB=$(cut -d, -f2 /sys/devices/system/cpu/cpu0/topology/thread_siblings_list | cut -d- -f2)
[ -z "$SIB" ] && SIB=1
{
taskset -c 0 python3 work.py alone
python3 -c "$spin" & P=$!; taskset -cp $SIB $P >/dev/null; sleep 0.5; taskset -c 0 python3 work.py spin_on_sibling_cpu$SIB; kill $P
python3 -c "$spin" & P=$!; taskset -cp 8 $P >/dev/null; sleep 0.5; taskset -c 0 python3 work.py spin_on_cpu8; kill $P
PS=""; for c in 3 5 7 9 11 13; do python3 -c "$spin" & PS="$PS $!"; taskset -cp $c $! >/dev/null; done; sleep 0.5; taskset -c 0 python3 work.py spin_6_cpus_3-13odd; kill $PS
PS=""; for c in $(seq 1 15); do python3 -c "$spin" & PS="$PS $!"; taskset -cp $c $! >/dev/null; done; sleep 0.5; taskset -c 0 python3 work.py spin_15_cpus; kill $PS
taskset -c 0 python3 work.py alone_again
} > work.txt 2>&1
cat smt.txt work.txt
cp smt.txt work.txt $OUT/
