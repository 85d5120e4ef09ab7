"""Driver of scripts/bench-density (standard library only): how many pipelines one
`sluice serve` node carries (issue 33), through the public HTTP API only, for one or two
binaries side by side.

Per binary and stream log (embedded, or a private tansu broker per node start):
  density     N pipelines created and deployed one after another (a set filter on
              base.erc20_token_transfer with a value of its own, a managed sink): each
              deploy's latency, p50/p99 per 100 deploys; then 30 s of idle with no traffic:
              the node's threads, RSS, CPU, and the broker's CPU; then SIGTERM and a start on
              the same data dir: seconds until every pipeline reports running workers.
  throughput  100 set-filter pipelines on one stream (distinct values, 0.1 % of the
              records match each) drain a backlog of R records: records / node CPU second,
              next to one such pipeline draining the same records on a fresh node. They are
              paused while the backlog is appended, then resumed --resume-concurrency at a
              time (16, as a restarted node resumes them); what resuming them costs with
              nothing to drain is measured first and shown taken out as well.
"""

import argparse
import csv
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

KEY = "slk_benchdensity00000000000000000000000000000"
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
STREAM = "/api/v1/streams/base/erc20_token_transfer/records"


def pipeline_value(index):
    return "0xde%038x" % index


def noise_value(n):
    return "0xbe%038x" % (n % 10_000)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_local = threading.local()


def call(base, method, path, body=None, timeout=120):
    """(status, parsed JSON body) over a kept-alive connection of this thread; raises
    OSError (socket.timeout included) when the server does not answer in time."""
    host = base.split("//", 1)[1]
    connections = getattr(_local, "connections", None)
    if connections is None:
        connections = _local.connections = {}
    data = body.encode() if isinstance(body, str) else body
    headers = {"x-api-key": KEY}
    if data is not None:
        headers["content-type"] = "application/json"
    for attempt in (0, 1):
        connection = connections.get((host, timeout))
        if connection is None:
            connection = http.client.HTTPConnection(host, timeout=timeout)
            connections[(host, timeout)] = connection
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (http.client.HTTPException, ConnectionError) as error:
            connection.close()
            del connections[(host, timeout)]
            if attempt == 1:
                raise OSError(str(error)) from error
            continue
        except OSError:
            connection.close()
            del connections[(host, timeout)]
            raise
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return response.status, parsed
    raise AssertionError("unreachable")


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def minor_faults(pid):
    """Minor page faults of a process so far (/proc/PID/stat): first touches of fresh memory."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def peak_rss_mib(pid):
    """The process's peak resident memory (VmHWM), MiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


