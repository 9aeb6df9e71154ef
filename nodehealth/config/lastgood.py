"""The last configuration that validated on this node, kept in the persistent dir.

When a face or the daemon loads a config file that validates, it records the file's text, path,
identity (``nodehealth.config.lean.identity``), sha256 and the time in
``<persistent_dir>/config-good.json`` (``layout.path_for``; only when one of them changed). When the file stops
validating, the faces and the daemon run with that text instead (``nodehealth.config.loader.
load_safe``), so a bad edit never turns the checks off. Each ``record`` also keeps the prolog
fast path's settings for the file (``nodehealth.config.snapshot``), which the fast path reads
instead of this record: it answers from the daemon's verdict only while the file is still the one
that validated (the snapshot's identity; ``unchanged`` says the same from this record), otherwise
the cold path runs and reports.

Standard library and ``nodehealth.statedir`` only at import time; ``hashlib`` is imported only when
a record is written or read back for use.
"""

from __future__ import annotations

from nodehealth.config import snapshot
from nodehealth.statedir import files, layout

TYPE_CHECKING = False
if TYPE_CHECKING:  # no typing import at run time: the fast path pays for every module
    from typing import Any, Optional

VERSION = 1
KIND = "nodehealth-config-good"
MAX_BYTES = 4 << 20  # the text (at most lean.MAX_BYTES) JSON-escaped, with room to spare


def path_in(paths: Any) -> str:
    """The record's path: in ``paths.persistent_dir`` (the config's [paths], or the fast path's
    settings); a plain string is the one directory that holds it (``layout.dir_for``)."""
    return layout.path_for(paths, layout.CONFIG_GOOD)


def _sha256(text: str) -> str:
    """The text's SHA-256, by the interpreter's own implementation where it has one: ``hashlib`` loads
    OpenSSL's libcrypto (3.4 MiB of a long-lived daemon's RSS) for a digest the builtin module gives
    alike. Builds without it (e.g. a distribution that leaves these digests to OpenSSL) use hashlib."""
    data = text.encode("utf-8")
    for name in ("_sha2", "_sha256"):  # Python 3.12+, then 3.9-3.11
        try:
            module = __import__(name)
        except ImportError:
            continue
        return str(module.sha256(data).hexdigest())
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _identity_ok(value: Any) -> bool:
    return value is None or (
        isinstance(value, list)
        and len(value) == 5
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in value)
    )


def read(paths: Any) -> Optional[dict[str, Any]]:
    """The record as written, or None when it is missing, unreadable or not a whole record."""
    raw = files.read_object(path_in(paths), MAX_BYTES)
    if raw is None or raw.get("v") != VERSION or raw.get("kind") != KIND:
        return None
    when = raw.get("validated_at")
    if not (
        isinstance(raw.get("path"), str)
        and isinstance(raw.get("text"), str)
        and isinstance(raw.get("sha256"), str)
        and _identity_ok(raw.get("identity"))
        and isinstance(when, (int, float))
        and not isinstance(when, bool)
        and 0 <= when < 1e11
    ):
        return None
    return raw


def unchanged(paths: Any, path: str, ident: Optional[list[int]]) -> str:
    """ "" when ``path`` with identity ``ident`` is the file last validated on this node, else why not."""
    rec = read(paths)
    if rec is None:
        return f"config {path} has not been validated on this node yet"
    if rec["path"] != path or rec["identity"] != ident:
        return f"config {path} changed since it last validated"
    return ""


def record(paths: Any, path: str, text: str, ident: Optional[list[int]], now: float) -> bool:
    """Keep ``text`` as the last config that validated on this node; False when already kept (raises OSError).

    The prolog fast path's settings for the file are kept too, each time (``config.snapshot.keep``:
    written only when they changed; a snapshot that cannot be kept only means cold prologs, which say why).
    """
    snapshot.keep(path, text, ident, paths)
    digest = _sha256(text)
    old = read(paths)
    if old is not None and (old["path"], old["identity"], old["sha256"]) == (path, ident, digest):
        return False
    # The persistent dir's own check first (created 0700, refused when not trusted): the record is the
    # first thing a fresh node's first face or daemon writes, and it holds the config's text.
    rec = {
        "v": VERSION,
        "kind": KIND,
        "path": path,
        "identity": ident,
        "sha256": digest,
        "validated_at": now,
        "text": text,
    }
    files.write_state_json(layout.dir_for(paths, layout.CONFIG_GOOD), path_in(paths), rec, compact=True)
    return True


def none_yet(*records: str) -> str:
    """Why there is no last good config, naming every record file looked for (one clause, not one each)."""
    where = records[0] if len(records) == 1 else "neither " + " nor ".join(records)
    return f"no configuration has validated on this node ({where})"


def recall(paths: Any, path: str) -> tuple[Optional[dict[str, Any]], str]:
    """The record for ``path`` whose text still matches its hash, or ``(None, why not)``."""
    rec = read(paths)
    if rec is None:
        return None, none_yet(path_in(paths))
    if rec["path"] != path:
        return None, f"the last configuration that validated here is {rec['path']}, not {path}"
    if _sha256(rec["text"]) != rec["sha256"]:
        return None, f"{path_in(paths)}: the text does not match its sha256"
    return rec, ""
