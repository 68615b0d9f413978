"""A PEP 517 build backend for the hook that needs only the standard library.

pip installs the hook without reaching a package index: pyproject.toml names
this module (build-backend with backend-path), so no setuptools or wheel is
fetched for build isolation. It builds a pure-Python wheel of the deepseed
package, an sdist, and an editable wheel (PEP 660) that puts the source tree
on sys.path through a .pth file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "deepseed"
TAG = "py3-none-any"

try:  # Python 3.11+
    import tomllib as _toml
except ImportError:  # pragma: no cover - older interpreters
    _toml = None


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    with open(path, "rb") as f:
        data = f.read()
    if _toml is not None:
        return _toml.loads(data.decode("utf-8"))["project"]
    return _parse_project(data.decode("utf-8"))


def _parse_project(text):
    """The [project] table's simple keys, for interpreters without tomllib.

    Only what this file's pyproject.toml uses: strings, string lists and
    inline tables of strings, plus the optional-dependencies table.
    """
    project, extras, section = {}, {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]").strip()
            continue
        if "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        if section == "project":
            project[key] = _value(value)
        elif section == "project.optional-dependencies":
            extras[key] = _value(value)
    if extras:
        project["optional-dependencies"] = extras
    return project


def _value(text):
    if text.startswith('"'):
        return text[1:-1]
    if text.startswith("["):
        return re.findall(r'"([^"]*)"', text)
    if text.startswith("{"):
        return dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', text))
    return text


def _names():
    p = _project()
    name = re.sub(r"[-_.]+", "_", p["name"]).lower()
    return p, name, p["version"]


def _metadata(p):
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % p["name"],
        "Version: %s" % p["version"],
    ]
    if p.get("description"):
        lines.append("Summary: %s" % p["description"])
    if p.get("requires-python"):
        lines.append("Requires-Python: %s" % p["requires-python"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: %s" % lic["text"])
    for dep in p.get("dependencies") or []:
        lines.append("Requires-Dist: %s" % dep)
    for extra, deps in sorted((p.get("optional-dependencies") or {}).items()):
        lines.append("Provides-Extra: %s" % extra)
        for dep in deps:
            lines.append('Requires-Dist: %s; extra == "%s"' % (dep, extra))
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str) and os.path.exists(os.path.join(ROOT, readme)):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _wheel_file():
    return "Wheel-Version: 1.0\nGenerator: deepseed-backend\nRoot-Is-Purelib: true\nTag: %s\n" % TAG


def _package_files():
    base = os.path.join(ROOT, PACKAGE)
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(dirpath, fn)
            out.append((os.path.relpath(full, ROOT).replace(os.sep, "/"), full))
    return out


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _write_wheel(wheel_directory, files):
    """files: list of (arcname, bytes) outside dist-info."""
    p, name, version = _names()
    dist_info = "%s-%s.dist-info" % (name, version)
    filename = "%s-%s-%s.whl" % (name, version, TAG)
    entries = list(files)
    entries.append((dist_info + "/METADATA", _metadata(p).encode("utf-8")))
    entries.append((dist_info + "/WHEEL", _wheel_file().encode("utf-8")))
    record = [_record_line(a, d) for a, d in entries]
    record.append(dist_info + "/RECORD,,")
    entries.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    path = os.path.join(wheel_directory, filename)
    stamp = _epoch()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in entries:
            info = zipfile.ZipInfo(arcname, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return filename


def _epoch():
    # Reproducible builds honour SOURCE_DATE_EPOCH; zip cannot store before 1980.
    t = int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))
    return time.gmtime(max(t, 315532800))[:6]


def _read(full):
    with open(full, "rb") as f:
        return f.read()


# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p, name, version = _names()
    dist_info = "%s-%s.dist-info" % (name, version)
    os.makedirs(os.path.join(metadata_directory, dist_info), exist_ok=True)
    with open(os.path.join(metadata_directory, dist_info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(p))
    with open(os.path.join(metadata_directory, dist_info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    return dist_info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(a, _read(f)) for a, f in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _, name, _ = _names()
    pth = (ROOT + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, [("_%s_editable.pth" % name, pth)])


def build_sdist(sdist_directory, config_settings=None):
    p, name, version = _names()
    base = "%s-%s" % (name, version)
    filename = base + ".tar.gz"
    members = [(a, f) for a, f in _package_files()]
    for extra in ("pyproject.toml", "README.md"):
        if os.path.exists(os.path.join(ROOT, extra)):
            members.append((extra, os.path.join(ROOT, extra)))
    for fn in sorted(os.listdir(os.path.join(ROOT, "_build"))):
        if fn.endswith(".py"):
            members.append(("_build/" + fn, os.path.join(ROOT, "_build", fn)))
    pkg_info = _metadata(p).encode("utf-8")
    stamp = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    path = os.path.join(sdist_directory, filename)
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for arcname, data in [("PKG-INFO", pkg_info)] + [(a, _read(f)) for a, f in members]:
            info = tarfile.TarInfo(base + "/" + arcname)
            info.size = len(data)
            info.mtime = stamp
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return filename
