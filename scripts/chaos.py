"""Driver of scripts/chaos (standard library only; RELIABILITY.md, "Chaos" says what it does
and what it checks).

It starts a cluster on loopback — three `sluice serve` nodes, PostgreSQL, the Kafka-API broker
(tansu, keeping its data in moto's S3 so that a restart loses nothing), Redis and moto — with a
fault proxy (scripts/lib/faultproxy.py) in front of PostgreSQL, the broker and Redis. It feeds
records into base.erc20_token_transfer through the API, runs pipelines of mixed shapes, plays
a seeded fault schedule while making API calls, then heals everything and checks what every
sink got against what the API acknowledged.
"""

import argparse
import array
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from cluster import Serve, call, free_port, log_summary, percentile, wait_for_port  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402

KEY = "slk_chaos" + "0" * 37
SECRETS_KEY = "c4" * 32
STREAM = "/api/v1/streams/base/erc20_token_transfer/records"
TEMPLATE = ('{"n":%d,"block_number":%d,"block_timestamp":"%s","transaction_hash":"0x%064x",'
            '"log_index":%d,"token_address":"%s","from_address":"0x2222222222222222222222222222222222222222",'
            '"to_address":"0x3333333333333333333333333333333333333333","amount_str":"1000000",'
            '"amount":1.0,"usd_amount":1.0}')
NOISE = -1
API_TIMEOUT = 60  # an API call without an answer after this is a hang


def log(message):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def value_text(value_id):
    return "0xc0%038x" % value_id


def record_key(n):
    return "0x%064x:%d" % (n, n % 50)


# ---------------------------------------------------------------------------------------------
# Servers

class Process:
    """A server the schedule restarts: `command` started with its output in `log_path`."""

    def __init__(self, name, command, port, log_path, env=None):
        self.name, self.command, self.port, self.log_path, self.env = name, command, port, log_path, env
        self.process = None

    def start(self):
        with open(self.log_path, "a") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        if not wait_for_port(self.port, 60):
            raise RuntimeError("%s did not start (log: %s)" % (self.name, self.log_path))

    def kill(self):
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Postgres:
    """The private PostgreSQL scripts/chaos started (its data dir and port are given); a
    restart is an immediate shutdown (a crash: no checkpoint) and a start."""

    def __init__(self, args):
        self.args = args
        self.name = "postgres"

    def ctl(self, *words):
        command = [os.path.join(self.args.pg_bin, "pg_ctl"), "-D", self.args.pg_data] + list(words)
        if self.args.pg_user:
            command = ["runuser", "-u", self.args.pg_user, "--"] + command
        subprocess.run(command, cwd=self.args.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False)

    def kill(self):
        self.ctl("-m", "immediate", "-w", "stop")

    def start(self):
        self.ctl("-l", self.args.pg_log, "-w", "-t", "60", "-o", self.args.pg_options, "start")
        if not wait_for_port(self.args.pg_port, 60):
            raise RuntimeError("postgres did not start again")

    def psql(self, database, sql):
        out = subprocess.run([os.path.join(self.args.pg_bin, "psql"), "-h", "127.0.0.1", "-p",
                              str(self.args.pg_port), "-U", "postgres", "-d", database, "-At", "-c", sql],
                             capture_output=True, text=True, check=True)
        return out.stdout


def create_bucket(moto_port, bucket):
    request = urllib.request.Request("http://127.0.0.1:%d/%s" % (moto_port, bucket), method="PUT", data=b"")
    urllib.request.urlopen(request, timeout=30).read()


