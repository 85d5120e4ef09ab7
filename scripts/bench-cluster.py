"""Driver of scripts/bench-cluster (standard library only): starts sluice nodes pinned to
cores, drains one CPU-bound pipeline with 1 and with 2 nodes, and times a failover
(--mode scaling, the default); or, with --mode failover-many, deploys hundreds of set-filter
pipelines on two nodes under a steady feed, kills one node with SIGKILL and measures the
failover and the deliveries (issue 33)."""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import cluster  # noqa: E402
from cluster import free_port, load_average, log_summary, percentile, proc_figures  # noqa: E402

KEY = "slk_benchcluster000000000000000000000000000000"
SECRETS_KEY = "5e" * 32
USDC = "0x833589fcd6edb6e08f4c7c32d4f71b54bda02913"
# A fixed amount of arithmetic per record: the pipeline is bound by the script, not by I/O.
SCRIPT = (
    "function transform(record) { let h = 0; for (let i = 0; i < %d; i++) { h = (h * 31 + i) | 0; }"
    " return {n: record.n, h: h}; }"
)


def call(method, url, body=None, timeout=120):
    return cluster.call(method, url, body, timeout, key=KEY)


def records(start, count):
    lines = []
    for n in range(start, start + count):
        lines.append(json.dumps({
            "n": n,
            "block_number": 5000 + n // 10,
            "block_timestamp": "2026-11-26T12:00:00Z",
            "transaction_hash": "0x%064x" % n,
            "log_index": n % 10,
            "token_address": USDC,
            "from_address": "0x2222222222222222222222222222222222222222",
            "to_address": "0x3333333333333333333333333333333333333333",
        }))
    return "\n".join(lines) + "\n"


class Node:
    def __init__(self, args, name, port, core, database_url, prefix, data_dir, sets=None):
        self.base = "http://127.0.0.1:%d" % port
        self.name = name
        self.log_path = data_dir + ".log"
        command = [
            "taskset", "-c", str(core), args.bin, "serve",
            "--data-dir", data_dir, "--listen", "127.0.0.1:%d" % port,
            "--database-url", database_url, "--bus", args.kafka, "--bus-topic-prefix", prefix,
            "--node-name", name, "--node-timeout-secs", str(args.node_timeout),
            "--secrets-key", SECRETS_KEY,
        ]
        if sets:
            command += ["--sets", sets]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        env["SLUICE_BOOTSTRAP_API_KEY"] = KEY
        env["SLUICE_LOG"] = "warn"
        self.log = open(os.path.join(data_dir + ".log"), "w")
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        while True:
            try:
                if call("GET", self.base + "/readyz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or self.process.poll() is not None:
                sys.exit("node %s did not start (log: %s.log)" % (name, data_dir))
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=60)
        self.log.close()


def wait_for_nodes(base, count):
    deadline = time.time() + 30
    while len(call("GET", base + "/api/v1/nodes")[1]["items"]) != count:
        if time.time() > deadline:
            sys.exit("the nodes did not see each other")
        time.sleep(0.1)


def workers(base, pipeline):
    _, stats = call("GET", "%s/api/v1/beam/%s/deploy/stats" % (base, pipeline))
    return [(w["name"], w.get("node")) for w in stats["workers_health"]["workers"]]


def fresh_database(args, name):
    subprocess.run([os.path.join(args.pg_bin, "createdb"), "-h", "127.0.0.1", "-p", str(args.pg_port),
                    "-U", "postgres", name], check=True)
    return "postgres://postgres@127.0.0.1:%d/%s" % (args.pg_port, name)


def start_nodes(args, run, count, sets=None):
    database_url = fresh_database(args, "bench_%s" % run)
    prefix = "bench%s." % run
    nodes = []
    for index in range(count):
        port = free_port()
        data_dir = os.path.join(args.tmp, "%s-node%d" % (run, index))
        os.makedirs(data_dir)
        nodes.append(Node(args, "node-%d" % index, port, index % os.cpu_count(), database_url, prefix, data_dir,
                          sets))
    wait_for_nodes(nodes[0].base, count)
    return nodes


