"""Docs that cannot drift: what they say of the program is compared with the program itself."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from nodehealth.config.schema import DaemonSettings
from nodehealth.daemon.http import parse_listen

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_metrics_listen_on_this_node_only_by_default_and_the_docs_say_so() -> None:
    """A package started as installed opens nothing on the site's networks; a Prometheus on another
    host needs an explicit address, which docs/daemon.md says how to give."""
    default = DaemonSettings().listen
    host, _ = parse_listen(default)
    assert ipaddress.ip_address(host).is_loopback, default
    for doc in ("daemon.md", "security.md"):
        assert f"`{default}`" in _doc(doc) or f'listen = "{default}"' in _doc(doc), doc
    assert "A Prometheus on another host needs an explicit listen address" in _doc("daemon.md")
    assert default in (ROOT / "deploy" / "prometheus" / "scrape.yml").read_text(encoding="utf-8")
