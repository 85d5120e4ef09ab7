"""Driver of scripts/soak (standard library only; issue 39): one `sluice serve` node on its
embedded default (SQLite store, embedded stream log, sets in memory, all in a temporary data
dir) fed --rate records/s into base.erc20_token_transfer through the API for --minutes,
with --pipelines set-filter pipelines (a value of their own each, a managed sink; every
--script-every-th one with a `v8` script after its filter) and a few API calls a minute
(redeploys, pause+resume, filter-value adds and removes, deploy stats, the pipeline list, sink
reads).

Every minute: the node's RSS, open file descriptors and threads (/proc), the data dir's
disk use against the bytes ingested, the node's CPU, the acknowledged feed rate, and the
latency from each ingest request's answer to its record being read from the managed sink of
--sampled pipelines (long-poll reads). It fails (exit 1) when, at any minute after
--reference-minute, RSS is outside ±--rss-band of its value at that minute, file
descriptors exceed theirs + --fd-slack or threads theirs + --thread-slack; when the feed
acknowledged less than --min-feed-share of the asked rate; when an acknowledged record of a
sampled pipeline is not in its sink at the end; or when an API call failed or hung.
"""

import argparse
import csv
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import cluster  # noqa: E402
from cluster import load_average, log_summary, open_fds, percentile, proc_figures  # noqa: E402

KEY = "slk_soak000000000000000000000000000000000000000"
STREAM = "/api/v1/streams/base/erc20_token_transfer/records"
# The record format of scripts/bench-cluster.py's TEMPLATE, with the send time (`sent`,
# epoch seconds) in front.
TEMPLATE = ('{"sent":%.6f,"n":%d,"block_number":%d,"block_timestamp":"%s","transaction_hash":"0x%064x",'
            '"log_index":%d,"token_address":"%s","from_address":"0x2222222222222222222222222222222222222222",'
            '"to_address":"0x3333333333333333333333333333333333333333","amount_str":"1000000",'
            '"amount":1.0,"usd_amount":1.0}')
SCRIPT = "function transform(record) { record.scripted = true; return record; }"
# Columns of the per-minute table: (name, format).
COLUMNS = (("minute", "%d"), ("rss_mib", "%.1f"), ("rss_peak_mib", "%.1f"), ("anon_mib", "%.1f"), ("fds", "%d"), ("threads", "%d"),
           ("cpu_pct", "%.1f"), ("disk_mib", "%.1f"), ("ingested_mib", "%.1f"),
           ("acked_per_s", "%.0f"), ("read", "%d"), ("p50_ms", "%.1f"), ("p99_ms", "%.1f"),
           ("max_ms", "%.1f"), ("api_ok", "%d"), ("api_failed", "%d"), ("load", "%s"))


def call(method, url, body=None, timeout=30):
    return cluster.call(method, url, body, timeout, key=KEY)


def pipeline_value(index):
    """The set-filter value of pipeline `index` (as scripts/bench-cluster.py)."""
    return "0xde%038x" % index


def noise_value(n):
    """A value no pipeline holds (until a filter-value add gives one of them)."""
    return "0xbe%038x" % (n % 10_000)


