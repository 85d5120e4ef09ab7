"""Per-process CPU of the broker and the nodes while scripts/bench-cluster's pipeline idles, waits
paused with a backlog, and drains it (BENCHMARKS.md "Several nodes and failover"). Run by
scripts/bench-cluster-probe."""
import argparse, collections, importlib.util, os, subprocess, threading, time
spec = importlib.util.spec_from_file_location(
    "bc", os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-cluster.py"))
bc = importlib.util.module_from_spec(spec); spec.loader.exec_module(bc)
p = argparse.ArgumentParser()
for n in ("bin", "kafka", "pg_bin", "tmp"): p.add_argument("--" + n.replace("_", "-"), required=True)
p.add_argument("--pg-port", type=int, required=True)
p.add_argument("--tansu-pid", type=int, required=True)
p.add_argument("--nodes", type=int, default=1)
p.add_argument("--records", type=int, default=20000)
p.add_argument("--iterations", type=int, default=20000)
p.add_argument("--node-timeout", type=int, default=10)
args = p.parse_args()
HZ = os.sysconf("SC_CLK_TCK")
def ticks(pid):
    with open("/proc/%d/stat" % pid) as f: fs = f.read().rsplit(")", 1)[1].split()
    return int(fs[11]) + int(fs[12])
def sample(pids, seconds):
    a = {k: ticks(v) for k, v in pids.items()}; t = time.time(); time.sleep(seconds)
    dt = time.time() - t
    return {k: round((ticks(v) - a[k]) / HZ / dt, 3) for k, v in pids.items()}
nodes = bc.start_nodes(args, "probe%d" % args.nodes, args.nodes)
base = nodes[0].base
pids = {"tansu": args.tansu_pid}
for i, n in enumerate(nodes): pids["node%d" % i] = n.process.pid
try:
    port = args.kafka.split("?", 1)[0].rsplit(":", 1)[1]
    def conns():
        out = subprocess.run(["ss", "-tn", "state", "established", "( dport = :%s )" % port], capture_output=True, text=True).stdout
        return len(out.strip().splitlines()) - 1
    def threads(pid):
        return len(os.listdir("/proc/%d/task" % pid))
    print("idle, no pipeline:", sample(pids, 8), "connections:", conns(), "node threads:", threads(nodes[0].process.pid), flush=True)
    names = collections.Counter()
    for t in os.listdir("/proc/%d/task" % nodes[0].process.pid):
        try: names[open("/proc/%d/task/%s/comm" % (nodes[0].process.pid, t)).read().strip()] += 1
        except OSError: pass
    print("node threads by name:", names.most_common(10), flush=True)
    pipeline = bc.create_pipeline(args, base)
    assert bc.call("POST", "%s/api/v1/beam/%s/deploy" % (base, pipeline))[0] == 200
    time.sleep(3)
    print("idle, deployed:", sample(pids, 8), flush=True)
    assert bc.call("POST", "%s/api/v1/beam/%s/pause" % (base, pipeline))[0] == 200
    bc.ingest(base, 0, args.records)
    time.sleep(2)
    print("paused with backlog:", sample(pids, 8), flush=True)
    started = time.time()
    assert bc.call("POST", "%s/api/v1/beam/%s/deploy" % (base, pipeline))[0] == 200
    last = "%s/api/v1/beam/%s/sinks/sk-1/records?offset=%d&limit=1&wait_ms=1000" % (base, pipeline, args.records - 1)
    done = threading.Event()
    def watch():
        while not done.is_set():
            s = sample(pids, 3)
            if not done.is_set(): print("draining:", s, flush=True)
    th = threading.Thread(target=watch); th.start()
    while True:
        st, page = bc.call("GET", last)
        if st == 200 and page["records"]: break
        time.sleep(0.05)
    secs = time.time() - started; done.set(); th.join()
    print("drained %d in %.2f s: %.0f/s" % (args.records, secs, args.records / secs), flush=True)
    print("idle after:", sample(pids, 8), "connections:", conns(), "node threads:", threads(nodes[0].process.pid), flush=True)
    time.sleep(115)
    print("idle 2 min after:", sample(pids, 8), "connections:", conns(), "node threads:", threads(nodes[0].process.pid), flush=True)
finally:
    for n in nodes: n.stop()