class Cluster:
    def __init__(self, args):
        self.args = args
        self.tmp = args.tmp
        self.pg = Postgres(args)
        # The test servers' PostgreSQL does not wait for its WAL at commit (synchronous_commit
        # off): a crash then forgets the last commits it acknowledged, which no production
        # database does. Here it waits (fsync may stay off: a killed server's writes are in
        # the operating system's cache, which survives it).
        args.pg_options = args.pg_options.replace("synchronous_commit=off", "synchronous_commit=on")
        self.pg.kill()
        self.pg.start()
        self.pg.psql("postgres", "CREATE DATABASE chaos")
        self.pg.psql("postgres", "CREATE DATABASE chaos_sink")
        self.servers = {"postgres": self.pg}
        self.proxies = {"postgres": FaultProxy("postgres", args.pg_port)}

        moto_port = free_port()
        self.moto = Process("moto", [args.moto, "-H", "127.0.0.1", "-p", str(moto_port)], moto_port,
                            os.path.join(self.tmp, "moto.log"))
        if args.broker_storage == "s3":
            self.moto.start()
            create_bucket(moto_port, "tansu")

        kafka_port = free_port()
        self.proxies["kafka"] = FaultProxy("kafka", kafka_port)
        broker_env = dict(os.environ, AWS_ACCESS_KEY_ID="chaos", AWS_SECRET_ACCESS_KEY="chaos",
                          AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT="http://127.0.0.1:%d" % moto_port,
                          AWS_ALLOW_HTTP="true")
        storage = "s3://tansu/" if args.broker_storage == "s3" else "memory://tansu/"
        # Clients reach the broker through its proxy, so the broker advertises the proxy.
        self.servers["kafka"] = Process(
            "kafka", [args.tansu, "broker", "--listener-url", "tcp://127.0.0.1:%d" % kafka_port,
                      "--advertised-listener-url", "tcp://127.0.0.1:%d" % self.proxies["kafka"].port,
                      "--storage-engine", storage], kafka_port, os.path.join(self.tmp, "tansu.log"), broker_env)

        redis_port = free_port()
        self.proxies["redis"] = FaultProxy("redis", redis_port)
        os.makedirs(os.path.join(self.tmp, "redis"), exist_ok=True)
        # Redis as docs/scaling.md asks to run it, with persistence (an append-only file
        # written before each answer), so a restart keeps the values; --redis-restarts-empty
        # runs it without, and a restart loses every set's values (docs/scaling.md).
        persistence = ["--appendonly", "no"] if args.redis_restarts_empty else \
            ["--appendonly", "yes", "--appendfsync", "always"]
        self.servers["redis"] = Process(
            "redis", [args.redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                      "--dir", os.path.join(self.tmp, "redis")] + persistence,
            redis_port, os.path.join(self.tmp, "redis.log"))
        for name in ("kafka", "redis"):
            self.servers[name].start()

        self.database_url = "postgres://postgres@127.0.0.1:%d/chaos" % self.proxies["postgres"].port
        self.sink_database_url = "postgres://postgres@127.0.0.1:%d/chaos_sink" % self.proxies["postgres"].port
        flags = ["--database-url", self.database_url,
                 "--bus", "kafka://127.0.0.1:%d" % self.proxies["kafka"].port, "--bus-topic-prefix", "chaos.",
                 "--sets", "redis://127.0.0.1:%d?prefix=chaos" % self.proxies["redis"].port,
                 "--node-timeout-secs", str(args.node_timeout), "--secrets-key", SECRETS_KEY]
        env = {"SLUICE_BOOTSTRAP_API_KEY": KEY, "SLUICE_LOG": args.node_log}
        self.nodes = [Serve(args.bin, "node-%d" % i, os.path.join(self.tmp, "node-%d" % i),
                            flags + ["--node-name", "node-%d" % i], env) for i in range(args.nodes)]
        self.down = set()  # names of nodes killed or stopped by the schedule
        self.lock = threading.Lock()
        for node in self.nodes:
            node.start()
        deadline = time.time() + 60
        while len(call("GET", self.nodes[0].base + "/api/v1/nodes", key=KEY)[1]["items"]) != len(self.nodes):
            if time.time() > deadline:
                raise RuntimeError("the nodes did not see each other")
            time.sleep(0.2)

    def live_nodes(self):
        with self.lock:
            return [n for n in self.nodes if n.name not in self.down and n.alive()]

    def any_node(self, rng=random):
        live = self.live_nodes()
        return rng.choice(live) if live else self.nodes[0]

    def stop(self):
        for node in self.nodes:
            node.stop()
        for server in self.servers.values():
            if server is not self.pg:
                server.kill()
        self.moto.kill()


# ---------------------------------------------------------------------------------------------
# Receivers and pipelines

class Webhooks:
    """An HTTP server taking every webhook sink's requests: POST /hook/<pipeline> with a JSON
    array of {"key", "value"}; counts each record per pipeline."""

    def __init__(self):
        self.seen = {}  # pipeline index -> {n: count}
        self.requests = 0
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                index = int(self.path.rsplit("/", 1)[1])
                items = json.loads(body)
                with hooks.lock:
                    hooks.requests += 1
                    seen = hooks.seen.setdefault(index, {})
                    for item in items:
                        value = item.get("value")
                        n = value.get("n") if isinstance(value, dict) else None
                        if isinstance(n, int) and item.get("key") == record_key(n):
                            seen[n] = seen.get(n, 0) + 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


SCRIPT = ("function transform(record) { return {n: record.n, token_address: record.token_address, "
          "via: 'v8', block_number: record.block_number}; }")


class Pipeline:
    def __init__(self, index, kind, sink, guarantee, script=False):
        self.index, self.kind, self.sink, self.guarantee, self.script = index, kind, sink, guarantee, script
        self.id = None
        self.values = {index}  # value ids in the set from the start
        self.added = {}  # value id -> time its add was answered (growing pipelines)
        self.removed = {}  # value id -> time its removal was answered (shrinking pipelines)
        self.uncertain = set()  # value ids whose change got no clear answer
        self.seen = {}  # n -> deliveries
        self.offset = 0
        self.foreign = 0
        self.workers = 0  # its workers as its stats last showed them running
        self.paused = False  # paused by the API calls, from the pause sent to the resume answered

    def label(self):
        return "%s/%s%s/%s" % (self.kind, self.sink, "+v8" if self.script else "", self.guarantee)

    def body(self, hook_port):
        transforms = [{"type": "redis_set_filter", "uid": "tf-set", "filter_expr": "root = this.token_address",
                       "set_values": [value_text(v) for v in sorted(self.values)]}]
        if self.script:
            transforms.append({"type": "v8", "uid": "tf-js", "script": SCRIPT})
        if self.sink == "managed":
            sink = {"type": "kafka", "uid": "sk-1", "name": "out"}
        elif self.sink == "webhook":
            sink = {"type": "webhook", "uid": "sk-1", "name": "hook",
                    "url": "http://127.0.0.1:%d/hook/%d" % (hook_port, self.index)}
        else:
            sink = {"type": "postgres", "uid": "sk-1", "name": "rows", "connection": "CHAOS_DB",
                    "table": "chaos_%d" % self.index, "mode": "insert",
                    "columns": {"n": "n", "token_address": "token_address"}}
        return {"name": "chaos-%d" % self.index, "description": self.label(), "delivery_guarantee": self.guarantee,
                "pipeline_config": {"source": {"chain": "base", "entity": "erc20_token_transfer"},
                                    "transforms": transforms, "sinks": [sink]}}