class RssTimeline:
    """The node's resident memory sampled every `every` seconds on a thread of its own, with
    how many records the sinks hold by then (one /metrics read per sample): which phase of
    a drain the memory grows in."""

    def __init__(self, node, every):
        self.node, self.every, self.samples = node, every, []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.started = time.time()
        self.thread.start()

    def run(self):
        while not self.stopped.is_set():
            try:
                _, rss = threads_and_rss(self.node.pid)
                faults = minor_faults(self.node.pid)
                sent = sum(delivered_counts(self.node).values())
            except OSError:  # the node is gone (a drain that timed out)
                return
            self.samples.append((time.time() - self.started, rss / 2**20, sent, faults))
            self.stopped.wait(self.every)

    def stop(self):
        self.stopped.set()
        self.thread.join()
        first_faults = self.samples[0][3] if self.samples else 0
        return "; ".join("%.1fs %.0fMiB %d sent %dk faults" % (at, rss, sent, (faults - first_faults) // 1000)
                         for at, rss, sent, faults in self.samples)


def threads_and_rss(pid):
    threads, rss = None, None
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return threads, rss


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[index]


class Broker:
    """A private tansu (memory engine) on a free loopback port, as scripts/test starts it."""

    def __init__(self, args, label):
        self.port = free_port()
        listener = "tcp://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(args.tmp, "tansu-%s.log" % label), "w")
        self.process = subprocess.Popen(
            [args.tansu, "broker", "--listener-url", listener, "--advertised-listener-url", listener,
             "--storage-engine", "memory://tansu/"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.process.poll() is not None:
                    sys.exit("tansu did not start (log: %s)" % self.log.name)
                time.sleep(0.1)
        self.url = "kafka://127.0.0.1:%d" % self.port

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class Node:
    """One `sluice serve` on a free port and its own data dir (kept across a restart)."""

    def __init__(self, args, binary, label, broker=None):
        self.args, self.binary, self.label, self.broker = args, binary, label, broker
        self.data_dir = os.path.join(args.tmp, label)
        os.makedirs(self.data_dir)
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.process = None
        self.starts = 0

    def start(self):
        """Starts the process; answers (seconds until /readyz answered 200, spawn time)."""
        command = [self.binary, "serve", "--data-dir", self.data_dir,
                   "--listen", "127.0.0.1:%d" % self.port]
        if self.broker is not None:
            command += ["--bus", self.broker.url, "--bus-topic-prefix", "bench."]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env["SLUICE_BOOTSTRAP_API_KEY"] = KEY
        env["SLUICE_LOG"] = os.environ.get("BENCH_DENSITY_NODE_LOG", "warn")
        self.starts += 1
        self.log = open("%s.%d.log" % (self.data_dir, self.starts), "w")
        spawned = time.time()
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = spawned + 120
        while True:
            try:
                if call(self.base, "GET", "/readyz", timeout=5)[0] == 200:
                    return time.time() - spawned, spawned
            except OSError:
                pass
            if time.time() > deadline or self.process.poll() is not None:
                sys.exit("%s did not start (log: %s)" % (self.label, self.log.name))
            time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM):
        """Stops the process; answers the seconds it took to exit, or None when it had not
        exited 120 s after the signal and was killed."""
        started = time.time()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                self.log.close()
                return None
        self.log.close()
        return time.time() - started

    @property
    def pid(self):
        return self.process.pid


def create(node, index, value):
    body = json.dumps({
        "name": "density-%d" % index, "description": "issue 33",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1",
                            "filter_expr": "root = this.token_address", "set_values": [value]}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}],
        },
    })
    status, created = call(node.base, "POST", "/api/v1/beam", body)
    assert status == 200, created
    return created["id"]


def deploy(node, pipeline, timeout):
    status, answer = call(node.base, "POST", "/api/v1/beam/%s/deploy" % pipeline, timeout=timeout)
    assert status == 200, answer
    return answer


def running(node, pipeline):
    try:
        status, stats = call(node.base, "GET", "/api/v1/beam/%s/deploy/stats" % pipeline, timeout=30)
    except OSError:
        return False
    if status != 200:
        return False
    workers = stats["workers_health"]["workers"]
    return bool(workers) and all(w["status"] == "Running" and w["is_ready"] for w in workers)


def pause_all(node, pipelines):
    for pipeline in pipelines:
        status, answer = call(node.base, "POST", "/api/v1/beam/%s/pause" % pipeline)
        assert status == 200, answer


def wait_all_running(node, pipelines, timeout, pool):
    """Seconds (from now) until each pipeline was seen with running workers; None when some
    never were within `timeout`. Each pipeline is polled until it is first seen running."""
    started = time.time()
    pending = list(pipelines)
    while pending:
        states = list(pool.map(lambda p: running(node, p), pending))
        pending = [p for p, ok in zip(pending, states) if not ok]
        if not pending:
            break
        if time.time() - started > timeout:
            return None, len(pending)
        time.sleep(0.1)
    return time.time() - started, 0


