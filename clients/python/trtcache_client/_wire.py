"""The socket side of the client (loaded on a client's first call that needs the daemon):
the connection and its ``hello``, frames of a 4-byte big-endian length and a JSON object,
artifact files as read-only descriptors (``SCM_RIGHTS``), and every request of
docs/protocol.md. :class:`trtcache_client.Client` is the API; this is its transport."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import os

# The socket layer is CPython's C module `_socket`, which the standard `socket` module wraps:
# importing `socket` costs ~2.5 ms (its enum conversions and `selectors`), a third of a small
# model's time to first inference, for helpers this client does not use (BENCHMARKS.md).
try:
    import _socket as _net
except ImportError:  # pragma: no cover - a Python without CPython's _socket
    import socket as _net  # type: ignore[no-redef]

from . import (
    MAX_FDS,
    PROTOCOL_VERSION,
    Artifact,
    __version__,
    _close_all,
    _err,
)
from ._codec import dumps, loads

if TYPE_CHECKING:
    from . import Client, Json


def _nofile_limit() -> str:
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return str(soft)
    except (ImportError, OSError, ValueError):
        return "unknown"

# Codes after which the daemon closes the connection: the next call connects again.
_CLOSING_CODES = frozenset(("frame_too_large", "idle_timeout", "busy", "shutting_down"))


class Channel:
    """The socket side of a :class:`Client`: the connection, ``hello``, framing with
    descriptor passing, and every request. It reads the client's ``path``, ``timeout`` and
    ``max_response`` at each use, so changing them on the client takes effect at the next
    call."""

    def __init__(self, owner: "Client") -> None:
        self._owner = owner
        self._server: Optional[str] = None
        self._max_frame: Optional[int] = None
        self._hello_pending = False
        self.resets: int = 0
        self._sock: Optional[Any] = None

    @property
    def path(self) -> str:
        return self._owner.path

    @property
    def timeout(self) -> Optional[float]:
        return self._owner.timeout

    @property
    def max_response(self) -> int:
        return self._owner.max_response

    def connect(self) -> None:
        """Connects now (a no-op when connected) and reads the daemon's ``hello`` answer:
        raises :class:`ConnectionFailed` when no daemon answers, :class:`Busy` or
        :class:`UnsupportedVersion` when it refuses. Returns the client."""
        self._socket()
        self._finish_hello()

    @property
    def server(self) -> Optional[str]:
        """The daemon's name and version, from its ``hello`` answer (connects if needed)."""
        self.connect()
        return self._server

    @property
    def max_frame(self) -> Optional[int]:
        """The largest request frame the daemon takes, from its ``hello`` answer (connects
        if needed)."""
        self.connect()
        return self._max_frame

    # -- connection ----------------------------------------------------------------
    def _connect(self) -> None:
        s = _net.socket(_net.AF_UNIX, _net.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except _net.timeout as e:
            s.close()
            raise _err().ConnectionTimeout("no connection to %s within %s s" % (self.path, self.timeout)) from e
        except OSError as e:
            s.close()
            raise _err().ConnectionFailed("cannot connect to %s: %s" % (self.path, e)) from e
        self._sock = s
        # `hello` goes out now and its answer is read before the first request's: the first
        # request follows it without waiting, one round trip instead of two. A daemon that
        # refuses the hello (version, connection limit) is heard at the first call.
        self._hello_pending = True
        try:
            self._send(
                {"op": "hello", "version": PROTOCOL_VERSION, "client": "trtcache_client.py/" + __version__}
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered and closed (`busy`): the first call reads why

    def _finish_hello(self) -> None:
        """Reads the pending ``hello`` answer (raising the daemon's refusal)."""
        if self._hello_pending and self._sock is not None:
            self._hello_pending = False
            hello = self._recv_frame()[0]
            self._server = hello.get("server")
            self._max_frame = hello.get("max_frame")

    def _reset(self) -> None:
        """Drops the connection; the next call connects again."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._hello_pending = False
            self.resets += 1

    def _socket(self) -> Any:
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        return self._sock

    # -- framing -------------------------------------------------------------------
    def _send(self, obj: Json) -> None:
        body = dumps(obj).encode()
        sock = self._socket()
        try:
            sock.sendall(struct.pack(">I", len(body)) + body)
        except _net.timeout as e:
            self._reset()
            raise _err().ConnectionTimeout(
                "the daemon took no request within %s s; the connection was reset" % self.timeout
            ) from e

    def _recv_exact(self, sock: Any, n: int, fds: List[int]) -> Tuple[bytes, bool]:
        buf = bytearray()
        truncated = False
        while len(buf) < n:
            data, ancillary, flags, _addr = sock.recvmsg(
                # ancillary room for MAX_FDS descriptors (C ints)
                n - len(buf), _net.CMSG_SPACE(MAX_FDS * 4), _net.MSG_CMSG_CLOEXEC
            )
            for level, kind, blob in ancillary:
                if level == _net.SOL_SOCKET and kind == _net.SCM_RIGHTS:
                    whole = len(blob) - len(blob) % 4
                    fds.extend(struct.unpack("%di" % (whole // 4), blob[:whole]))
            if flags & _net.MSG_CTRUNC:
                truncated = True
            if not data:
                raise _err().ConnectionFailed("daemon closed the connection")
            buf += data
        return bytes(buf), truncated

    def _recv(self) -> Tuple[Json, List[int]]:
        self._finish_hello()
        return self._recv_frame()

    def _recv_frame(self) -> Tuple[Json, List[int]]:
        sock = self._socket()
        fds: List[int] = []
        try:
            head, t1 = self._recv_exact(sock, 4, fds)
            (n,) = struct.unpack(">I", head)
            if n > self.max_response:
                raise _err().ResponseTooLarge(
                    "the daemon announced a %d-byte response; the limit is %d (max_response)"
                    % (n, self.max_response)
                )
            body, t2 = self._recv_exact(sock, n, fds)
            msg = loads(body.decode("utf-8"))
            if not isinstance(msg, dict):
                raise _err().UnexpectedResponse("response is not a JSON object")
        except _net.timeout as e:
            _close_all(fds)
            self._reset()
            raise _err().ConnectionTimeout(
                "no answer from the daemon within %s s; the connection was reset (the late "
                "answer is dropped)" % self.timeout
            ) from e
        except _err().TrtcacheError:
            _close_all(fds)
            self._reset()
            raise
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            _close_all(fds)
            self._reset()
            raise _err().UnexpectedResponse("malformed response frame: %s" % e) from e
        except OSError as e:
            _close_all(fds)
            self._reset()
            raise _err().ConnectionFailed("socket error: %s" % e) from e
        except BaseException:
            _close_all(fds)
            self._reset()
            raise
        if t1 or t2:
            # The frame itself arrived whole, so the connection stays in step.
            _close_all(fds)
            raise _err().DescriptorsTruncated(
                "the kernel dropped descriptors of the daemon's %r answer (MSG_CTRUNC, %d "
                "arrived and were closed): this process is at its open-files limit "
                "(RLIMIT_NOFILE soft limit %s); close descriptors or raise the limit"
                % (msg.get("kind"), len(fds), _nofile_limit())
            )
        if msg.get("kind") == "error":
            _close_all(fds)
            code = str(msg.get("code", "internal"))
            if code in _CLOSING_CODES:
                self._reset()
            raise _err().error_for(code, str(msg.get("message", "")))
        return msg, fds

    def _call(self, obj: Json) -> Tuple[Json, List[int]]:
        self._socket()
        return self._call_connected(obj)

    def _call_connected(self, obj: Json) -> Tuple[Json, List[int]]:
        try:
            self._send(obj)
        except (BrokenPipeError, ConnectionResetError) as broken:
            # The daemon may have answered and closed before reading (`busy` at its
            # connection limit): its error frame says why, the broken pipe does not.
            try:
                self._recv()
            except _err().TrtcacheError as answer:
                if answer.code != "connection":
                    self._reset()
                    raise answer from broken
            except OSError:
                pass
            self._reset()
            raise _err().ConnectionFailed("the daemon closed the connection: %s" % broken) from broken
        except OSError as e:
            self._reset()
            raise _err().ConnectionFailed("socket error: %s" % e) from e
        return self._recv()

    @staticmethod
    def _expect(msg: Json, kind: str, field: str) -> Any:
        if msg.get("kind") != kind or field not in msg:
            raise _err().UnexpectedResponse("expected %r with %r, got %r" % (kind, field, msg.get("kind")))
        return msg[field]

    # -- requests ------------------------------------------------------------------
    def list(self) -> List[Json]:
        """Every model with versions and per-variant state."""
        return list(self._expect(self._call({"op": "list"})[0], "models", "models"))

    def status(self, model: str) -> Json:
        """One model's state."""
        return dict(self._expect(self._call({"op": "status", "model": model})[0], "status", "model"))

    def acquire(self, model: str, profile: Optional[str], backend: Optional[str], wait: bool,
                timeout: Optional[float], version: Optional[int],
                runtime: Optional[Dict[str, str]] = None) -> Artifact:
        """``Client.acquire`` over the socket."""
        req: Json = {"op": "acquire", "model": model, "wait": bool(wait), "dir_fd": True}
        if runtime:
            req["runtime"] = dict(runtime)
        if profile is not None:
            req["profile"] = profile
        if backend is not None:
            req["backend"] = backend
        if version is not None:
            req["version"] = int(version)
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        msg, fds = self._call(req)
        meta = msg.get("metadata") or {}
        n = len(meta.get("files", []))
        di = meta.get("dir_fd_index")
        if msg.get("kind") != "artifact" or di not in (None, n) or len(fds) != n + (di is not None):
            _close_all(fds)
            raise _err().UnexpectedResponse(
                "expected an artifact with %d descriptors, got %r with %d" % (n, msg.get("kind"), len(fds))
            )
        dir_fd = fds.pop() if di is not None else None
        return Artifact(meta, fds, dir_fd)

    def build(self, models: Optional[Sequence[str]], backend: Optional[str], timeout: Optional[float],
              on_progress: Optional[Callable[[Json], None]],
              paths: Optional[Sequence[Union[str, "os.PathLike[str]"]]]) -> List[Json]:
        """``Client.build`` over the socket."""
        req: Json = {"op": "build", "models": list(models or [])}
        if paths:
            req["paths"] = [os.fspath(p) for p in paths]
        if backend is not None:
            req["backend"] = backend
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        msg, _ = self._call(req)
        while msg.get("kind") == "progress":
            if on_progress:
                on_progress(msg)
            msg, _ = self._recv()
        return list(self._expect(msg, "built", "results"))

    def stats(self, prometheus: bool = False) -> Any:
        """Counters as a dict, or Prometheus text (a str) with ``prometheus=True``."""
        msg = self._call({"op": "stats", "format": "prometheus" if prometheus else "json"})[0]
        if prometheus:
            return str(self._expect(msg, "stats_text", "text"))
        return dict(self._expect(msg, "stats", "stats"))

    def rescan(self) -> Json:
        """``Client.rescan`` over the socket."""
        msg = self._call({"op": "rescan"})[0]
        self._expect(msg, "rescanned", "models")
        return {k: v for k, v in msg.items() if k != "kind"}

    def evict(self, model: Optional[str] = None, key: Optional[str] = None) -> int:
        """Admin: evicts a model's artifacts or one key; returns the number removed."""
        return int(self._expect(self._call({"op": "evict", "model": model, "key": key})[0], "evicted", "removed"))

    def shutdown(self) -> None:
        """Admin: stops the daemon."""
        self._call({"op": "shutdown"})

    def close(self) -> None:
        """Closes the connection (a later call connects again)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._hello_pending = False
