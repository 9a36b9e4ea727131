"""HTTP/1.1 over raw sockets, for requests no well-behaved client library would send: bytes out
as given, responses read back and parsed (Content-Length and chunked bodies)."""

import json
import socket
import time


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lower-case name -> value (the last one)
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "Response(%d, %r, %r)" % (self.status, self.headers, self.body[:300])


class Conn:
    """One TCP connection to the gateway."""

    def __init__(self, host, port, timeout=10):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)

    def _fill(self, deadline):
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except socket.timeout:
            raise AssertionError("no complete answer in time; have %r" % self.buf[:300])
        if not chunk:
            self.eof = True
        self.buf += chunk

    def _take_line(self, deadline):
        while b"\r\n" not in self.buf:
            if self.eof:
                raise AssertionError("connection closed mid-answer: %r" % self.buf[:300])
            self._fill(deadline)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n, deadline):
        while len(self.buf) < n:
            if self.eof:
                raise AssertionError("connection closed mid-body: %r" % self.buf[:300])
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self, timeout=10):
        """The next response (interim 1xx answers skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            status_line = self._take_line(deadline)
            parts = status_line.split(b" ", 2)
            assert parts[0] == b"HTTP/1.1", status_line
            status = int(parts[1])
            headers = {}
            while True:
                line = self._take_line(deadline)
                if not line:
                    break
                name, value = line.split(b":", 1)
                headers[name.strip().lower().decode()] = value.strip().decode()
            if 100 <= status < 200:
                continue
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while True:
                    size = int(self._take_line(deadline).split(b";")[0], 16)
                    if size == 0:
                        while self._take_line(deadline):
                            pass
                        break
                    body += self._take(size, deadline)
                    assert self._take(2, deadline) == b"\r\n"
            else:
                body = self._take(int(headers.get("content-length", "0")), deadline)
            return Response(status, headers, body)

    def closed_by_server(self, timeout=10):
        """True when the server closes the connection (after any answer still to come is read)
        within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            try:
                self._fill(deadline)
            except AssertionError:
                return False
        return True

    def close(self):
        self.sock.close()


def request(method, path, body=b"", headers=()):
    """The bytes of one request; Content-Length unless `headers` frames the body itself."""
    if isinstance(body, str):
        body = body.encode()
    head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % (method, path)
    names = {h.split(":", 1)[0].strip().lower() for h in headers}
    for h in headers:
        head += h + "\r\n"
    if body and "content-length" not in names and "transfer-encoding" not in names:
        head += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    return head.encode() + b"\r\n" + body


def exchange(cluster, data, timeout=10):
    """Sends `data` on a fresh connection and reads one response."""
    c = Conn(cluster.host, cluster.port, timeout)
    try:
        c.send(data)
        return c.response(timeout)
    finally:
        c.close()
