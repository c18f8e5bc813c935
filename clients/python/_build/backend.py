"""A PEP 517 build backend in the standard library alone, so that
``pip install ./clients/python`` works in a fresh virtualenv with no network
(``--no-index --no-build-isolation``) and with no build dependency to fetch. It packs
``trtcache_client/`` (the ``.py`` files and ``py.typed``) into a pure-Python wheel, or an
sdist of this folder; the metadata comes from ``pyproject.toml``'s ``[project]`` table.
"""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11: the few keys needed, read by hand
    tomllib = None

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "trtcache_client"


def _project():
    path = os.path.join(HERE, "pyproject.toml")
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    import ast

    out, section = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
                continue
            if section == "project" and "=" in line and not line.startswith("#"):
                k, v = (s.strip() for s in line.split("=", 1))
                if k in ("name", "version", "description", "requires-python", "readme"):
                    out[k] = ast.literal_eval(v)
    return out


def _metadata():
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % p["name"],
        "Version: %s" % p["version"],
        "Summary: %s" % p.get("description", ""),
        "Requires-Python: %s" % p.get("requires-python", ">=3.9"),
        "License: Apache-2.0",
        "Classifier: Typing :: Typed",
        "Provides-Extra: ort",
        'Requires-Dist: onnxruntime; extra == "ort"',
    ]
    readme = os.path.join(HERE, p.get("readme", "README.md"))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return p, "\n".join(lines) + "\n\n" + body


def _files():
    root = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            yield os.path.join(root, name), "%s/%s" % (PACKAGE, name)


def _dist_info(p):
    return "%s-%s.dist-info" % (p["name"].replace("-", "_"), p["version"])


def _write_dist_info(directory, p, meta):
    d = os.path.join(directory, _dist_info(p))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(meta)
    return os.path.basename(d)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p, meta = _metadata()
    return _write_dist_info(metadata_directory, p, meta)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [(arc, _read(src)) for src, arc in _files()])


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a wheel holding a ``.pth`` file that puts this folder on ``sys.path``."""
    return _wheel(wheel_directory, [("trtcache_client_editable.pth", (HERE + "\n").encode())])


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _wheel(wheel_directory, entries):
    p, meta = _metadata()
    di = _dist_info(p)
    name = "%s-%s-py3-none-any.whl" % (p["name"].replace("-", "_"), p["version"])
    entries = list(entries)
    entries.append(("%s/METADATA" % di, meta.encode()))
    entries.append(
        (
            "%s/WHEEL" % di,
            b"Wheel-Version: 1.0\nGenerator: trtcache _build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    record = io.StringIO()
    for arc, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write("%s,sha256=%s,%d\n" % (arc, digest, len(data)))
    record.write("%s/RECORD,,\n" % di)
    entries.append(("%s/RECORD" % di, record.getvalue().encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            z.writestr(zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    p, meta = _metadata()
    base = "%s-%s" % (p["name"].replace("-", "_"), p["version"])
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/backend.py"]:
            t.add(os.path.join(HERE, rel), arcname="%s/%s" % (base, rel))
        for src, arc in _files():
            t.add(src, arcname="%s/%s" % (base, arc))
        info = tarfile.TarInfo("%s/PKG-INFO" % base)
        data = meta.encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return name
