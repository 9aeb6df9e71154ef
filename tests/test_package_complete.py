"""The package complete: what a built package says about itself (the commit of --version, control's
fields), compared with the program and the checkout it is built from."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ROOT / "scripts" / "stamp-commit.py"
PLACEHOLDERS = re.compile(r"example\.(org|com|net)|localhost|changeme|TODO|FIXME|@invalid", re.I)


def _tree(tmp: Path) -> Path:
    """A copy of the package outside any git checkout, as a build stages it."""
    tree = tmp / "tree"
    shutil.copytree(
        ROOT / "nodehealth", tree / "nodehealth", ignore=shutil.ignore_patterns("__pycache__", "_commit.py")
    )
    return tree


def _commit_seen_from(tree: Path) -> str:
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); "
        "from nodehealth.commands.version import commit; print(commit())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _git_head() -> str:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    return sha.stdout.strip()


def test_version_names_the_commit_written_at_build_time_and_no_git_at_run_time(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert _commit_seen_from(tree) == "None"  # no .git above the copy, and nothing stamped
    proc = subprocess.run([sys.executable, str(STAMP), str(tree)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = _commit_seen_from(tree)
    assert seen.split("+")[0] == _git_head() and re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", seen), seen
    # The whole --version line of that tree, as the installed program prints it.
    code = (
        f"import sys; sys.path.insert(0, {str(tree)!r}); from nodehealth.cli import main; sys.exit(main(['--version']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    assert f"(commit {seen})" in out.stdout.splitlines()[0], out.stdout
    # The version module reads a file; it never starts git.
    assert "subprocess" not in (ROOT / "nodehealth" / "commands" / "version.py").read_text(encoding="utf-8")


def test_stamp_refuses_what_is_not_a_commit(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    bad = subprocess.run([sys.executable, str(STAMP), str(tree), 'x"; import os'], capture_output=True, text=True)
    assert bad.returncode == 2 and not (tree / "nodehealth" / "_commit.py").exists()


def test_both_package_builds_stamp_the_commit() -> None:
    for script in ("build-deb.sh", "build-rpm.sh"):
        assert "scripts/stamp-commit.py" in (ROOT / "scripts" / script).read_text(encoding="utf-8"), script
    assert "nodehealth/_commit.py" in (ROOT / ".gitignore").read_text(encoding="utf-8")


def test_control_names_a_real_maintainer_and_the_project_homepage() -> None:
    control = (ROOT / "packaging" / "debian" / "control").read_text(encoding="utf-8")
    fields = dict(re.findall(r"^(Maintainer|Homepage): (.+)$", control, re.M))
    assert fields["Homepage"] == "https://github.com/nodehealth/nodehealth"
    assert re.fullmatch(r"[\w .-]+ <[\w.+-]+@[\w-]+(\.[\w-]+)+>", fields["Maintainer"]), fields
    assert not PLACEHOLDERS.search(fields["Maintainer"]), fields
    # The changelogs sign with the same name (a maintainer's own upload, not an NMU), the RPM's too.
    for entry in re.findall(r"^ -- (.+?>)  ", (ROOT / "packaging" / "debian" / "changelog").read_text(), re.M):
        assert entry == fields["Maintainer"]
    spec = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text(encoding="utf-8")
    assert not PLACEHOLDERS.search(spec.split("%changelog", 1)[1]) and fields["Maintainer"] in spec
    assert (
        f"DEBEMAIL={fields['Maintainer'].split('<')[1].rstrip('>')}" in (ROOT / "scripts" / "build-deb.sh").read_text()
    )