def create_pipeline(args, base):
    body = {
        "name": "cpu", "description": "a CPU-bound script", "pod_size": "L",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "v8", "uid": "tf-js", "script": SCRIPT % args.iterations}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}],
        },
    }
    status, created = call("POST", base + "/api/v1/beam", json.dumps(body))
    assert status == 200, created
    return created["id"]


def ingest(base, start, count):
    url = base + "/api/v1/streams/base/erc20_token_transfer/records"
    sent = 0
    while sent < count:
        chunk = min(5000, count - sent)
        status, body = call("POST", url, records(start + sent, chunk))
        assert status == 200, body
        sent += chunk


def drain(args, run, count):
    """Seconds for `count` nodes to run args.records records through the pipeline."""
    nodes = start_nodes(args, run, count)
    base = nodes[0].base
    try:
        pipeline = create_pipeline(args, base)
        # Deployed (offsets pinned at the end), paused, then the records: resuming starts a
        # backlog of exactly them.
        assert call("POST", "%s/api/v1/beam/%s/deploy" % (base, pipeline))[0] == 200
        assert call("POST", "%s/api/v1/beam/%s/pause" % (base, pipeline))[0] == 200
        ingest(base, 0, args.records)
        started = time.time()
        status, body = call("POST", "%s/api/v1/beam/%s/deploy" % (base, pipeline))
        assert status == 200, body
        last = "%s/api/v1/beam/%s/sinks/sk-1/records?offset=%d&limit=1&wait_ms=1000" % (
            base, pipeline, args.records - 1)
        while True:
            status, page = call("GET", last)
            if status == 200 and page["records"]:
                break
            time.sleep(0.05)
        seconds = time.time() - started
        owners = sorted({node for _, node in workers(base, pipeline)})
        return seconds, owners
    finally:
        for node in nodes:
            node.stop()


def failover(args, run):
    """Seconds from kill -9 of the node running workers to all of them running on the other."""
    nodes = start_nodes(args, run, 2)
    try:
        pipeline = create_pipeline(args, nodes[0].base)
        assert call("POST", "%s/api/v1/beam/%s/deploy" % (nodes[0].base, pipeline))[0] == 200
        stop = threading.Event()

        def feed():
            n = 0
            while not stop.is_set():
                try:
                    ingest(nodes[0].base, n, 100)
                except (AssertionError, OSError):
                    pass
                n += 100
                time.sleep(0.05)

        feeder = threading.Thread(target=feed)
        feeder.start()
        time.sleep(2)
        nodes[1].stop(signal.SIGKILL)
        killed = time.time()
        while True:
            owners = {node for _, node in workers(nodes[0].base, pipeline)}
            if owners == {"node-0"} and len(workers(nodes[0].base, pipeline)) == 4:
                break
            time.sleep(0.05)
        seconds = time.time() - killed
        stop.set()
        feeder.join()
        return seconds
    finally:
        for node in nodes:
            node.stop()


# --mode failover-many (issue 33): hundreds of set-filter pipelines on two nodes, one killed.

TEMPLATE = ('{"n":%d,"block_number":%d,"block_timestamp":"%s","transaction_hash":"0x%064x",'
            '"log_index":%d,"token_address":"%s","from_address":"0x2222222222222222222222222222222222222222",'
            '"to_address":"0x3333333333333333333333333333333333333333","amount_str":"1000000",'
            '"amount":1.0,"usd_amount":1.0}')


def pipeline_value(index):
    """The set-filter value of pipeline `index` (as scripts/bench-density.py)."""
    return "0xde%038x" % index


def noise_value(n):
    return "0xbe%038x" % (n % 10_000)


def record_key(n):
    """The stable key a sink gives record n: `transaction_hash:log_index`."""
    return "0x%064x:%d" % (n, n % 50)