def density(args, binary, label, log):
    """Deploys, idles, restarts; answers a dict of figures."""
    figures = {}
    count = args.kafka_pipelines if log == "kafka" else args.pipelines
    broker = Broker(args, "%s-%s-density" % (label, log)) if log == "kafka" else None
    node = Node(args, binary, "%s-%s-density" % (label, log), broker)
    pool = ThreadPoolExecutor(max_workers=8)
    try:
        node.start()
        latencies, pipelines = [], []
        walled = None
        deploy_started = time.time()
        for index in range(count):
            pipeline = create(node, index, pipeline_value(index))
            started = time.perf_counter()
            try:
                deploy(node, pipeline, args.deploy_timeout)
            except OSError as error:
                walled = (index + 1, "%s after %.0f s" % (error.__class__.__name__, time.perf_counter() - started))
                print("  [%s %s] deploy %d did not answer within %d s: stopping the deploys here"
                      % (label, log, index + 1, args.deploy_timeout), flush=True)
                break
            latency = time.perf_counter() - started
            latencies.append(latency)
            pipelines.append(pipeline)
            if latency > args.deploy_timeout:
                walled = (index + 1, "took %.1f s" % latency)
                print("  [%s %s] deploy %d took %.1f s (over %d s): stopping the deploys here"
                      % (label, log, index + 1, latency, args.deploy_timeout), flush=True)
                break
            if (index + 1) % 100 == 0:
                window = [x * 1000 for x in latencies[-100:]]
                print("  [%s %s] deploys %d-%d: p50 %.1f ms, p99 %.1f ms, max %.1f ms; node threads %s"
                      % (label, log, index - 98, index + 1, percentile(window, 50),
                         percentile(window, 99), max(window), threads_and_rss(node.pid)[0]), flush=True)
        deploy_seconds = time.time() - deploy_started
        with open(os.path.join(args.out, "deploys-%s-%s.csv" % (label, log)), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["deploy", "latency_ms"])
            for i, latency in enumerate(latencies):
                writer.writerow([i + 1, "%.3f" % (latency * 1000)])
        last = [x * 1000 for x in latencies[-100:]]
        figures["pipelines deployed"] = len(pipelines)
        figures["walled at deploy"] = walled[0] if walled else None
        figures["deploys: total seconds"] = deploy_seconds
        figures["last 100 deploys p50 ms"] = percentile(last, 50)
        figures["last 100 deploys p99 ms"] = percentile(last, 99)
        print("  [%s %s] %d pipelines deployed in %.1f s%s; last 100 deploys p50 %.1f ms, p99 %.1f ms"
              % (label, log, len(pipelines), deploy_seconds,
                 " (walled at deploy %d: %s)" % walled if walled else "",
                 figures["last 100 deploys p50 ms"] or 0, figures["last 100 deploys p99 ms"] or 0),
              flush=True)

        time.sleep(args.settle_seconds)
        node_cpu = cpu_seconds(node.pid)
        broker_cpu = cpu_seconds(broker.process.pid) if broker else None
        started = time.time()
        time.sleep(args.idle_seconds)
        elapsed = time.time() - started
        threads, rss = threads_and_rss(node.pid)
        figures["idle: node threads"] = threads
        figures["idle: node RSS MiB"] = rss / 2**20
        figures["idle: node CPU % of a core"] = 100 * (cpu_seconds(node.pid) - node_cpu) / elapsed
        if broker:
            figures["idle: broker CPU % of a core"] = 100 * (cpu_seconds(broker.process.pid) - broker_cpu) / elapsed
            figures["idle: broker threads"], rss = threads_and_rss(broker.process.pid)
            figures["idle: broker RSS MiB"] = rss / 2**20
        print("  [%s %s] idle %.0f s: node %d threads, %.0f MiB RSS, %.1f %% of a core%s"
              % (label, log, elapsed, threads, figures["idle: node RSS MiB"],
                 figures["idle: node CPU % of a core"],
                 "; broker %.1f %% of a core" % figures["idle: broker CPU % of a core"] if broker else ""),
              flush=True)

        figures["restart: SIGTERM to exit s"] = node.stop()
        if figures["restart: SIGTERM to exit s"] is None:
            print("  [%s %s] restart: the node had not exited 120 s after SIGTERM; killed (SIGKILL)"
                  % (label, log), flush=True)
        ready, spawned = node.start()
        seconds, missing = wait_all_running(node, pipelines, args.restart_timeout, pool)
        figures["restart: start to /readyz s"] = ready
        if seconds is None:
            figures["restart: start to all running s"] = None
            print("  [%s %s] restart: %d of %d pipelines not running after %d s"
                  % (label, log, missing, len(pipelines), args.restart_timeout), flush=True)
        else:
            # From the process's spawn to the poll round that found the last pipeline running.
            figures["restart: start to all running s"] = time.time() - spawned
            print("  [%s %s] restart: SIGTERM exit in %s s; /readyz after %.1f s; all %d pipelines "
                  "running %.1f s after the start" % (label, log, fmt(figures["restart: SIGTERM to exit s"]),
                                                      ready, len(pipelines),
                                                      figures["restart: start to all running s"]), flush=True)
        return figures
    finally:
        pool.shutdown()
        node.stop()
        if broker:
            broker.stop()
        shutil.rmtree(node.data_dir, ignore_errors=True)


