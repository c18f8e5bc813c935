"""Client for the trtcache daemon (standard library only).

    from trtcache_client import Client
    art = Client("/run/trtcache/trtcache.sock").acquire("resnet50")
    sess = art.session()            # onnxruntime.InferenceSession
    print(art.metadata["key"])

Wire format (docs/protocol.md): frames of a 4-byte big-endian length and a JSON object;
artifact files arrive as read-only descriptors (SCM_RIGHTS) with the `artifact` frame.
Errors raise TrtcacheError with a `.code` string (`not_found`, `bad_name`, ...).
"""

import json
import os
import shutil
import socket
import struct
import tempfile

__all__ = ["Client", "Artifact", "TrtcacheError", "PROTOCOL_VERSION", "DEFAULT_SOCKET"]

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/trtcache/trtcache.sock"
MAX_FDS = 32


class TrtcacheError(Exception):
    """A typed error from the daemon (`.code`) or the connection (`code="connection"`)."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


class Artifact:
    """An acquired artifact: `.metadata` (dict) and `.fds` (open read-only descriptors,
    graph first, in the order of `metadata["files"]`)."""

    def __init__(self, metadata, fds):
        self.metadata = metadata
        self.fds = fds

    def graph_bytes(self):
        """The graph file's bytes."""
        fd = self.fds[0]
        size = os.fstat(fd).st_size
        chunks, off = [], 0
        while off < size:
            b = os.pread(fd, min(size - off, 1 << 24), off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks)

    def session(self, **ort_kwargs):
        """An onnxruntime.InferenceSession over this artifact, opened through /proc/self/fd/N.
        A graph with external data is
        opened through a private temp folder of symlinks to /proc/self/fd/N named as the
        graph expects; the folder is removed once the session exists. An ``ort-cpu`` artifact
        is already optimized for this machine, so unless ``sess_options`` is given it is opened
        with graph optimizations off (re-optimizing it gives the same graph, only slower)."""
        import onnxruntime

        if self.metadata.get("backend") == "ort-cpu" and "sess_options" not in ort_kwargs:
            so = onnxruntime.SessionOptions()
            so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            ort_kwargs["sess_options"] = so
        files = self.metadata.get("files", [])
        if len(self.fds) == 1:
            # ONNX Runtime opens the descriptor through /proc: no copy into Python.
            return onnxruntime.InferenceSession("/proc/self/fd/%d" % self.fds[0], **ort_kwargs)
        if not self.fds:
            raise TrtcacheError("internal", "artifact has no files")
        d = tempfile.mkdtemp(prefix="trtcache-artifact-")
        try:
            graph = os.path.join(d, "model.onnx")
            for i, (meta, fd) in enumerate(zip(files, self.fds)):
                if i == 0:
                    link = graph
                else:
                    name = meta["name"]
                    if os.path.isabs(name) or ".." in name.split("/"):
                        raise TrtcacheError("bad_name", "external data name %r" % name)
                    link = os.path.join(d, name)
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink("/proc/self/fd/%d" % fd, link)
            return onnxruntime.InferenceSession(graph, **ort_kwargs)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def close(self):
        """Closes the descriptors."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Client:
    """One connection to the daemon; `hello` is sent on construction."""

    def __init__(self, socket_path=None, timeout=None):
        path = socket_path or os.environ.get("TRTCACHE_SOCKET") or DEFAULT_SOCKET
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise TrtcacheError("connection", "cannot connect to %s: %s" % (path, e)) from e
        hello = self._call({"op": "hello", "version": PROTOCOL_VERSION, "client": "trtcache_client.py/0.1"})[0]
        self.server = hello.get("server")
        self.max_frame = hello.get("max_frame")

    # -- framing -----------------------------------------------------------------
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self._sock.sendall(struct.pack(">I", len(body)) + body)

    def _recv_exact(self, n, fds):
        buf = bytearray()
        while len(buf) < n:
            data, got, _flags, _addr = socket.recv_fds(self._sock, n - len(buf), MAX_FDS)
            fds.extend(got)
            if not data:
                raise TrtcacheError("connection", "daemon closed the connection")
            buf += data
        return bytes(buf)

    def _recv(self):
        fds = []
        try:
            (n,) = struct.unpack(">I", self._recv_exact(4, fds))
            msg = json.loads(self._recv_exact(n, fds))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        if msg.get("kind") == "error":
            for fd in fds:
                os.close(fd)
            raise TrtcacheError(msg.get("code", "internal"), msg.get("message", ""))
        return msg, fds

    def _call(self, obj):
        self._send(obj)
        return self._recv()

    # -- requests ----------------------------------------------------------------
    def list(self):
        """Every model with versions and per-variant state."""
        return self._call({"op": "list"})[0]["models"]

    def status(self, model):
        """One model's state."""
        return self._call({"op": "status", "model": model})[0]["model"]

    def acquire(self, model, profile=None, backend=None, wait=True, timeout=None, version=None):
        """A ready artifact; waits for a build when `wait` (up to `timeout` seconds)."""
        req = {"op": "acquire", "model": model, "wait": bool(wait)}
        if profile is not None:
            req["profile"] = profile
        if backend is not None:
            req["backend"] = backend
        if version is not None:
            req["version"] = int(version)
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        msg, fds = self._call(req)
        if msg.get("kind") != "artifact":
            for fd in fds:
                os.close(fd)
            raise TrtcacheError("internal", "unexpected response %r" % msg.get("kind"))
        return Artifact(msg["metadata"], fds)

    def build(self, models=None, backend=None, timeout=None, on_progress=None):
        """Builds models (all when None); calls on_progress(event) per event; returns results."""
        req = {"op": "build", "models": list(models or [])}
        if backend is not None:
            req["backend"] = backend
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        self._send(req)
        while True:
            msg, _ = self._recv()
            if msg.get("kind") == "progress":
                if on_progress:
                    on_progress(msg)
            else:
                return msg["results"]

    def stats(self, prometheus=False):
        """Counters as a dict, or Prometheus text."""
        msg = self._call({"op": "stats", "format": "prometheus" if prometheus else "json"})[0]
        return msg["text"] if prometheus else msg["stats"]

    def evict(self, model=None, key=None):
        """Admin: evict a model's artifacts or one key; returns the number removed."""
        return self._call({"op": "evict", "model": model, "key": key})[0]["removed"]

    def shutdown(self):
        """Admin: stop the daemon."""
        self._call({"op": "shutdown"})

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