def make_pipelines(count):
    """The mix: set filters into the managed sink, with a script, into a webhook and into
    PostgreSQL, under at_least_once, a few best_effort, and pipelines whose values change."""
    shapes = [("steady", "managed", "at_least_once", False)] * 6 + \
        [("steady", "managed", "at_least_once", True)] * 3 + \
        [("steady", "webhook", "at_least_once", False)] * 3 + \
        [("steady", "postgres", "at_least_once", False)] * 2 + \
        [("steady", "managed", "best_effort", False)] * 2 + \
        [("steady", "webhook", "best_effort", False)] * 1 + \
        [("growing", "managed", "at_least_once", False)] * 2 + \
        [("shrinking", "managed", "at_least_once", False)] * 2 + \
        [("steady", "managed", "at_least_once", False)] * 1
    while len(shapes) < count:
        shapes.append(shapes[len(shapes) % 9])
    pipelines = [Pipeline(i, *shape) for i, shape in enumerate(shapes[:count])]
    for p in pipelines:
        if p.kind == "shrinking":
            # 20 values of its own, ids from 10,000 up; half of them are removed during the run.
            p.values = {p.index} | {10_000 + 100 * p.index + k for k in range(20)}
    return pipelines


# ---------------------------------------------------------------------------------------------
# The feed

