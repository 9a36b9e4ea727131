#!/usr/bin/env python3
"""A fault-injecting TCP relay for the netns test (tests/netns/netns_test.py).

  fault_relay.py --listen ADDR:PORT --target ADDR:PORT --control /path/relay.sock

Accepts connections on --listen and opens one to --target for each, then copies bytes both ways.
ZeroMQ runs a byte stream over TCP, so the relay keeps each direction's byte order: every chunk it
reads gets a release time, now + delay + uniform jitter, but never earlier than the chunk before
it, so jitter stretches the stream and never reorders it (tc netem's delay with jitter would
reorder packets, which TCP puts right again).

Faults, set through the control socket (a Unix socket, one JSON object a line, answered with one
JSON line; Unix sockets with a path are not tied to a network namespace, so the test can drive a
relay inside any namespace from outside):
  {"delay_ms": 20, "jitter_ms": 5}   delay every chunk by 20 ms +- 5 ms (uniform)
  {"pause_ms": 300}                  forward nothing for 300 ms (bytes queue, then flow in order)
  {"reset": true}                    close every connection abruptly, both sides (SO_LINGER 0:
                                     an RST), as a router or NAT that drops connections would
  {"blackhole": true|false}          hold every byte (connections stay open) until false
  {"stats": true}                    counters: connections, resets, bytes each way
Every answer carries the counters. SIGTERM ends it.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import struct
import sys
import time


class Relay:
    def __init__(self, target, seed):
        self.target = target
        self.delay = 0.0
        self.jitter = 0.0
        self.paused_until = 0.0  # monotonic seconds; inf while black-holed
        self.blackhole = False
        self.rng = random.Random(seed)
        self.pairs = set()
        self.stats = {"connections": 0, "open": 0, "resets": 0, "bytes_up": 0, "bytes_down": 0}
        self.resume = asyncio.Event()  # set whenever forwarding may go on

    async def serve(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError as e:
            print(f"fault_relay: cannot reach {self.target}: {e}", file=sys.stderr, flush=True)
            abort(writer)
            return
        pair = (writer, up_writer)
        self.pairs.add(pair)
        self.stats["connections"] += 1
        self.stats["open"] += 1
        tasks = [asyncio.ensure_future(self.pipe(reader, up_writer, "bytes_up")),
                 asyncio.ensure_future(self.pipe(up_reader, writer, "bytes_down"))]
        try:
            # Either side closing (or a reset) ends the pair.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            self.pairs.discard(pair)
            self.stats["open"] -= 1
            for w in pair:
                w.close()

    async def pipe(self, reader, writer, counter):
        """Copies reader -> writer, each chunk released in order at its release time."""
        queue = asyncio.Queue()
        done = object()

        async def read():
            last = 0.0
            while True:
                try:
                    data = await reader.read(65536)
                except (OSError, ConnectionError):
                    data = b""
                if not data:
                    await queue.put((0.0, done))
                    return
                at = time.monotonic() + self.delay
                if self.jitter > 0:
                    at += self.rng.uniform(-self.jitter, self.jitter)
                last = max(last, at)
                await queue.put((last, data))

        reading = asyncio.ensure_future(read())
        try:
            await self.forward(queue, done, writer, counter)
        except (OSError, ConnectionError):
            pass  # a side reset or closed: serve() ends the pair
        finally:
            reading.cancel()
            if not reading.cancelled() and reading.done():
                reading.exception()  # retrieved: a reset while reading is no error here

    async def forward(self, queue, done, writer, counter):
        while True:
            at, data = await queue.get()
            if data is done:
                return
            while True:
                hold = max(at, self.paused_until) - time.monotonic()
                if hold <= 0:
                    break
                self.resume.clear()
                try:
                    await asyncio.wait_for(self.resume.wait(), min(hold, 0.05))
                except asyncio.TimeoutError:
                    pass
            writer.write(data)
            self.stats[counter] += len(data)
            await writer.drain()

    def reset(self):
        for pair in list(self.pairs):
            for w in pair:
                abort(w)
        self.stats["resets"] += len(self.pairs)

    def control(self, cmd):
        if "delay_ms" in cmd:
            self.delay = float(cmd["delay_ms"]) / 1000
        if "jitter_ms" in cmd:
            self.jitter = float(cmd["jitter_ms"]) / 1000
            if self.jitter > self.delay:
                raise ValueError("jitter_ms must not exceed delay_ms")
        if "pause_ms" in cmd:
            self.paused_until = max(self.paused_until,
                                    time.monotonic() + float(cmd["pause_ms"]) / 1000)
        if "blackhole" in cmd:
            self.blackhole = bool(cmd["blackhole"])
            self.paused_until = float("inf") if self.blackhole else time.monotonic()
            self.resume.set()
        if cmd.get("reset"):
            self.reset()
        return dict(self.stats, delay_ms=self.delay * 1000, jitter_ms=self.jitter * 1000,
                    blackhole=self.blackhole)


def abort(writer):
    """Closes a connection with an RST (SO_LINGER on, 0 s) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def control_server(relay, path):
    async def handle(reader, writer):
        while True:
            try:
                line = await reader.readline()
            except (asyncio.CancelledError, ConnectionError):
                return  # the relay is stopping, or the test went away
            if not line:
                break
            try:
                answer = relay.control(json.loads(line))
            except (ValueError, TypeError, KeyError) as e:
                answer = {"error": str(e)}
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()
        writer.close()

    if os.path.exists(path):
        os.unlink(path)
    return await asyncio.start_unix_server(handle, path)


def endpoint(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


async def main():
    p = argparse.ArgumentParser(description="fault-injecting TCP relay")
    p.add_argument("--listen", type=endpoint, required=True)
    p.add_argument("--target", type=endpoint, required=True)
    p.add_argument("--control", required=True, help="Unix socket path")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    relay = Relay(args.target, args.seed)
    server = await asyncio.start_server(relay.serve, *args.listen, reuse_address=True)
    ctl = await control_server(relay, args.control)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"fault_relay: {args.listen[0]}:{args.listen[1]} -> {args.target[0]}:{args.target[1]}",
          flush=True)
    await stop.wait()
    server.close()
    ctl.close()
    relay.reset()
    try:
        os.unlink(args.control)
    except OSError:
        pass


if __name__ == "__main__":
    asyncio.run(main())
