"""Helpers the cluster scripts share (standard library only): HTTP calls to a node, free
loopback ports, a `sluice serve` process, and figures read from /proc and node logs.
Used by scripts/bench-cluster.py, scripts/chaos.py and scripts/soak.py."""

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def call(method, url, body=None, timeout=120, key=None, content_type=None):
    """(status, parsed JSON answer) of one HTTP call. An HTTP error status is an answer;
    a connection failure or timeout raises OSError."""
    data = body.encode() if isinstance(body, str) else body
    headers = {"x-api-key": key} if key else {}
    if content_type:
        headers["content-type"] = content_type
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        raw, status = error.read(), error.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")[:500]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, seconds):
    """True once something accepts connections on 127.0.0.1:port, False after `seconds`."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.1)
    return False


class Serve:
    """One `sluice serve` process: `args` are the flags after `serve`; its stderr goes to
    `<data_dir>.log` (appended, so a restarted node keeps one log). `start()` waits for
    /readyz; `kill()`, `stop()`, `pause()` and `resume()` send signals."""

    def __init__(self, binary, name, data_dir, args, env=None, prefix=()):
        self.binary, self.name, self.data_dir = binary, name, data_dir
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.log_path = data_dir + ".log"
        self.command = list(prefix) + [binary, "serve", "--data-dir", data_dir,
                                       "--listen", "127.0.0.1:%d" % self.port] + list(args)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        self.env.update(env or {})
        self.process = None
        os.makedirs(data_dir, exist_ok=True)

    def start(self, ready_within=90):
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=subprocess.DEVNULL,
                                            stderr=log)
        deadline = time.time() + ready_within
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("%s exited with %s (log: %s)" % (self.name, self.process.returncode,
                                                                   self.log_path))
            try:
                if call("GET", self.base + "/readyz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("%s not ready after %d s (log: %s)" % (self.name, ready_within, self.log_path))

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def signal(self, sig):
        if self.alive():
            self.process.send_signal(sig)

    def kill(self):
        """SIGKILL, and reaps the process."""
        if self.alive():
            self.process.kill()
        if self.process is not None:
            self.process.wait()

    def stop(self, timeout=60):
        """SIGTERM, then SIGCONT (a stopped process acts on it only once continued); SIGKILL
        after `timeout` s."""
        if not self.alive():
            return
        self.process.terminate()
        self.process.send_signal(signal.SIGCONT)  # a stopped process handles SIGTERM only once continued
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def load_average():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def proc_figures(pid):
    """(threads, RSS MiB, CPU seconds) of a process, from /proc."""
    threads, rss = None, None
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return threads, rss, cpu


def open_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def percentile(values, p):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_summary(path):
    """(error lines, warning lines, the first distinct ones) of a node's log."""
    errors, warnings, firsts = 0, 0, []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = ANSI.sub("", line)
                if " ERROR " in line:
                    errors += 1
                elif " WARN " in line:
                    warnings += 1
                else:
                    continue
                message = line.strip()[:300]
                # One example per message (the timestamp in front differs).
                if len(firsts) < 8 and not any(message[28:110] == m[28:110] for m in firsts):
                    firsts.append(message)
    except OSError:
        pass
    return errors, warnings, firsts