def generate(records, filters):
    """NDJSON bodies of 5,000 records each: record n carries pipeline (n % 1000)'s value when
    that is below `filters` (0.1 % of the records per pipeline), else one of 10,000 others."""
    timestamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    template = ('{"n":%d,"block_number":%d,"block_timestamp":"' + timestamp + '","transaction_hash":"0x%064x",'
                '"log_index":%d,"token_address":"%s","from_address":"0x2222222222222222222222222222222222222222",'
                '"to_address":"0x3333333333333333333333333333333333333333","amount_str":"1000000",'
                '"amount":1.0,"usd_amount":1.0}')
    values = [pipeline_value(i) for i in range(filters)]
    bodies = []
    for start in range(0, records, 5000):
        lines = []
        for n in range(start, min(records, start + 5000)):
            slot = n % 1000
            token = values[slot] if slot < filters else noise_value(n)
            lines.append(template % (n, 20_000_000 + n // 100, n, n % 50, token))
        bodies.append(("\n".join(lines) + "\n").encode())
    return bodies


def expected_count(records, index):
    return records // 1000 + (1 if index < records % 1000 else 0)


def drain(args, binary, label, log, filters, bodies, records, repeat=1):
    """A fresh node with `filters` pipelines, deployed then paused; the records appended
    `repeat` times; every pipeline resumed: answers (node CPU s, wall s, broker CPU s or None)
    until each sink holds its expected count, and the ingest rate."""
    tag = "%s-%s-drain%d" % (label, log, filters)
    broker = Broker(args, tag) if log == "kafka" else None
    node = Node(args, binary, tag, broker)
    pool = ThreadPoolExecutor(max_workers=8)
    try:
        node.start()
        pipelines = [create(node, i, pipeline_value(i)) for i in range(filters)]
        for pipeline in pipelines:
            deploy(node, pipeline, 600)
        # What resuming them costs with nothing to drain (the API calls, plans, workers
        # started): taken out of the drain's CPU below, so that the figure is the reading.
        wait_all_running(node, pipelines, 600, pool)
        pause_all(node, pipelines)
        resume_cpu = cpu_seconds(node.pid)
        with ThreadPoolExecutor(max_workers=args.resume_concurrency) as resuming:
            list(resuming.map(lambda p: deploy(node, p, 600), pipelines))
        wait_all_running(node, pipelines, 600, pool)
        resume_cpu = cpu_seconds(node.pid) - resume_cpu
        pause_all(node, pipelines)
        started = time.time()
        for _ in range(repeat):
            for body in bodies:
                status, answer = call(node.base, "POST", STREAM, body, timeout=300)
                assert status in (200, 202), answer
        ingest_seconds = time.time() - started
        time.sleep(2)
        node_cpu = cpu_seconds(node.pid)
        faults = minor_faults(node.pid)
        broker_cpu = cpu_seconds(broker.process.pid) if broker else None
        profile = start_profile(tag, node, broker)
        timeline = RssTimeline(node, args.rss_every) if args.rss_every else None
        started = time.time()
        # Resumed `--resume-concurrency` at a time (a restarted node resumes 16 at a time;
        # 1 is an operator resuming them one after another).
        with ThreadPoolExecutor(max_workers=args.resume_concurrency) as resuming:
            list(resuming.map(lambda p: deploy(node, p, 600), pipelines))
        pending = {p: repeat * expected_count(records, i) for i, p in enumerate(pipelines)}
        pending_all = dict(pending)
        records *= repeat

        def sink_holds(pipeline, expected):
            path = "/api/v1/beam/%s/sinks/sk-1/records?offset=%d&limit=1" % (pipeline, expected - 1)
            try:
                status, page = call(node.base, "GET", path, timeout=30)
            except OSError:
                return False
            return status == 200 and bool(page["records"])

        # The end of the drain: by default every pipeline's delivered count in one /metrics
        # read a tick. `--done-by sinks` reads the sinks themselves instead, one pending sink
        # at a time; on Kafka each sink topic read through the API makes a client of its own
        # (docs/operations.md), which costs the node more CPU than the drain it watches.
        while pending:
            if args.done_by == "sinks":
                pipeline, expected = next(iter(pending.items()))
                if sink_holds(pipeline, expected):
                    del pending[pipeline]
                    continue
            else:
                sent = delivered_counts(node)
                for pipeline, expected in list(pending.items()):
                    if sent.get(pipeline, 0) >= expected:
                        del pending[pipeline]
                if not pending:
                    break
            if time.time() - started > args.drain_timeout:
                print("  [%s] %d sinks incomplete after %d s" % (tag, len(pending), args.drain_timeout), flush=True)
                return None
            time.sleep(0.1)
        wall = time.time() - started
        stop_profile(profile)
        if timeline:
            print("  [%s] RSS timeline: %s" % (tag, timeline.stop()), flush=True)
        node_cpu = cpu_seconds(node.pid) - node_cpu
        faults = minor_faults(node.pid) - faults
        # Rounds (batches through the transforms, each a delivery and a commit) per pipeline:
        # what the per-pipeline cost of the drain scales with.
        rounds = sum(delivered_counts(node, "sluice_pipeline_processing_latency_seconds_count").values())
        broker_cpu = cpu_seconds(broker.process.pid) - broker_cpu if broker else None
        # Outside the measured window: every sink holds exactly its expected records.
        for pipeline, expected in pending_all.items():
            assert sink_holds(pipeline, expected), "sink of %s is short of %d records" % (pipeline, expected)
            assert not sink_holds(pipeline, expected + 1), "sink of %s holds more than %d" % (pipeline, expected)
        print("  [%s] %d records drained by %d pipeline(s) in %.1f s: node %.1f CPU s (%.0f records per "
              "CPU second), of which resuming them %.1f CPU s (%.0f records per CPU second without)%s; "
              "%.1f rounds per pipeline; %d minor faults, peak RSS %.0f MiB; ingest %.0f records/s"
              % (tag, records, filters, wall, node_cpu, records / node_cpu, resume_cpu,
                 records / max(node_cpu - resume_cpu, 0.01),
                 "; broker %.1f CPU s" % broker_cpu if broker else "", rounds / filters,
                 faults, peak_rss_mib(node.pid), records / ingest_seconds), flush=True)
        return node_cpu, wall, broker_cpu, records / ingest_seconds, resume_cpu
    finally:
        pool.shutdown()
        node.stop()
        if broker:
            broker.stop()
        shutil.rmtree(node.data_dir, ignore_errors=True)


def delivered_counts(node, metric="sluice_pipeline_messages_sent_total"):
    """Records each pipeline delivered to its sink, by id (`/metrics`); or another
    per-pipeline counter of `/metrics`."""
    status, text = call(node.base, "GET", "/metrics", timeout=30)  # text: not JSON
    assert status == 200, text
    prefix = metric + '{config_id="'
    counts = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            pipeline, _, value = line[len(prefix):].partition('"}')
            counts[pipeline] = int(float(value))
    return counts


def start_profile(tag, node, broker):
    """With BENCH_DENSITY_PERF_DIR set, `perf record` of the node (and the broker) during the
    drain, into that directory (`perf report -i DIR/TAG-node.data`): CPU samples, or each
    event BENCH_DENSITY_PERF_EVENT names (`page-faults`: where fresh memory is first
    touched)."""
    out = os.environ.get("BENCH_DENSITY_PERF_DIR")
    if not out:
        return []
    event = os.environ.get("BENCH_DENSITY_PERF_EVENT")
    sampling = ["-e", event] if event else ["-F", "499"]
    targets = [("node", node.pid)] + ([("broker", broker.process.pid)] if broker else [])
    return [subprocess.Popen(["perf", "record", "-q"] + sampling + ["-g", "-p", str(pid), "-o",
                              os.path.join(out, "%s-%s.data" % (tag, name))],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for name, pid in targets]


def stop_profile(profile):
    for process in profile:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def throughput(args, binary, label, log, bodies, records):
    figures = {}
    many = drain(args, binary, label, log, args.filters, bodies, records)
    # One pipeline drains the same records several times over, so that its drain lasts long
    # enough for the node's CPU counters (10 ms ticks) and its background work not to matter.
    one = drain(args, binary, label, log, 1, bodies, records, args.single_repeat)
    for name, result, fed in (("%d pipelines" % args.filters, many, records),
                              ("1 pipeline", one, records * args.single_repeat)):
        if result is None:
            figures["drain, %s: records per node CPU s" % name] = None
            continue
        node_cpu, wall, broker_cpu, ingest, resume_cpu = result
        figures["drain, %s: records per node CPU s" % name] = fed / node_cpu
        figures["drain, %s: records per node CPU s, resuming taken out" % name] = (
            fed / max(node_cpu - resume_cpu, 0.01))
        figures["drain, %s: records/s (wall)" % name] = fed / wall
        if broker_cpu is not None:
            figures["drain, %s: broker CPU s" % name] = broker_cpu
        figures["ingest records/s (%s node)" % name] = ingest
    if many and one:
        for suffix in ("", ", resuming taken out"):
            figures["drain: %d pipelines / 1 pipeline (per CPU s%s)" % (args.filters, suffix)] = (
                figures["drain, %d pipelines: records per node CPU s%s" % (args.filters, suffix)]
                / figures["drain, 1 pipeline: records per node CPU s%s" % suffix])
    return figures


def fmt(value):
    if value is None:
        return "—"
    if isinstance(value, float):
        return "%.3g" % value if abs(value) < 100 else "{:,.0f}".format(value)
    return "{:,}".format(value)


def stop_on_signal(signum, _frame):
    # SystemExit runs every `finally`, so nodes and brokers are stopped; a script started in
    # the background has SIGINT ignored, which Python would otherwise keep.
    sys.exit(128 + signum)


def main():
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", required=True, help="the sluice binary under test")
    parser.add_argument("--baseline", help="the previous build's sluice binary, run in the same run")
    parser.add_argument("--tansu", required=True)
    parser.add_argument("--tmp", required=True)
    parser.add_argument("--out", required=True, help="directory for the per-deploy latencies (CSV)")
    parser.add_argument("--logs", default="embedded,kafka", help="embedded, kafka or both (default)")
    parser.add_argument("--pipelines", type=int, default=1000)
    parser.add_argument("--kafka-pipelines", type=int, help="pipelines on Kafka (default: --pipelines)")
    parser.add_argument("--deploy-timeout", type=float, default=60,
                        help="a deploy slower than this stops the deploys there (walled)")
    parser.add_argument("--settle-seconds", type=float, default=5)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--restart-timeout", type=float, default=600)
    parser.add_argument("--filters", type=int, default=100, help="pipelines of the throughput mode")
    parser.add_argument("--records", type=int, default=1_000_000, help="records of the throughput mode")
    parser.add_argument("--kafka-records", type=int, default=100_000,
                        help="records of the throughput mode on Kafka")
    parser.add_argument("--drain-timeout", type=float, default=1200)
    parser.add_argument("--single-repeat", type=int, default=5,
                        help="the single pipeline drains the records this many times over")
    parser.add_argument("--resume-concurrency", type=int, default=16,
                        help="throughput mode: pipelines resumed at once for the drain (default 16, "
                             "as a restarted node resumes them; 1 = one after another)")
    parser.add_argument("--done-by", choices=("metrics", "sinks"), default="metrics",
                        help="throughput mode: how the drain's end is seen: each pipeline's "
                             "delivered count in /metrics (default), or reading the sinks")
    parser.add_argument("--rss-every", type=float, default=0,
                        help="seconds between samples of the node's RSS during each drain (0: none)")
    parser.add_argument("--modes", default="density,throughput")
    args = parser.parse_args()
    if args.kafka_pipelines is None:
        args.kafka_pipelines = args.pipelines
    if args.filters > 1000:
        sys.exit("--filters is at most 1000 (each matches 0.1 % of the records)")
    logs = [log for log in args.logs.split(",") if log]
    modes = [mode for mode in args.modes.split(",") if mode]
    builds = [("candidate", args.candidate)]
    if args.baseline:
        builds.insert(0, ("baseline", args.baseline))
    os.makedirs(args.out, exist_ok=True)
    print("cores: %d; load average at start: %s; builds: %s"
          % (os.cpu_count(), " ".join(open("/proc/loadavg").read().split()[:3]),
             ", ".join("%s = %s" % b for b in builds)), flush=True)
    results = {}
    for log in logs:
        bodies, records = None, None
        if "throughput" in modes:
            records = args.kafka_records if log == "kafka" else args.records
            bodies = generate(records, args.filters)
        for label, binary in builds:
            print("== %s, %s log" % (label, log), flush=True)
            figures = {}
            if "density" in modes:
                figures.update(density(args, binary, label, log))
            if "throughput" in modes:
                figures.update(throughput(args, binary, label, log, bodies, records))
            results[(label, log)] = figures

    print()
    for log in logs:
        names = []
        for label, _ in builds:
            for name in results[(label, log)]:
                if name not in names:
                    names.append(name)
        print("## %s log" % log)
        if args.baseline:
            print("| figure | baseline | candidate | candidate / baseline |")
            print("|---|---|---|---|")
        else:
            print("| figure | candidate |")
            print("|---|---|")
        for name in names:
            candidate = results[("candidate", log)].get(name)
            if args.baseline:
                baseline = results[("baseline", log)].get(name)
                ratio = (candidate / baseline if isinstance(candidate, (int, float)) and
                         isinstance(baseline, (int, float)) and baseline else None)
                print("| %s | %s | %s | %s |" % (name, fmt(baseline), fmt(candidate),
                                                 "%.2f×" % ratio if ratio is not None else "—"))
            else:
                print("| %s | %s |" % (name, fmt(candidate)))
        print()
    with open(os.path.join(args.out, "figures.json"), "w") as f:
        json.dump({"%s/%s" % key: value for key, value in results.items()}, f, indent=1)
    print("per-deploy latencies and figures.json in %s" % args.out)


if __name__ == "__main__":
    main()