def rss_anon_mib(pid):
    """The anonymous part of a process's RSS (heap, not mapped files), MiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return None


class PeakSampler:
    """The highest RSS a process reaches, read every second: a minute's one sample misses a
    peak of a few seconds. `take()` answers the peak since the last take."""

    def __init__(self, pid):
        self.pid, self.peak, self.lock = pid, 0.0, threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop_event.wait(1.0):
            try:
                _, rss, _ = proc_figures(self.pid)
            except OSError:
                return
            with self.lock:
                self.peak = max(self.peak, rss or 0.0)

    def take(self):
        with self.lock:
            peak, self.peak = self.peak, 0.0
        return peak


def disk_bytes(path):
    """Bytes the files under `path` occupy on disk (allocated blocks)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Feed:
    """Every 0.1 s one ingest request of rate/10 records: the first `matching` of them carry
    the pipelines' values in turn (matched record m goes to pipeline m % P), the rest
    noise values. A request behind its tick is sent at once, without a burst to catch up.
    Remembers, per request, its first record, when it was sent and when it was
    acknowledged (`{"accepted": count}`), or None."""

    def __init__(self, base, rate, matching, pipelines):
        self.base = base
        self.per_request = max(1, rate // 10)
        self.matching = min(self.per_request, max(1, int(round(self.per_request * matching))))
        self.pipelines = pipelines
        self.requests = []  # [(sent, acked at or None, body bytes)]
        self.errors = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def pipeline_of(self, n):
        """The index of the pipeline record n matches, or None."""
        request, j = divmod(n, self.per_request)
        if j >= self.matching:
            return None
        return (request * self.matching + j) % self.pipelines

    def body(self, request):
        first = request * self.per_request
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        sent = time.time()
        lines = []
        for j in range(self.per_request):
            n = first + j
            if j < self.matching:
                token = pipeline_value((request * self.matching + j) % self.pipelines)
            else:
                token = noise_value(n)
            lines.append(TEMPLATE % (sent, n, 20_000_000 + n // 100, stamp, n, n % 50, token))
        return sent, "\n".join(lines) + "\n"

    def run(self):
        tick = time.time()
        while not self.stop_event.is_set():
            request = len(self.requests)
            sent, body = self.body(request)
            acked = None
            try:
                status, answer = call("POST", self.base + STREAM, body, timeout=30)
                if status in (200, 202) and isinstance(answer, dict) and answer.get("accepted") == self.per_request:
                    acked = time.time()
                else:
                    self.errors.append("%s %s" % (status, str(answer)[:200]))
            except OSError as error:
                self.errors.append(repr(error))
            self.requests.append((sent, acked, len(body)))
            tick += 0.1
            delay = tick - time.time()
            if delay > 0:
                self.stop_event.wait(delay)
            else:
                tick = time.time()

    def acked(self, first_request=0, last_request=None):
        """(acknowledged records, acknowledged body bytes) of requests in a range."""
        chosen = self.requests[first_request:last_request]
        done = [r for r in chosen if r[1] is not None]
        return len(done) * self.per_request, sum(r[2] for r in done)


class Reader:
    """Long-poll reads of one pipeline's managed sink from offset 0: the time each record
    (by its `n`) was first read, and how many times it was read."""

    def __init__(self, base, pipeline):
        self.url = "%s/api/v1/beam/%s/sinks/sk-1/records" % (base, pipeline)
        self.offset = 0
        self.first_read = {}  # n -> time
        self.reads = {}  # n -> times read
        self.foreign = []
        self.errors = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def read_once(self, wait_ms):
        status, page = call("GET", "%s?offset=%d&limit=10000&wait_ms=%d" % (self.url, self.offset, wait_ms),
                            timeout=30)
        now = time.time()
        if status != 200:
            self.errors.append("%s %s" % (status, str(page)[:200]))
            return 0
        for record in page["records"]:
            value = record.get("value")
            n = value.get("n") if isinstance(value, dict) else None
            if not isinstance(n, int):
                self.foreign.append(json.dumps(record)[:300])
                continue
            self.first_read.setdefault(n, now)
            self.reads[n] = self.reads.get(n, 0) + 1
        self.offset = page["next_offset"]
        return len(page["records"])

    def run(self):
        while not self.stop_event.is_set():
            try:
                self.read_once(1000)
            except OSError as error:
                self.errors.append(repr(error))
                time.sleep(1)


class Exerciser:
    """A few API calls a minute, spread over it: a redeploy (any pipeline, in turn), a
    pause and a resume 5 s later (pipelines not sampled), a filter-value add and, a minute
    later, its removal (not sampled), deploy stats, the pipeline list and a sink read.
    Every call is remembered: (time, what, status, seconds); a failure is an OSError (a
    hang past 30 s included) or a status other than 200."""

    def __init__(self, base, ids, filters, sampled):
        self.base, self.ids, self.filters = base, ids, filters
        self.others = [i for i in range(len(ids)) if i not in sampled]
        self.calls = []
        self.turn = 0
        self.added = None  # (pipeline index, value) to remove next
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def call(self, what, method, path, body=None):
        started = time.time()
        try:
            status, answer = call(method, self.base + path, body, timeout=30)
        except OSError as error:
            status, answer = None, repr(error)
        self.calls.append((started, what, status, time.time() - started,
                           "" if status == 200 else str(answer)[:200]))
        return status, answer

    def beam(self, index, suffix=""):
        return "/api/v1/beam/%s%s" % (self.ids[index], suffix)

    def filter_values(self, index):
        return self.beam(index, "/transforms/%s/filter-values" % self.filters[index])

    def round(self):
        turn, self.turn = self.turn, self.turn + 1
        everyone = len(self.ids)
        other = self.others[turn % len(self.others)] if self.others else None
        self.call("redeploy", "POST", self.beam(turn % everyone, "/deploy"))
        if self.stop_event.wait(5):
            return
        if other is not None:
            self.call("pause", "POST", self.beam(other, "/pause"))
            if self.stop_event.wait(5):
                self.call("resume", "POST", self.beam(other, "/deploy"))
                return
            self.call("resume", "POST", self.beam(other, "/deploy"))
        self.call("stats", "GET", self.beam(turn % everyone, "/deploy/stats"))
        self.call("list", "GET", "/api/v1/beam")
        if self.added is not None:
            index, value = self.added
            self.call("filter remove", "DELETE", self.filter_values(index), json.dumps({"values": [value]}))
            self.added = None
        if other is not None:
            value = noise_value(turn)
            if self.call("filter add", "POST", self.filter_values(other),
                         json.dumps({"values": [value]}))[0] == 200:
                self.added = (other, value)
            self.call("sink read", "GET", self.beam(other, "/sinks/sk-1/records?offset=0&limit=100"))

    def run(self):
        while not self.stop_event.is_set():
            started = time.time()
            self.round()
            self.stop_event.wait(max(0.0, 30 - (time.time() - started)))

    def failed(self):
        return [c for c in self.calls if c[2] != 200]


def create_pipelines(base, count, script_every):
    ids, filters, scripted = [], [], []
    for index in range(count):
        transforms = [{"type": "redis_set_filter", "filter_expr": "root = this.token_address"}]
        if script_every and index % script_every == 0:
            transforms.append({"type": "v8", "script": SCRIPT})
            scripted.append(index)
        body = {"name": "soak-%d" % index, "description": "scripts/soak",
                "pipeline_config": {"source": {"chain": "base", "entity": "erc20_token_transfer"},
                                    "transforms": transforms,
                                    "sinks": [{"type": "kafka", "uid": "sk-1", "name": "out"}]}}
        status, created = call("POST", base + "/api/v1/beam", json.dumps(body))
        if status != 200:
            sys.exit("creating pipeline %d: %s %s" % (index, status, created))
        pipeline = created["id"]
        uid = created["pipeline_config"]["transforms"][0]["uid"]
        status, answer = call("POST", "%s/api/v1/beam/%s/transforms/%s/filter-values" % (base, pipeline, uid),
                              json.dumps({"values": [pipeline_value(index)]}))
        if status != 200:
            sys.exit("filter values of pipeline %d: %s %s" % (index, status, answer))
        status, answer = call("POST", "%s/api/v1/beam/%s/deploy" % (base, pipeline), timeout=120)
        if status != 200:
            sys.exit("deploying pipeline %d: %s %s" % (index, status, answer))
        ids.append(pipeline)
        filters.append(uid)
    return ids, filters, scripted


def choose_sampled(count, scripted, wanted):
    """Up to two scripted pipelines, the rest spread over the others."""
    chosen = scripted[:min(2, wanted)]
    plain = [i for i in range(count) if i not in scripted]
    rest = wanted - len(chosen)
    if rest > 0 and plain:
        step = max(1, len(plain) // rest)
        chosen += plain[::step][:rest]
    return sorted(chosen)


def latencies(readers, feed, since, until):
    """(from the ingest answer, from the send) in ms of records first read in [since, until)."""
    from_ack, from_send = [], []
    for reader in readers:
        for n, at in list(reader.first_read.items()):
            if since <= at < until:
                sent, acked, _ = feed.requests[n // feed.per_request] if n // feed.per_request < len(
                    feed.requests) else (None, None, 0)
                if acked is not None:
                    from_ack.append(max(0.0, at - acked) * 1000)
                if sent is not None:
                    from_send.append((at - sent) * 1000)
    return from_ack, from_send


def check_bounds(rows, args):
    """The bound violations of the per-minute rows, as sentences."""
    problems = []
    reference = [r for r in rows if r["minute"] == args.reference_minute]
    if not reference:
        return ["the run ended before minute %d (the reference)" % args.reference_minute]
    ref = reference[0]
    low, high = ref["rss_mib"] * (1 - args.rss_band), ref["rss_mib"] * (1 + args.rss_band)
    for row in rows:
        if row["minute"] <= args.reference_minute:
            continue
        if not low <= row["rss_mib"] <= high:
            problems.append("minute %d: RSS %.1f MiB outside [%.1f, %.1f] (±%d %% of minute %d's %.1f)"
                            % (row["minute"], row["rss_mib"], low, high, args.rss_band * 100,
                               args.reference_minute, ref["rss_mib"]))
        if row["fds"] > ref["fds"] + args.fd_slack:
            problems.append("minute %d: %d open file descriptors, above minute %d's %d + %d"
                            % (row["minute"], row["fds"], args.reference_minute, ref["fds"], args.fd_slack))
        if row["threads"] > ref["threads"] + args.thread_slack:
            problems.append("minute %d: %d threads, above minute %d's %d + %d"
                            % (row["minute"], row["threads"], args.reference_minute, ref["threads"],
                               args.thread_slack))
    return problems


def write_table(out, rows):
    with open(os.path.join(out, "minutes.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out, "minutes.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[name for name, _ in COLUMNS])
        writer.writeheader()
        for row in rows:
            writer.writerow({name: row[name] for name, _ in COLUMNS})


def show(row):
    return "  ".join(("-" if row[name] is None else fmt % row[name]).rjust(max(len(name), 6))
                     for name, fmt in COLUMNS)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="the sluice binary")
    parser.add_argument("--tmp", required=True, help="a directory for the node's data dir and log")
    parser.add_argument("--out", default="/tmp/sluice-soak-last", help="where the table, calls and log go")
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--rate", type=int, default=10_000, help="records/s asked of the feed")
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--script-every", type=int, default=10,
                        help="every Nth pipeline (0, N, 2N, …) has a v8 script after its filter; 0: none")
    parser.add_argument("--matching", type=float, default=0.1,
                        help="share of the records carrying a pipeline's value (spread over all of them)")
    parser.add_argument("--sampled", type=int, default=6, help="pipelines whose sinks are read and checked")
    parser.add_argument("--reference-minute", type=int, default=10,
                        help="the minute whose RSS, descriptors and threads later minutes are held to")
    parser.add_argument("--rss-band", type=float, default=0.15)
    parser.add_argument("--fd-slack", type=int, default=16)
    parser.add_argument("--thread-slack", type=int, default=8)
    parser.add_argument("--min-feed-share", type=float, default=0.9)
    parser.add_argument("--drain-seconds", type=int, default=120,
                        help="how long the end waits for the sampled sinks to hold every acknowledged record")
    args = parser.parse_args()
    if args.minutes < 1 or args.rate < 10 or args.pipelines < 1 or not 0 < args.matching <= 1:
        parser.error("--minutes ≥ 1, --rate ≥ 10, --pipelines ≥ 1 and 0 < --matching ≤ 1")
    os.makedirs(args.out, exist_ok=True)

    data_dir = os.path.join(args.tmp, "node")
    node = cluster.Serve(args.bin, "soak", data_dir, [],
                         env={"SLUICE_BOOTSTRAP_API_KEY": KEY, "SLUICE_LOG": "warn"})
    load_start = load_average()
    print("soak: %d records/s (%.0f %% matching) into %d pipelines (a v8 script on every %dth), %d min; "
          "bounds from minute %d: RSS ±%d %%, fds +%d, threads +%d; cores %d; load average %s"
          % (args.rate, args.matching * 100, args.pipelines, args.script_every, args.minutes,
             args.reference_minute, args.rss_band * 100, args.fd_slack, args.thread_slack, os.cpu_count(),
             load_start), flush=True)
    node.start()
    pid = node.process.pid
    feed = readers = exerciser = None
    rows, problems = [], []
    try:
        started = time.time()
        ids, filters, scripted = create_pipelines(node.base, args.pipelines, args.script_every)
        sampled = choose_sampled(args.pipelines, scripted, args.sampled)
        print("created and deployed %d pipelines in %.1f s; sampled: %s (scripted: %s)"
              % (len(ids), time.time() - started, sampled, [i for i in sampled if i in scripted]), flush=True)
        feed = Feed(node.base, args.rate, args.matching, args.pipelines)
        readers = {i: Reader(node.base, ids[i]) for i in sampled}
        exerciser = Exerciser(node.base, ids, filters, set(sampled))
        for reader in readers.values():
            reader.thread.start()
        _, _, cpu_before = proc_figures(pid)
        peaks = PeakSampler(pid)
        peaks.thread.start()
        began = time.time()
        feed.thread.start()
        exerciser.thread.start()
        print("  ".join(name.rjust(max(len(name), 6)) for name, _ in COLUMNS), flush=True)
        last, last_requests, last_calls = began, 0, 0
        for minute in range(1, args.minutes + 1):
            time.sleep(max(0.0, began + 60 * minute - time.time()))
            if not node.alive():
                problems.append("the node exited (%s) in minute %d" % (node.process.returncode, minute))
                break
            now = time.time()
            threads, rss, cpu = proc_figures(pid)
            requests = len(feed.requests)
            acked, _ = feed.acked(last_requests, requests)
            _, ingested = feed.acked(0, requests)
            from_ack, _ = latencies(readers.values(), feed, last, now)
            calls = exerciser.calls[last_calls:]
            row = {"minute": minute, "time": time.strftime("%H:%M:%S", time.gmtime(now)),
                   "rss_mib": rss, "rss_peak_mib": max(peaks.take(), rss), "anon_mib": rss_anon_mib(pid), "fds": open_fds(pid), "threads": threads,
                   "cpu_pct": (cpu - cpu_before) / (now - last) * 100, "disk_mib": disk_bytes(data_dir) / 2**20,
                   "ingested_mib": ingested / 2**20, "acked_per_s": acked / (now - last), "read": len(from_ack),
                   "p50_ms": percentile(from_ack, 50), "p99_ms": percentile(from_ack, 99),
                   "max_ms": max(from_ack) if from_ack else None,
                   "api_ok": sum(1 for c in calls if c[2] == 200), "api_failed": sum(1 for c in calls if c[2] != 200),
                   "load": load_average().split()[0]}
            rows.append(row)
            print(show(row), flush=True)
            write_table(args.out, rows)
            last, last_requests, last_calls, cpu_before = now, requests, len(exerciser.calls), cpu
        feed.stop_event.set()
        exerciser.stop_event.set()
        peaks.stop_event.set()
        feed.thread.join()
        exerciser.thread.join()
        seconds = time.time() - began
        load_end = load_average()
        # Every acknowledged record of a sampled pipeline in its sink, within --drain-seconds.
        expected = {i: [] for i in sampled}
        for request, (_, acked_at, _) in enumerate(feed.requests):
            if acked_at is None:
                continue
            for j in range(feed.matching):
                index = (request * feed.matching + j) % args.pipelines
                if index in expected:
                    expected[index].append(request * feed.per_request + j)
        deadline = time.time() + args.drain_seconds
        while time.time() < deadline and any(n not in readers[i].first_read for i in sampled
                                             for n in expected[i][-100:]):
            time.sleep(1)
        time.sleep(2)
        for reader in readers.values():
            reader.stop_event.set()
        missing = {i: [n for n in expected[i] if n not in readers[i].first_read] for i in sampled}
        duplicates = sum(c - 1 for r in readers.values() for c in r.reads.values() if c > 1)
        asked = args.rate * seconds
        total_acked, total_bytes = feed.acked()
        all_ack, all_send = latencies(readers.values(), feed, 0, time.time())
        disk = disk_bytes(data_dir)
        threads, rss, cpu = proc_figures(pid)
        names = {}
        for task in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, task)) as f:
                    name = f.read().strip()
                names[name] = names.get(name, 0) + 1
            except OSError:
                pass
        rollup = ""
        try:
            with open("/proc/%d/smaps_rollup" % pid) as f:
                rollup = f.read()
        except OSError:
            pass
        summary = {
            "minutes": len(rows), "seconds": seconds, "rate_asked": args.rate, "pipelines": args.pipelines,
            "sampled": sampled, "scripted": scripted, "acked_records": total_acked,
            "acked_per_s": total_acked / seconds, "feed_errors": len(feed.errors),
            "first_feed_errors": feed.errors[:5], "ingested_bytes": total_bytes, "disk_bytes": disk,
            "disk_bytes_per_acked_record": disk / total_acked if total_acked else None,
            "ingested_bytes_per_record": total_bytes / total_acked if total_acked else None,
            "expected_in_sampled_sinks": sum(len(v) for v in expected.values()),
            "missing_in_sampled_sinks": {ids[i]: len(v) for i, v in missing.items()},
            "first_missing": {ids[i]: v[:10] for i, v in missing.items() if v},
            "duplicates_read": duplicates, "foreign_records": sum(len(r.foreign) for r in readers.values()),
            "reader_errors": [e for r in readers.values() for e in r.errors][:10],
            "latency_from_ack_ms": {"count": len(all_ack), "p50": percentile(all_ack, 50),
                                    "p99": percentile(all_ack, 99), "max": max(all_ack) if all_ack else None},
            "latency_from_send_ms": {"count": len(all_send), "p50": percentile(all_send, 50),
                                     "p99": percentile(all_send, 99), "max": max(all_send) if all_send else None},
            "api_calls": len(exerciser.calls), "api_failed": exerciser.failed(),
            "threads_by_name": names, "smaps_rollup": rollup, "load_start": load_start, "load_end": load_end,
            "node_log": log_summary(node.log_path),
        }
        with open(os.path.join(args.out, "calls.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["time", "call", "status", "seconds", "answer"])
            for at, what, status, took, answer in exerciser.calls:
                writer.writerow([time.strftime("%H:%M:%S", time.gmtime(at)), what, status, "%.3f" % took, answer])

        problems += check_bounds(rows, args)
        if total_acked < args.min_feed_share * asked:
            problems.append("the feed acknowledged %.0f records/s, under %d %% of the %d asked"
                            % (total_acked / seconds, args.min_feed_share * 100, args.rate))
        lost = sum(len(v) for v in missing.values())
        if lost:
            problems.append("%d acknowledged records of the sampled pipelines are not in their sinks "
                            "%d s after the feed stopped" % (lost, args.drain_seconds))
        if exerciser.failed():
            problems.append("%d of %d API calls failed or hung (calls.csv)" % (len(exerciser.failed()),
                                                                              len(exerciser.calls)))
        if feed.errors:
            problems.append("%d ingest requests were not acknowledged (first: %s)" % (len(feed.errors),
                                                                                       feed.errors[0]))
        summary["problems"] = problems
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print("fed %d records in %.0f s: %.0f records/s acknowledged (%d asked); %.1f MiB ingested, data dir "
              "%.1f MiB on disk (%.0f bytes per record against %.0f ingested)"
              % (total_acked, seconds, total_acked / seconds, args.rate, total_bytes / 2**20, disk / 2**20,
                 summary["disk_bytes_per_acked_record"] or 0, summary["ingested_bytes_per_record"] or 0))
        print("sampled sinks: %d expected, %d missing, %d read twice; latency from the ingest answer p50 %s "
              "p99 %s max %s ms; from the send p99 %s ms"
              % (summary["expected_in_sampled_sinks"], lost, duplicates,
                 *("%.1f" % v if v is not None else "-" for v in (summary["latency_from_ack_ms"]["p50"],
                                                                  summary["latency_from_ack_ms"]["p99"],
                                                                  summary["latency_from_ack_ms"]["max"],
                                                                  summary["latency_from_send_ms"]["p99"]))))
        reference = [r for r in rows if r["minute"] == args.reference_minute]
        if reference and rows:
            ref, end = reference[0], rows[-1]
            later = [r for r in rows if r["minute"] >= args.reference_minute]
            print("minute %d → %d: RSS %.1f → %.1f MiB (%+.1f %%; %.1f–%.1f from minute %d, peak %.1f "
                  "read every second), fds %d → %d (max %d), threads %d → %d (max %d)"
                  % (ref["minute"], end["minute"], ref["rss_mib"], end["rss_mib"],
                     (end["rss_mib"] / ref["rss_mib"] - 1) * 100, min(r["rss_mib"] for r in later),
                     max(r["rss_mib"] for r in later), args.reference_minute,
                     max(r["rss_peak_mib"] for r in later), ref["fds"], end["fds"],
                     max(r["fds"] for r in later), ref["threads"], end["threads"], max(r["threads"] for r in later)))
        print("API calls: %d, failed %d; node log: %d errors, %d warnings; threads by name: %s"
              % (len(exerciser.calls), len(exerciser.failed()), summary["node_log"][0], summary["node_log"][1],
                 ", ".join("%s %d" % kv for kv in sorted(names.items(), key=lambda kv: -kv[1]))))
        print("load average at start %s, at end %s; results in %s" % (load_start, load_end, args.out))
    finally:
        for worker in (feed, exerciser):
            if worker is not None:
                worker.stop_event.set()
        for reader in (readers or {}).values():
            reader.stop_event.set()
        node.stop()
        shutil.copy(node.log_path, os.path.join(args.out, "node.log"))
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("passed: every bound held")


if __name__ == "__main__":
    main()