class Feed:
    """Every 0.1 s one ingest request of rate/10 records to a live node, up to `in_flight` of
    them at once (a request that takes longer than 0.1 s, as under a fault, no longer holds
    the feed back; with all of them waiting, the next is sent when one answers, and up to
    `make_up` seconds of the requests held back are sent late). 40 % of the
    records carry a value some pipeline has (in turn), the rest a value none has. Remembers
    each record's value and whether its request was acknowledged, and when."""

    def __init__(self, cluster, rate, active_values, in_flight=4, make_up=0.0):
        self.cluster = cluster
        self.per_round = max(1, rate // 10)
        self.active = active_values  # list of value ids fed, changed under self.lock
        self.value_of = array.array("i")
        self.requests = []  # (first n, count, acknowledged, time answered)
        self.errors = []
        self.latencies = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.rng = random.Random(7)
        self.in_flight = in_flight
        self.slots = threading.BoundedSemaphore(in_flight)
        self.make_up = make_up

    def set_values(self, values):
        with self.lock:
            self.active = list(values)

    def run(self):
        tick = time.time()
        cursor = 0
        while not self.stop_event.is_set():
            first = len(self.value_of)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            lines = []
            with self.lock:
                active = self.active
            for j in range(self.per_round):
                n = first + j
                if j % 10 < 4 and active:
                    value = active[cursor % len(active)]
                    cursor += 1
                    token = value_text(value)
                else:
                    value, token = NOISE, "0xbe%038x" % (n % 10_000)
                self.value_of.append(value)
                lines.append(TEMPLATE % (n, 30_000_000 + n // 100, stamp, n, n % 50, token))
            node = self.cluster.any_node(self.rng)
            self.slots.acquire()
            threading.Thread(target=self.send, args=(node, first, lines), daemon=True).start()
            tick += 0.1
            delay = tick - time.time()
            if delay > 0:
                time.sleep(delay)
            elif -delay > self.make_up:
                # Behind by more than make_up seconds (a fault held the requests): the requests
                # up to make_up behind are sent at once, as slots free; the rest are given up.
                tick = time.time() - self.make_up
        for _ in range(self.in_flight):  # every slot back: every request answered
            self.slots.acquire()

    def send(self, node, first, lines):
        """One ingest request; notes whether every record in it was acknowledged."""
        acknowledged = False
        sent = time.time()
        try:
            status, answer = call("POST", node.base + STREAM, "\n".join(lines) + "\n", timeout=15, key=KEY)
            acknowledged = status == 200 and isinstance(answer, dict) and answer.get("accepted") == len(lines)
            if not acknowledged:
                self.errors.append((time.time(), node.name, "%s %s" % (status, str(answer)[:160])))
        except OSError as error:
            self.errors.append((time.time(), node.name, str(error)[:160]))
        finally:
            self.requests.append((first, len(lines), acknowledged, time.time()))
            self.latencies.append(time.time() - sent)
            self.slots.release()

    def records(self):
        """(n, value id, acknowledged, answered at) of every record sent."""
        for first, count, acknowledged, at in self.requests:
            for n in range(first, first + count):
                yield n, self.value_of[n], acknowledged, at


# ---------------------------------------------------------------------------------------------
# API calls during the faults

class ApiLog:
    def __init__(self, faults):
        self.calls = []  # (start, seconds, what, node, status or error)
        self.faults = faults
        self.lock = threading.Lock()

    def call(self, node, method, path, body=None, what=None):
        started = time.time()
        try:
            status, answer = call(method, node.base + path, json.dumps(body) if body is not None else None,
                                  timeout=API_TIMEOUT, key=KEY, content_type="application/json")
            outcome = status
        except OSError as error:
            status, answer = None, None
            outcome = "timeout" if "timed out" in str(error) else "refused"
        with self.lock:
            self.calls.append((started, time.time() - started, what or "%s %s" % (method, path.split("?")[0]),
                               node.name, outcome, str(answer)[:200] if isinstance(outcome, int) and outcome >= 500
                               else ""))
        return status, answer


class Exerciser:
    """Redeploys, pauses and resumes, filter-value changes and backfills, on live nodes."""

    def __init__(self, cluster, pipelines, feed, api, rng, grace):
        self.cluster, self.pipelines, self.feed, self.api, self.rng = cluster, pipelines, feed, api, rng
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.next_value = 20_000
        self.grace = grace
        self.removable = {p.index: sorted(p.values - {p.index})[:10] for p in pipelines if p.kind == "shrinking"}

    def active_values(self):
        values = set()
        for p in self.pipelines:
            values |= p.values | set(p.added)
        return sorted(values)

    def change(self, p, method, value):
        """One filter-value change, tried on up to three live nodes; the time it was answered
        200, or None."""
        path = "/api/v1/beam/%s/transforms/tf-set/filter-values" % p.id
        for _ in range(3):
            status, _ = self.api.call(self.cluster.any_node(self.rng), method, path, {"values": [value_text(value)]},
                                      what="%s filter-values" % method)
            if status == 200:
                return time.time()
            time.sleep(1)
        return None

    def run(self):
        actions = ["redeploy", "pause", "grow", "shrink", "backfill", "read"]
        while not self.stop_event.wait(self.rng.uniform(2, 5)):
            action = self.rng.choice(actions)
            node = self.cluster.any_node(self.rng)
            if action == "redeploy":
                p = self.rng.choice(self.pipelines)
                self.api.call(node, "POST", "/api/v1/beam/%s/deploy" % p.id, what="deploy")
            elif action == "pause":
                p = self.rng.choice([p for p in self.pipelines if p.guarantee == "at_least_once"])
                p.paused = True
                status, _ = self.api.call(node, "POST", "/api/v1/beam/%s/pause" % p.id, what="pause")
                self.stop_event.wait(self.rng.uniform(1, 4))
                # Resumed whatever the pause answered; tried until a node answers 200.
                for _ in range(5):
                    if self.api.call(self.cluster.any_node(self.rng), "POST", "/api/v1/beam/%s/deploy" % p.id,
                                     what="deploy (resume)")[0] == 200:
                        break
                    time.sleep(2)
                p.paused = False
            elif action == "grow":
                p = self.rng.choice([p for p in self.pipelines if p.kind == "growing"])
                value = self.next_value
                self.next_value += 1
                at = self.change(p, "POST", value)
                if at is None:
                    p.uncertain.add(value)
                else:
                    p.added[value] = at
                self.feed.set_values(self.active_values())
            elif action == "shrink":
                p = self.rng.choice([p for p in self.pipelines if p.kind == "shrinking"])
                if self.removable[p.index]:
                    value = self.removable[p.index].pop()
                    at = self.change(p, "DELETE", value)
                    if at is None:
                        p.uncertain.add(value)
                    else:
                        p.removed[value] = at
            elif action == "backfill":
                now = time.time()
                window = {"partition_key": "block_timestamp",
                          "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600)),
                          "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
                self.api.call(node, "POST", "/api/v1/beam/backfills",
                              {"job_name": "chaos", "table": "base.assets.erc20_token_transfers",
                               "backfill_window": window,
                               "filter": {"column": "token_address", "values": [value_text(0)]},
                               "destinations": [{"type": "kafka", "name": "chaos-backfill"}]}, what="backfill")
            else:
                p = self.rng.choice(self.pipelines)
                self.api.call(node, "GET", "/api/v1/beam/%s/deploy/stats" % p.id, what="stats")


# ---------------------------------------------------------------------------------------------
# The fault schedule

KINDS = [("node_kill", 3), ("node_stop", 2), ("broker_restart", 1), ("postgres_restart", 1),
         ("redis_restart", 1), ("stall", 2), ("drop", 1), ("slow", 1)]


def schedule(seed, seconds, nodes):
    """[(at, kind, target, duration, delay)]: the same for the same seed and length."""
    rng = random.Random(seed)
    kinds = [k for k, weight in KINDS for _ in range(weight)]
    # Every kind once first (in a seeded order), so that a short run meets each; then by weight.
    first = [k for k, _ in KINDS]
    rng.shuffle(first)
    at, plan = rng.uniform(10, 20), []
    while at < seconds:
        kind = first.pop() if first else rng.choice(kinds)
        target = {"node_kill": rng.randrange(nodes), "node_stop": rng.randrange(nodes)}.get(
            kind, rng.choice(["postgres", "kafka", "redis"]))
        duration = {"node_kill": rng.uniform(2, 15), "node_stop": rng.uniform(3, 12),
                    "broker_restart": rng.uniform(1, 5), "postgres_restart": rng.uniform(1, 5),
                    "redis_restart": rng.uniform(1, 3), "stall": rng.uniform(3, 12), "drop": rng.uniform(2, 6),
                    "slow": rng.uniform(5, 15)}[kind]
        delay = rng.uniform(0.05, 0.3)
        plan.append((at, kind, target, duration, delay))
        at += rng.uniform(8, 25)
    return plan


def start_again(node):
    """Starts a killed node, trying again while a server it needs is itself down."""
    for attempt in range(10):
        try:
            node.start()
            return
        except RuntimeError as error:
            log("%s did not start (attempt %d): %s" % (node.name, attempt + 1, error))
            node.kill()
            time.sleep(5)
    raise RuntimeError("%s did not start again" % node.name)


class Faults:
    def __init__(self, cluster, pipelines, plan, started):
        self.cluster, self.pipelines, self.plan, self.started = cluster, pipelines, plan, started
        self.events = []  # dicts: kind, target, start, end, recovery / failover seconds
        self.threads = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.pool = ThreadPoolExecutor(max_workers=8)
        self.exits = []  # (time, node name, exit status) of nodes that ended without a fault
        self.watcher = threading.Thread(target=self.watch_exits, daemon=True)

    def active_at(self, when, until=None):
        """The faults active at `when` (or at any time up to `until`: a call that a fault
        began during), or that ended less than 2 s before."""
        until = when if until is None else until
        return [e for e in self.events if e["start"] <= until and when <= (e.get("end") or time.time()) + 2]

    def placement(self):
        """{pipeline index: set of nodes} for pipelines whose workers all run, ready, on live
        nodes, or that the API calls paused (an empty set); others are missing. A pipeline's
        stats need the database: while they answer 503 (it cannot be reached), the answering
        node's own view of where workers run (`GET /api/v1/nodes`, no database) says where it
        runs, with as many workers as its stats last showed."""
        live = {n.name for n in self.cluster.live_nodes()}
        views, views_lock = {}, threading.Lock()

        def nodes_view(base):
            with views_lock:
                if base not in views:
                    try:
                        status, body = call("GET", base + "/api/v1/nodes", timeout=10, key=KEY)
                    except OSError:
                        status, body = None, None
                    views[base] = body.get("items", []) if status == 200 else None
                return views[base]

        def one(p):
            if p.paused:
                return set()  # meant to run nowhere now
            base = self.cluster.any_node().base
            try:
                status, stats = call("GET", "%s/api/v1/beam/%s/deploy/stats" % (base, p.id), timeout=10, key=KEY)
            except OSError:
                return None
            if status == 503 and p.workers:
                view = nodes_view(base)
                running = [n["name"] for n in view or [] for w in n["workers"] if w["config_id"] == p.id]
                return set(running) if len(running) == p.workers and set(running) <= live else None
            if status != 200:
                return None
            workers = stats.get("workers_health", {}).get("workers", [])
            nodes = {w.get("node") for w in workers}
            ok = workers and all(w["status"] in ("Running", "BlockedOnSink") and w["is_ready"] for w in workers)
            if ok:
                p.workers = len(workers)
            return nodes if ok and nodes <= live else None

        placed = dict(zip([p.index for p in self.pipelines], self.pool.map(one, self.pipelines)))
        return {i: nodes for i, nodes in placed.items() if nodes is not None}

    def wait_all_placed(self, since, limit=300, event=None):
        """Seconds from `since` until every pipeline runs on live nodes (None after `limit`).
        With `event`, notes there the pipelines that came back last (label and seconds)."""
        missing_at = {}  # pipeline index -> start of the last poll that found it missing
        while time.time() - since < limit:
            polled = time.time()
            placed = self.placement()
            for p in self.pipelines:
                if p.index not in placed:
                    missing_at[p.index] = polled
            if len(placed) == len(self.pipelines):
                if event is not None:
                    last = sorted(missing_at.items(), key=lambda item: -item[1])[:3]
                    event["last_back"] = [(self.pipelines[i].label(), round(at - since, 1)) for i, at in last]
                return time.time() - since
            time.sleep(0.5)
        return None

    def overlapping(self, event):
        """The other faults active at some time between `event`'s start and its failover."""
        until = event["start"] + (event.get("failover_s") or 0)
        return ["%s %s" % (e["kind"], e["target"]) for e in self.events
                if e is not event and e["start"] <= until and (e.get("end") or time.time()) >= event["start"]]

    def inject(self, kind, target, duration, delay):
        event = {"kind": kind, "target": target, "start": time.time(), "duration": round(duration, 1)}
        self.events.append(event)
        cluster = self.cluster
        if kind in ("node_kill", "node_stop"):
            with cluster.lock:
                candidates = [n for n in cluster.nodes if n.name not in cluster.down and n.alive()]
                if len(candidates) < len(cluster.nodes):  # one node faulted at a time
                    event["skipped"] = "a node is already down"
                    event["end"] = time.time()
                    return
                node = cluster.nodes[target % len(cluster.nodes)]
                cluster.down.add(node.name)
            event["target"] = node.name
            if kind == "node_kill":
                node.kill()
                log("fault: kill -9 %s (restart in %.1f s)" % (node.name, duration))
                waiter = threading.Thread(target=lambda: event.__setitem__(
                    "failover_s", self.wait_all_placed(event["start"], 120, event)), daemon=True)
                waiter.start()
                time.sleep(duration)
                start_again(node)
                with cluster.lock:
                    cluster.down.discard(node.name)
                waiter.join()
            else:
                node.signal(signal.SIGSTOP)
                log("fault: SIGSTOP %s for %.1f s" % (node.name, duration))
                time.sleep(duration)
                node.signal(signal.SIGCONT)
                with cluster.lock:
                    cluster.down.discard(node.name)
        elif kind == "broker_restart" and self.cluster.args.broker_storage == "memory":
            # tansu's memory engine loses everything on a restart, which a real broker does not:
            # its clients see the restart, every connection cut and refused until it is back.
            event["kind"] = kind = "broker_outage"
            event["target"] = "kafka"
            log("fault: the broker's connections cut and refused for %.1f s (a restart as clients see it)" % duration)
            self.cluster.proxies["kafka"].set_mode("drop")
            time.sleep(duration)
            self.cluster.proxies["kafka"].set_mode("pass")
        elif kind.endswith("_restart"):
            server = cluster.servers[{"broker_restart": "kafka", "postgres_restart": "postgres",
                                      "redis_restart": "redis"}[kind]]
            event["target"] = server.name
            empty = kind == "redis_restart" and self.cluster.args.redis_restarts_empty
            log("fault: %s down for %.1f s%s" % (server.name, duration, " (restarts empty)" if empty else ""))
            server.kill()
            time.sleep(duration)
            server.start()
        else:
            proxy = cluster.proxies[target]
            log("fault: %s the connections to %s for %.1f s%s" % (kind, target, duration,
                                                                 " (+%.0f ms per chunk)" % (delay * 1000)
                                                                 if kind == "slow" else ""))
            proxy.set_mode(kind, delay)
            time.sleep(duration)
            proxy.set_mode("pass")
        event["end"] = time.time()
        if kind != "node_kill":
            event["recovery_s"] = self.wait_all_placed(event["end"], 120)

    def run(self):
        for at, kind, target, duration, delay in self.plan:
            wait = self.started + at - time.time()
            if wait > 0 and self.stop_event.wait(wait):
                break
            thread = threading.Thread(target=self.inject, args=(kind, target, duration, delay), daemon=True)
            thread.start()
            self.threads.append(thread)

    def watch_exits(self):
        """Notes each node that ended by itself (not killed by the schedule) and starts it
        again, as a supervisor would: a node should ride out a fault, not exit on it."""
        while not self.stop_event.wait(1):
            for node in self.cluster.nodes:
                with self.cluster.lock:
                    if node.name in self.cluster.down or node.process is None:
                        continue
                    code = node.process.poll()
                    if code is None:
                        continue
                    self.cluster.down.add(node.name)
                self.exits.append((time.time(), node.name, code))
                log("%s exited by itself (status %s); starting it again" % (node.name, code))
                try:
                    start_again(node)
                finally:
                    with self.cluster.lock:
                        self.cluster.down.discard(node.name)

    def finish(self):
        self.stop_event.set()
        self.thread.join()
        self.watcher.join()
        for thread in self.threads:
            thread.join(timeout=180)


# ---------------------------------------------------------------------------------------------
# The checker

def read_managed(cluster, p):
    while True:
        node = cluster.any_node()
        try:
            status, page = call("GET", "%s/api/v1/beam/%s/sinks/sk-1/records?offset=%d&limit=10000"
                                % (node.base, p.id, p.offset), timeout=60, key=KEY)
        except OSError:
            time.sleep(1)
            continue
        if status != 200:
            time.sleep(1)
            continue
        for record in page["records"]:
            value = record.get("value")
            n = value.get("n") if isinstance(value, dict) else None
            if isinstance(n, int) and record.get("key") == record_key(n):
                p.seen[n] = p.seen.get(n, 0) + 1
            else:
                p.foreign += 1
        p.offset = page["next_offset"]
        if not page["records"]:
            return


def read_table(cluster, p):
    rows = cluster.pg.psql("chaos_sink", "SELECT n, count(*) FROM chaos_%d GROUP BY n" % p.index)
    p.seen = {int(n): int(c) for n, c in (line.split("|") for line in rows.split())}


def by_value(feed):
    """{value id: [(n, acknowledged, answered at)]} of the records that carry a set's value."""
    index = {}
    for n, value, acknowledged, at in feed.records():
        if value != NOISE:
            index.setdefault(value, []).append((n, acknowledged, at))
    return index


def expectations(p, records, grace):
    """(must arrive, may arrive) record numbers of pipeline p: what matched its set when it was
    acknowledged and cannot have stopped matching before it was read; what may match."""
    must, may = set(), set()
    for value in p.values | set(p.added) | p.uncertain:
        removed, added = p.removed.get(value), p.added.get(value)
        for n, acknowledged, at in records.get(value, ()):
            if value in p.uncertain:
                may.add(n)  # a change without a clear answer
            elif value in p.values and removed is None:
                (must if acknowledged else may).add(n)
            elif value in p.values:
                if at < removed + grace:
                    may.add(n)  # read before or after the removal took effect
            elif acknowledged and at >= added + grace:
                must.add(n)
            else:
                may.add(n)  # sent before the add took effect, or unacknowledged
    return must, may


def check(cluster, pipelines, feed, webhooks, grace, timeout):
    """Reads every sink until each at_least_once pipeline has what it must, or `timeout` s."""
    deadline = time.time() + timeout
    records = by_value(feed)
    wanted = {p.index: expectations(p, records, grace) for p in pipelines}
    while True:
        for p in pipelines:
            if p.sink == "managed":
                read_managed(cluster, p)
            elif p.sink == "webhook":
                with webhooks.lock:
                    p.seen = dict(webhooks.seen.get(p.index, {}))
            else:
                try:
                    read_table(cluster, p)
                except subprocess.CalledProcessError:
                    p.seen = {}
        waiting = [p for p in pipelines if p.guarantee == "at_least_once" and not wanted[p.index][0] <= p.seen.keys()]
        if not waiting or time.time() > deadline:
            break
        time.sleep(2)
    results = []
    for p in pipelines:
        must, may = wanted[p.index]
        delivered = set(p.seen)
        results.append({
            "pipeline": p.index, "shape": p.label(), "must": len(must), "delivered": len(delivered),
            "lost": len(must - delivered), "lost_first": sorted(must - delivered)[:10],
            "duplicates": sum(c - 1 for c in p.seen.values() if c > 1),
            "duplicates_first": sorted(n for n, c in p.seen.items() if c > 1)[:10],
            "unexpected": len(delivered - must - may), "unexpected_first": sorted(delivered - must - may)[:10],
            "foreign": p.foreign, "uncertain_values": len(p.uncertain)})
    return results


# ---------------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser()
    for name in ("bin", "tmp", "pg_bin", "pg_data", "pg_log", "pg_options", "tansu", "redis_server", "moto"):
        parser.add_argument("--" + name.replace("_", "-"), required=True)
    parser.add_argument("--pg-port", type=int, required=True)
    parser.add_argument("--pg-user", default="")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pipelines", type=int, default=24)
    parser.add_argument("--rate", type=int, default=3000, help="records/s into the stream")
    parser.add_argument("--feed-in-flight", type=int, default=4,
                        help="ingest requests the feed keeps in flight at most (1: one at a time)")
    parser.add_argument("--feed-make-up", type=float, default=0,
                        help="seconds of requests a feed held back by a fault sends late (0: none; "
                             "it goes on from the present)")
    parser.add_argument("--node-timeout", type=int, default=5)
    parser.add_argument("--grace", type=float, default=10,
                        help="seconds after a filter-value change is answered until every node must apply it")
    parser.add_argument("--broker-storage", choices=("memory", "s3"), default="memory",
                        help="tansu's engine: memory (a broker restart is then its connections cut and refused) "
                             "or s3 (in moto: a real restart keeps the data)")
    parser.add_argument("--redis-restarts-empty", action="store_true",
                        help="run Redis without persistence: a restart loses every set's values")
    parser.add_argument("--delivery-timeout", type=float, default=300)
    parser.add_argument("--report-sql-duplicates", action="store_true",
                        help="report rows the PostgreSQL sink wrote twice instead of failing on them "
                             "(an open defect: RELIABILITY.md, Chaos)")
    parser.add_argument("--failover-limit", type=float, default=10,
                        help="seconds a node kill's pipelines may take to run again on live nodes")
    parser.add_argument("--node-log", default="warn")
    parser.add_argument("--out", default="/tmp/sluice-chaos-last")
    args = parser.parse_args()
    # Stopped with SIGTERM (Ctrl-C is KeyboardInterrupt): the cleanup below still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    plan = schedule(args.seed, args.minutes * 60, args.nodes)
    log("chaos: %d nodes, %d pipelines, %d records/s, %.1f minutes, seed %d: %d faults planned (%s)"
        % (args.nodes, args.pipelines, args.rate, args.minutes, args.seed, len(plan),
           ", ".join("%s %d" % (k, sum(1 for f in plan if f[1] == k)) for k, _ in KINDS)))
    cluster = Cluster(args)
    webhooks = Webhooks()
    pipelines = make_pipelines(args.pipelines)
    failed = []
    try:
        node = cluster.nodes[0]
        status, answer = call("PUT", node.base + "/api/v1/beam/secrets/CHAOS_DB",
                              json.dumps({"value": cluster.sink_database_url}), key=KEY,
                              content_type="application/json")
        assert status == 200, (status, answer)
        for p in pipelines:
            node = cluster.nodes[p.index % len(cluster.nodes)]
            status, created = call("POST", node.base + "/api/v1/beam", json.dumps(p.body(webhooks.port)), key=KEY,
                                   content_type="application/json")
            assert status == 200, (status, created)
            p.id = created["id"]
            status, answer = call("POST", "%s/api/v1/beam/%s/deploy" % (node.base, p.id), key=KEY)
            assert status == 200, (p.label(), status, answer)
        api = ApiLog(None)
        feed = Feed(cluster, args.rate, [], args.feed_in_flight, args.feed_make_up)
        exerciser = Exerciser(cluster, pipelines, feed, api, random.Random(args.seed + 1), args.grace)
        feed.set_values(exerciser.active_values())
        faults = Faults(cluster, pipelines, plan, time.time())
        api.faults = faults
        if faults.wait_all_placed(time.time(), 120) is None:
            raise RuntimeError("the pipelines did not all start")
        log("%d pipelines deployed and running; feed, API calls and faults start" % len(pipelines))
        faults.started = time.time()
        feed.thread.start()
        exerciser.thread.start()
        faults.thread.start()
        faults.watcher.start()
        time.sleep(args.minutes * 60)
        exerciser.stop_event.set()
        exerciser.thread.join()
        faults.finish()
        # Healed: every server and node up, every proxy passing.
        for proxy in cluster.proxies.values():
            proxy.set_mode("pass")
        time.sleep(5)
        feed.stop_event.set()
        feed.thread.join()
        settled = faults.wait_all_placed(time.time(), 120)
        log("faults over; feed stopped: %d records in %d requests, %d acknowledged requests; every pipeline "
            "running again after %s s" % (len(feed.value_of), len(feed.requests),
                                         sum(1 for r in feed.requests if r[2]), settled))
        results = check(cluster, pipelines, feed, webhooks, args.grace, args.delivery_timeout)
        failed = report(args, cluster, pipelines, feed, api, faults, results)
    finally:
        cluster.stop()
        os.makedirs(args.out, exist_ok=True)
        for node in cluster.nodes:
            errors, warnings, firsts = log_summary(node.log_path)
            log("%s log: %d error lines, %d warning lines%s" % (node.name, errors, warnings,
                                                               "".join("\n    " + m for m in firsts)))
            shutil.copy(node.log_path, os.path.join(args.out, node.name + ".log"))
    if failed:
        log("FAILED: " + "; ".join(failed))
        sys.exit(1)
    log("passed")


def report(args, cluster, pipelines, feed, api, faults, results):
    """Prints the figures, writes them to <out>/summary.json; answers what failed."""
    failed = []
    acknowledged = sum(r[1] for r in feed.requests if r[2])
    log("records: %d sent (%.0f/s of %d asked), %d acknowledged, %d in requests not acknowledged; ingest "
        "requests answered in p50 %.2f s, p99 %.2f s, max %.1f s; %d errors (first: %s)"
        % (len(feed.value_of), len(feed.value_of) / (args.minutes * 60 + 5), args.rate, acknowledged,
           len(feed.value_of) - acknowledged, percentile(feed.latencies, 50), percentile(feed.latencies, 99),
           max(feed.latencies), len(feed.errors), feed.errors[0][1:] if feed.errors else "-"))
    for r in results:
        log("  %-40s must %6d  delivered %6d  LOST %d  duplicates %d  unexpected %d  foreign %d%s"
            % (r["shape"], r["must"], r["delivered"], r["lost"], r["duplicates"], r["unexpected"], r["foreign"],
               ("  lost n=%s" % r["lost_first"]) if r["lost"] else ""))
    at_least_once = [r for r in results if "at_least_once" in r["shape"]]
    lost = sum(r["lost"] for r in at_least_once)
    log("at_least_once: %d records that must arrive, %d lost, %d duplicates; best_effort: %d duplicates, "
        "%d records not delivered" % (sum(r["must"] for r in at_least_once), lost,
                                      sum(r["duplicates"] for r in at_least_once),
                                      sum(r["duplicates"] for r in results if "best_effort" in r["shape"]),
                                      sum(r["lost"] for r in results if "best_effort" in r["shape"])))
    if lost:
        failed.append("%d acknowledged records lost" % lost)
    exactly_once = [r for r in results if r["shape"].startswith("steady/postgres")]
    twice = {n for r in exactly_once for n in r["duplicates_first"]}
    answered = {n: (ok, at) for n, _, ok, at in feed.records() if n in twice} if twice else {}
    for r in exactly_once:
        for n in r["duplicates_first"]:
            ok, at = answered.get(n, (None, None))
            during = ", ".join("%s %s" % (e["kind"], e["target"]) for e in faults.active_at(at)) if at else "?"
            log("  written twice by the PostgreSQL sink: n=%d, its request %s at %s, during: %s"
                % (n, "acknowledged" if ok else "not acknowledged",
                   time.strftime("%H:%M:%S", time.gmtime(at)) if at else "?", during or "no fault"))
    if any(r["duplicates"] for r in exactly_once):
        message = "the PostgreSQL sink wrote %d rows twice" % sum(r["duplicates"] for r in exactly_once)
        if args.report_sql_duplicates:
            log("NOT FAILED (--report-sql-duplicates): " + message)
        else:
            failed.append(message)
    unexpected = sum(r["unexpected"] for r in results)
    if unexpected:
        failed.append("%d records delivered that no set held (or a removal not applied after %.0f s)"
                      % (unexpected, args.grace))
    if any(r["foreign"] for r in results):
        failed.append("records that are not the feed's in a sink")

    by_kind = {}
    for e in faults.events:
        by_kind.setdefault(e["kind"], []).append(e)
    for kind, events in sorted(by_kind.items()):
        took = [e.get("failover_s") if kind == "node_kill" else e.get("recovery_s") for e in events
                if not e.get("skipped")]
        stuck = sum(1 for t in took if t is None)
        took = [t for t in took if t is not None]
        log("faults %-16s %2d injected (%d skipped): %s after %s s (max %s s)%s"
            % (kind, len(events) - sum(1 for e in events if e.get("skipped")), sum(1 for e in events if e.get("skipped")),
               "failover" if kind == "node_kill" else "every pipeline running",
               "%.1f" % percentile(took, 50) if took else "-", "%.1f" % max(took) if took else "-",
               ", %d never within 120 s" % stuck if stuck else ""))
        if kind == "node_kill":
            for e in events:
                if (e.get("failover_s") or 0) >= args.failover_limit * 0.8:
                    log("  kill of %s at %s: failover %.1f s; last back: %s; during: %s"
                        % (e["target"], time.strftime("%H:%M:%S", time.gmtime(e["start"])), e["failover_s"],
                           ", ".join("%s at %.1f s" % back for back in e.get("last_back", [])) or "?",
                           ", ".join(faults.overlapping(e)) or "no other fault"))
        if kind == "node_kill" and (stuck or (took and max(took) >= args.failover_limit)):
            failed.append("a node kill's failover took %.0f s or more" % args.failover_limit)
    hung = [c for c in api.calls if c[4] == "timeout"]
    errors = [c for c in api.calls if isinstance(c[4], int) and c[4] >= 500]
    log("API calls: %d, %d hung (no answer in %d s), %d refused (node down), %d answered 5xx"
        % (len(api.calls), len(hung), API_TIMEOUT, sum(1 for c in api.calls if c[4] == "refused"), len(errors)))
    for c in errors[:30]:
        during = ", ".join("%s %s" % (e["kind"], e["target"]) for e in faults.active_at(c[0], c[0] + c[1])) or "no fault"
        log("  5xx: %s on %s -> %s after %.1f s (%s) during: %s" % (c[2], c[3], c[4], c[1], c[5][:120], during))
    if hung:
        failed.append("%d API calls hung" % len(hung))
    log("nodes that exited by themselves: %d" % len(faults.exits))
    for at, name, code in faults.exits:
        during = ", ".join("%s %s" % (e["kind"], e["target"]) for e in faults.active_at(at)) or "no fault"
        log("  %s exited with status %s at %s, during: %s"
            % (name, code, time.strftime("%H:%M:%S", time.gmtime(at)), during))
    if faults.exits:
        failed.append("%d node exits without a kill" % len(faults.exits))
    summary = {"seed": args.seed, "minutes": args.minutes, "records_sent": len(feed.value_of),
               "records_acknowledged": acknowledged, "pipelines": results, "faults": faults.events,
               "api_calls": len(api.calls), "api_hung": len(hung), "api_5xx": [list(c) for c in errors],
               "feed_errors": feed.errors[:200], "node_exits": faults.exits,
               "failed": failed}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    return failed


if __name__ == "__main__":
    main()
