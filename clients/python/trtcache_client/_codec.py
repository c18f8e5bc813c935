"""The client's JSON codec: CPython's C accelerator ``_json``, which the ``json`` package
wraps. ``import json`` compiles a dozen regular expressions for pure-Python fall-backs this
client never runs (~1.5 ms, a fifth of a small model's time to first inference here), and
even ``_json`` is a ``dlopen``: this module is loaded only when a frame or a metadata text is
first read or written (an acquire from the ready index parses none). The frames this client
writes are objects of strings, integers, booleans, None and lists of them."""

from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - a Python without CPython's _json
    import json

    loads = json.loads
    dumps = json.dumps
else:

    class _ScanContext:
        """What ``_json.make_scanner`` reads: ``json.JSONDecoder``'s defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int

        @staticmethod
        def parse_constant(name: str) -> float:
            return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]

    _scan = _json.make_scanner(_ScanContext())  # type: ignore[arg-type]
    _quote = _json.encode_basestring_ascii

    def loads(text: str) -> Any:  # type: ignore[misc]
        """``json.loads(text)``: one JSON value, whitespace around it, nothing else."""
        start = len(text) - len(text.lstrip(" \t\n\r"))
        try:
            value, end = _scan(text, start)
        except StopIteration as e:
            raise ValueError("malformed JSON at character %s" % e.value) from None
        if text[end:].strip(" \t\n\r"):
            raise ValueError("extra data after the JSON value at character %d" % end)
        return value

    def dumps(v: Any) -> str:  # type: ignore[misc]
        """``json.dumps(v)`` for what requests hold."""
        if isinstance(v, str):
            return str(_quote(v))
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return int.__repr__(v)
        if isinstance(v, float) and v - v == 0.0:  # finite
            return float.__repr__(v)
        if isinstance(v, dict):
            return "{" + ",".join(dumps(str(k)) + ":" + dumps(x) for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(dumps(x) for x in v) + "]"
        raise TypeError("a request holds a %s, which this client does not encode" % type(v).__name__)