def serve_pid(node):
    """The pid of `sluice serve` under `taskset` (taskset execs it: the same pid)."""
    return node.process.pid


def create_set_pipeline(base, index):
    body = {
        "name": "many-%d" % index, "description": "issue 33 failover",
        "pipeline_config": {
            "source": {"chain": "base", "entity": "erc20_token_transfer"},
            "transforms": [{"type": "redis_set_filter", "uid": "tf-1",
                            "filter_expr": "root = this.token_address", "set_values": [pipeline_value(index)]}],
            "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}],
        },
    }
    status, created = call("POST", base + "/api/v1/beam", json.dumps(body))
    assert status == 200, (status, created)
    return created["id"]


def placement_of(base, pipeline):
    """(all workers Running and ready, the set of nodes they run on) from …/deploy/stats."""
    try:
        status, stats = call("GET", "%s/api/v1/beam/%s/deploy/stats" % (base, pipeline), timeout=30)
    except OSError:
        return False, set()
    if status != 200:
        return False, set()
    workers = stats["workers_health"]["workers"]
    ok = bool(workers) and all(w["status"] == "Running" and w["is_ready"] for w in workers)
    return ok, {w.get("node") for w in workers}


class Feed:
    """A steady feed into base.erc20_token_transfer through the API: every 0.1 s a request of
    rate/10 records, a share of them carrying the values of the checked pipelines in turn, the
    rest values no pipeline has. Requests alternate between the nodes while both live. Each
    record is remembered with the pipeline it matches and whether its request was
    acknowledged (`{"accepted": count}`)."""

    def __init__(self, nodes, checked, rate, matching):
        self.nodes = list(nodes)
        self.checked = checked  # [(pipeline index, pipeline id)]
        self.per_round = max(1, rate // 10)
        self.matching = max(1, int(round(self.per_round * matching))) if checked else 0
        self.records = {}  # n -> (checked slot or None, acknowledged)
        self.errors = []
        self.requests = 0
        self.next = 0
        self.turn = 0
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.started = None

    def drop(self, node):
        """Stops sending to `node` (killed)."""
        with self.lock:
            self.nodes = [n for n in self.nodes if n is not node]

    def run(self):
        self.started = time.time()
        tick = self.started
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        while not self.stop_event.is_set():
            with self.lock:
                node = self.nodes[self.turn % len(self.nodes)]
            self.turn += 1
            lines, slots = [], []
            for j in range(self.per_round):
                n = self.next + j
                if j < self.matching:
                    slot = n % len(self.checked)
                    token = pipeline_value(self.checked[slot][0])
                else:
                    slot, token = None, noise_value(n)
                slots.append(slot)
                lines.append(TEMPLATE % (n, 20_000_000 + n // 100, stamp, n, n % 50, token))
            first = self.next
            self.next += self.per_round
            body = "\n".join(lines) + "\n"
            acked = False
            try:
                status, answer = call("POST", node.base + "/api/v1/streams/base/erc20_token_transfer/records",
                                      body, timeout=30)
                acked = status in (200, 202) and isinstance(answer, dict) and answer.get("accepted") == len(lines)
                if not acked:
                    self.errors.append("%s: %s %s" % (node.name, status, str(answer)[:200]))
            except OSError as error:
                self.errors.append("%s: %s" % (node.name, error))
            self.requests += 1
            for j, slot in enumerate(slots):
                self.records[first + j] = (slot, acked)
            tick += 0.1
            delay = tick - time.time()
            if delay > 0:
                time.sleep(delay)
            else:
                tick = time.time()  # behind: no burst to catch up

    def start(self):
        self.thread.start()

    def stop(self):
        self.stop_event.set()
        self.thread.join()
        self.seconds = time.time() - self.started


def read_sink(base, pipeline, offset, seen, foreign):
    """Reads a managed sink from `offset` to its end; answers the next offset."""
    while True:
        status, page = call("GET", "%s/api/v1/beam/%s/sinks/sk-1/records?offset=%d&limit=10000"
                            % (base, pipeline, offset), timeout=60)
        assert status == 200, (status, page)
        for record in page["records"]:
            value = record.get("value")
            n = value.get("n") if isinstance(value, dict) else None
            if isinstance(n, int) and record.get("key") == record_key(n):
                seen[n] = seen.get(n, 0) + 1
            else:
                foreign.append(json.dumps(record)[:300])
        offset = page["next_offset"]
        if not page["records"]:
            return offset


def failover_many(args):
    """N set-filter pipelines on two nodes under a steady feed; kill -9 of one; seconds until
    every pipeline runs its workers on the survivor; deliveries of the checked pipelines."""
    run = "many%d" % args.pipelines
    sets = "%s?prefix=bench%s" % (args.redis, run)
    print("failover-many: %d pipelines, node timeout %d s, feed %d records/s (%.0f %% matching %d checked "
          "pipelines); load average at start: %s"
          % (args.pipelines, args.node_timeout, args.feed_rate, 100 * args.matching, args.checked, load_average()),
          flush=True)
    nodes = start_nodes(args, run, 2, sets)
    survivor, victim = nodes[0], nodes[1]
    pool = ThreadPoolExecutor(max_workers=8)
    feed = None
    figures = {}
    try:
        # Create and deploy through the API, calls alternating between the nodes, a few at a
        # time; where each runs is the service's own placement.
        def make(index):
            node = nodes[index % 2]
            pipeline = create_set_pipeline(node.base, index)
            started = time.time()
            status, answer = call("POST", "%s/api/v1/beam/%s/deploy" % (node.base, pipeline), timeout=120)
            assert status == 200, (status, answer)
            return pipeline, time.time() - started

        started = time.time()
        with ThreadPoolExecutor(max_workers=args.deploy_concurrency) as deployers:
            made = list(deployers.map(make, range(args.pipelines)))
        pipelines = [pipeline for pipeline, _ in made]
        latencies = [seconds * 1000 for _, seconds in made]
        print("deployed %d pipelines in %.1f s (%d calls at a time): deploy p50 %.0f ms, p99 %.0f ms, max %.0f ms"
              % (len(pipelines), time.time() - started, args.deploy_concurrency, percentile(latencies, 50),
                 percentile(latencies, 99), max(latencies)), flush=True)

        # Every pipeline running somewhere; where.
        deadline = time.time() + 300
        where = {}
        pending = list(range(len(pipelines)))
        while pending:
            states = list(pool.map(lambda i: placement_of(survivor.base, pipelines[i]), pending))
            for i, (ok, owners) in zip(pending, states):
                if ok and len(owners) == 1:
                    where[i] = next(iter(owners))
            pending = [i for i in pending if i not in where]
            if pending and time.time() > deadline:
                sys.exit("%d pipelines not running 300 s after their deploys" % len(pending))
            if pending:
                time.sleep(0.5)
        on_victim = [i for i in range(len(pipelines)) if where[i] == victim.name]
        on_survivor = [i for i in range(len(pipelines)) if where[i] == survivor.name]
        print("placement: %s %d pipelines, %s %d" % (survivor.name, len(on_survivor), victim.name, len(on_victim)),
              flush=True)
        for node in nodes:
            threads, rss, _ = proc_figures(serve_pid(node))
            print("before the kill: %s %d threads, %.0f MiB RSS" % (node.name, threads, rss), flush=True)

        # The checked pipelines: half of them among the killed node's, half among the other's.
        # (When one side has fewer, the other makes up the count: --checked N checks them all.)
        take_victim = min(len(on_victim), args.checked - min(args.checked // 2, len(on_survivor)))
        chosen = on_victim[:take_victim] + on_survivor[:args.checked - take_victim]
        checked = [(i, pipelines[i]) for i in chosen]
        feed = Feed(nodes, checked, args.feed_rate, args.matching)
        feed.start()
        time.sleep(args.warmup)
        if len(feed.errors) > 0:
            print("feed errors before the kill: %d (first: %s)" % (len(feed.errors), feed.errors[0]), flush=True)

        load_at_kill = load_average()
        feed.drop(victim)  # from now on the feed goes to the survivor (a request in flight may be cut)
        victim.process.send_signal(signal.SIGKILL)
        killed = time.time()
        victim.process.wait()
        print("kill -9 of %s (%d pipelines) at %s UTC; load average %s"
              % (victim.name, len(on_victim), time.strftime("%H:%M:%S", time.gmtime(killed)), load_at_kill), flush=True)

        # The survivor's view of the nodes: when the killed one leaves it (the node timeout).
        detected = {}
        watching = threading.Event()

        def watch():
            while not watching.is_set():
                try:
                    status, body = call("GET", survivor.base + "/api/v1/nodes", timeout=10)
                    if status == 200:
                        names = {item["name"] for item in body["items"]}
                        if "gone" not in detected and victim.name not in names:
                            detected["gone"] = time.time() - killed
                        mine = [item for item in body["items"] if item["name"] == survivor.name]
                        if mine and "all listed" not in detected and len(mine[0]["workers"]) >= len(pipelines):
                            detected["all listed"] = time.time() - killed
                except (OSError, KeyError, TypeError) as error:
                    detected.setdefault("errors", []).append(repr(error))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        # Each pipeline polled (…/deploy/stats on the survivor) until its workers all run
        # there, ready; the time is when that answer arrived.
        back = {}
        pending = list(range(len(pipelines)))
        while pending:
            def probe(i):
                ok, owners = placement_of(survivor.base, pipelines[i])
                return ok and owners == {survivor.name}, time.time() - killed
            results = list(pool.map(probe, pending))
            for i, (ok, at) in zip(pending, results):
                if ok:
                    back[i] = at
            pending = [i for i in pending if i not in back]
            if pending and time.time() - killed > args.failover_timeout:
                break
            if pending:
                time.sleep(0.2)
        all_back = max(back.values()) if not pending else None
        moved = [back[i] for i in on_victim if i in back]
        until = time.time() + 5
        while not ("gone" in detected and "all listed" in detected) and time.time() < until:
            time.sleep(0.1)
        watching.set()
        watcher.join()
        if pending:
            print("NOT BACK: %d pipelines not running on %s %d s after the kill: %s"
                  % (len(pending), survivor.name, args.failover_timeout,
                     ", ".join(pipelines[i] for i in pending[:10])), flush=True)
        else:
            print("failover: every one of the %d pipelines runs on %s %.1f s after the kill -9 "
                  "(node timeout %d s); the %d moved ones first seen running after %.1f–%.1f s (p50 %.1f s); "
                  "%s dropped from the survivor's node list after %s s, all %d workers listed after %s s"
                  % (len(pipelines), survivor.name, all_back, args.node_timeout, len(moved),
                     min(moved) if moved else 0, max(moved) if moved else 0, percentile(moved, 50) or 0,
                     victim.name, "%.1f" % detected["gone"] if "gone" in detected else "?", len(pipelines),
                     "%.1f" % detected["all listed"] if "all listed" in detected else "?"), flush=True)
        if detected.get("errors"):
            print("GET /api/v1/nodes failed %d times (first: %s)" % (len(detected["errors"]), detected["errors"][0]),
                  flush=True)
        figures["failover s"] = all_back

        # The feed goes on; then the survivor's threads, RSS and CPU with all N.
        cpu_before = proc_figures(serve_pid(survivor))[2]
        window = time.time()
        time.sleep(args.after_seconds)
        threads, rss, cpu = proc_figures(serve_pid(survivor))
        print("survivor carrying all %d: %d threads, %.0f MiB RSS, %.0f %% of a core over %.0f s of feed; "
              "load average %s" % (len(pipelines), threads, rss, 100 * (cpu - cpu_before) / (time.time() - window),
                                   time.time() - window, load_average()), flush=True)
        feed.stop()
        acked = sum(1 for _, ok in feed.records.values() if ok)
        print("feed: %d records in %d requests over %.1f s (%.0f records/s), %d acknowledged, %d requests not "
              "acknowledged%s" % (len(feed.records), feed.requests, feed.seconds, len(feed.records) / feed.seconds,
                                  acked, len(feed.errors),
                                  " (e.g. %s)" % feed.errors[0] if feed.errors else ""), flush=True)

        # Deliveries: every acknowledged record of a checked pipeline's value in its sink.
        expected = {i: set() for i, _ in checked}
        unacked = {i: set() for i, _ in checked}
        for n, (slot, ok) in feed.records.items():
            if slot is None:
                continue
            index = checked[slot][0]
            (expected if ok else unacked)[index].add(n)
        offsets = {i: 0 for i, _ in checked}
        seen = {i: {} for i, _ in checked}
        foreign = {i: [] for i, _ in checked}
        deadline = time.time() + args.delivery_timeout
        incomplete = [i for i, _ in checked]
        while True:
            def drain(i):
                offsets[i] = read_sink(survivor.base, pipelines[i], offsets[i], seen[i], foreign[i])
            list(pool.map(drain, incomplete))
            incomplete = [i for i in incomplete if not expected[i] <= seen[i].keys()]
            if not incomplete or time.time() > deadline:
                break
            time.sleep(1)
        lost = {i: sorted(expected[i] - seen[i].keys()) for i, _ in checked}
        duplicates = {i: sum(c - 1 for n, c in seen[i].items() if c > 1) for i, _ in checked}
        wrong = {i: sorted(n for n in seen[i] if n not in expected[i] and n not in unacked[i]) for i, _ in checked}
        for group, members in (("moved (were on %s)" % victim.name, [i for i, _ in checked if i in on_victim]),
                               ("stayed (on %s)" % survivor.name, [i for i, _ in checked if i in on_survivor])):
            print("deliveries, %d checked pipelines that %s: %d acknowledged records expected, %d delivered "
                  "(distinct), %d LOST, %d duplicates (in %d pipelines), %d unacknowledged records delivered, "
                  "%d records of other values, %d unreadable"
                  % (len(members), group, sum(len(expected[i]) for i in members),
                     sum(len(expected[i] & seen[i].keys()) for i in members),
                     sum(len(lost[i]) for i in members), sum(duplicates[i] for i in members),
                     sum(1 for i in members if duplicates[i]),
                     sum(len(unacked[i] & seen[i].keys()) for i in members),
                     sum(len(wrong[i]) for i in members), sum(len(foreign[i]) for i in members)), flush=True)
        for i, _ in checked:
            if lost[i]:
                print("  LOST in %s (pipeline %d, on %s before the kill): %d records, n = %s"
                      % (pipelines[i], i, where[i], len(lost[i]), lost[i][:20]), flush=True)
        figures["lost"] = sum(len(v) for v in lost.values())
        figures["duplicates"] = sum(duplicates.values())

        # Once more, after the feed: is every pipeline still running on the survivor?
        states = list(pool.map(lambda p: placement_of(survivor.base, p), pipelines))
        not_running = [p for p, (ok, owners) in zip(pipelines, states) if not (ok and owners == {survivor.name})]
        print("at the end: %d of %d pipelines running on %s%s"
              % (len(pipelines) - len(not_running), len(pipelines), survivor.name,
                 " (not: %s)" % ", ".join(not_running[:10]) if not_running else ""), flush=True)
        return figures
    finally:
        if feed is not None and not feed.stop_event.is_set():
            feed.stop_event.set()
        pool.shutdown()
        for node in nodes:
            node.stop()
        os.makedirs(args.out, exist_ok=True)
        for node in nodes:
            errors, warnings, firsts = log_summary(node.log_path)
            print("%s log: %d error lines, %d warning lines%s"
                  % (node.name, errors, warnings, "".join("\n    " + m for m in firsts)), flush=True)
            shutil.copy(node.log_path, os.path.join(args.out, "%s-%s.log" % (run, node.name)))
        print("node logs in %s" % args.out, flush=True)


SPIN = "import time\nt = time.time(); h = 0\nfor i in range(20_000_000): h = (h * 31 + i) & 0xffffffff\nprint(time.time() - t)"


def machine_scaling():
    """What this machine gives two busy processes on cores 0 and 1 against one alone: the
    ceiling of any 1 -> 2 node speed-up measured here (shared hosts give less than 2x)."""
    def spin(cores):
        runs = [subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", SPIN],
                                 stdout=subprocess.PIPE, text=True) for core in cores]
        return [float(run.communicate()[0]) for run in runs]
    alone = spin([0])[0]
    together = spin([0, 1])
    return 2 * alone / max(together)


def main():
    parser = argparse.ArgumentParser()
    for name in ("bin", "kafka", "pg_bin", "tmp"):
        parser.add_argument("--" + name.replace("_", "-"), required=True)
    parser.add_argument("--pg-port", type=int, required=True)
    parser.add_argument("--mode", choices=("scaling", "failover-many"), default="scaling")
    parser.add_argument("--records", type=int, default=40000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--node-timeout", type=int, default=10)
    many = parser.add_argument_group("--mode failover-many")
    many.add_argument("--redis", help="the private Redis (redis://…) the nodes keep set values in")
    many.add_argument("--out", default="/tmp/bench-cluster-out", help="where the node logs are copied")
    many.add_argument("--pipelines", type=int, default=300)
    many.add_argument("--deploy-concurrency", type=int, default=4, help="create+deploy calls at a time")
    many.add_argument("--checked", type=int, default=60,
                      help="pipelines whose deliveries are checked, half of them on the killed node")
    many.add_argument("--feed-rate", type=int, default=300, help="records/s into the stream")
    many.add_argument("--matching", type=float, default=1 / 3,
                      help="share of the feed carrying a checked pipeline's value")
    many.add_argument("--warmup", type=float, default=10, help="seconds of feed before the kill")
    many.add_argument("--after-seconds", type=float, default=15,
                      help="seconds of feed after every pipeline is back")
    many.add_argument("--failover-timeout", type=float, default=300)
    many.add_argument("--delivery-timeout", type=float, default=180)
    args = parser.parse_args()
    if args.mode == "failover-many":
        if not args.redis:
            sys.exit("--mode failover-many needs --redis")
        if not 0 < args.checked <= args.pipelines:
            sys.exit("--checked is between 1 and --pipelines")
        failover_many(args)
        return
    results = {1: [], 2: []}
    for round_ in range(args.rounds):
        # Alternating order, so a drift of the machine's load does not favour one side.
        for count in ((1, 2) if round_ % 2 == 0 else (2, 1)):
            seconds, owners = drain(args, "r%dn%d" % (round_, count), count)
            rate = args.records / seconds
            results[count].append(rate)
            print("round %d, %d node(s) %s: %d records in %.2f s = %.0f records/s"
                  % (round_ + 1, count, owners, args.records, seconds, rate), flush=True)
    ceilings = [machine_scaling() for _ in range(2)]
    ceiling = sum(ceilings) / len(ceilings)
    print("machine: two busy processes on cores 0 and 1 do %.2fx the work of one (runs: %s)"
          % (ceiling, ", ".join("%.2f" % c for c in ceilings)))
    for round_ in range(len(results[1])):
        ratio = results[2][round_] / results[1][round_]
        print("round %d: 2 nodes / 1 node = %.2fx (%.0f%% of the machine's %.2fx)"
              % (round_ + 1, ratio, 100 * ratio / ceiling, ceiling))
    seconds = failover(args, "failover")
    print("failover: kill -9 of a node -> its workers on the other after %.1f s (node timeout %d s)"
          % (seconds, args.node_timeout), flush=True)


if __name__ == "__main__":
    main()
