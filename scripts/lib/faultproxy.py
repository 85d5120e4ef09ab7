"""A TCP proxy that injects network faults (standard library only), for scripts/chaos.py.

`FaultProxy(name, upstream_port)` listens on a free loopback port and forwards every
connection to 127.0.0.1:upstream_port. `set_mode(mode, **options)` changes what it does, for
the connections open now and those that come:

- `pass`: forwards bytes as they come;
- `stall`: holds every byte in both directions (connections stay open, nothing moves: a
  network path that stops answering instead of refusing); new connections are accepted and
  held too;
- `drop`: aborts every open connection (RST) and accepts then aborts new ones;
- `slow`: forwards each chunk after `delay` seconds (a congested path).

Each proxy runs on one asyncio loop in a daemon thread (`start_loop()` starts it once and
every proxy shares it).
"""

import asyncio
import socket
import threading

_loop = None


def start_loop():
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
        threading.Thread(target=_loop.run_forever, name="faultproxy", daemon=True).start()
    return _loop


class FaultProxy:
    def __init__(self, name, upstream_port):
        self.name = name
        self.upstream_port = upstream_port
        self.mode = "pass"
        self.delay = 0.0
        self.connections = set()  # (client writer, upstream writer)
        self.accepted = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        loop = start_loop()
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)

    async def _listen(self):
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    def set_mode(self, mode, delay=0.0):
        assert mode in ("pass", "stall", "drop", "slow"), mode
        done = threading.Event()

        def apply():
            self.mode, self.delay = mode, delay
            if mode == "drop":
                for pair in list(self.connections):
                    for writer in pair:
                        if writer is not None:
                            writer.transport.abort()
                self.connections.clear()
            done.set()

        _loop.call_soon_threadsafe(apply)
        done.wait(timeout=10)

    async def _gate(self):
        """Waits while stalled; False when the connection must go (dropped)."""
        while self.mode == "stall":
            await asyncio.sleep(0.05)
        if self.mode == "drop":
            return False
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        return True

    async def _pump(self, reader, writer, pair):
        try:
            while True:
                data = await reader.read(65536)
                if not data or not await self._gate():
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            for w in pair:
                if w is not None:
                    w.transport.abort()
            self.connections.discard(pair)

    async def _handle(self, client_reader, client_writer):
        self.accepted += 1
        if not await self._gate():
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.transport.abort()
            return
        pair = (client_writer, upstream_writer)
        self.connections.add(pair)
        await asyncio.gather(self._pump(client_reader, upstream_writer, pair),
                             self._pump(upstream_reader, client_writer, pair))
