"""The distribution packages (docs/install.md): the .deb built by scripts/build-deb.sh and the RPM by
scripts/build-rpm.sh, each into a temporary directory, then inspected with dpkg-deb, lintian and rpm.
Nothing is installed: the .deb is unpacked with ``dpkg -x`` into the test's directory and its programs run
from there. Installing, upgrading and purging it happens in CI only (scripts/deb-check.sh)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from nodehealth_sim.driver import BRANCHES

from nodehealth.faces import table

ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'__version__ = "(.*)"', (ROOT / "nodehealth" / "__init__.py").read_text()).group(1)  # type: ignore[union-attr]
SYSTEM_PYTHON = "/usr/bin/python3"
SITE = "usr/lib/python3/dist-packages"
HAVE_DEB = all(shutil.which(t) for t in ("dpkg-buildpackage", "dh", "pybuild", "dpkg-deb"))
HAVE_RPM = shutil.which("rpmbuild") is not None
needs_deb = pytest.mark.skipif(
    not HAVE_DEB, reason="Debian build tools missing (make system-deps: debhelper, dh-python, pybuild-plugin-pyproject)"
)
needs_rpm = pytest.mark.skipif(not HAVE_RPM, reason="rpmbuild missing (Debian package rpm; make system-deps)")
SCRIPTS = tuple(table.scripts())  # the administrator's command and every face (nodehealth.faces.table)


def run(*cmd: str, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def _build(script: str, work: Path, dist: Path, *extra: str) -> Path:
    res = run("bash", str(ROOT / "scripts" / script), str(work), str(dist), *extra, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    (pkg,) = [p for p in dist.iterdir() if p.suffix in (".deb", ".rpm") and not p.name.startswith("nodehealth-sim")]
    return pkg


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_DEB:
        pytest.skip("Debian build tools missing (make system-deps)")
    top = tmp_path_factory.mktemp("deb")
    return _build("build-deb.sh", top / "work", top / "dist")


@pytest.fixture(scope="module")
def rpm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_RPM:
        pytest.skip("rpmbuild missing (make system-deps)")
    top = tmp_path_factory.mktemp("rpm")
    return _build("build-rpm.sh", top / "work", top / "dist", VERSION)


def deb_field(deb: Path, field: str) -> str:
    return run("dpkg-deb", "-f", str(deb), field).stdout.strip()


def deb_files(deb: Path) -> set[str]:
    out = run("dpkg-deb", "-c", str(deb)).stdout
    return {line.split(None, 5)[5].split(" -> ")[0].lstrip(".").rstrip("/") for line in out.splitlines()}


@pytest.mark.real
@needs_deb
def test_deb_depends_on_debian_packages_and_vendors_the_rest(deb: Path) -> None:
    depends = {d.split()[0] for d in re.split(r",\s*|\s*\|\s*", deb_field(deb, "Depends"))}
    assert {"python3-psutil", "python3-systemd", "python3-tomli"} <= depends
    assert "python3-prometheus-client" not in depends, (
        "the daemon writes the text format itself (metrics/exposition.py)"
    )
    assert not {d for d in depends if "nvml" in d or "hostlist" in d}, depends
    assert deb_field(deb, "Version") == VERSION


@pytest.mark.real
@needs_deb
def test_deb_installs_what_the_cluster_names(deb: Path) -> None:
    files = deb_files(deb)
    expected = {f"/usr/bin/{s}" for s in SCRIPTS} | {
        "/lib/systemd/system/nodehealth.service",
        "/etc/nodehealth/nodehealth.toml",
        "/usr/lib/tmpfiles.d/nodehealth.conf",
        "/usr/share/doc/nodehealth/daemon.md",
        "/usr/share/doc/nodehealth/copyright",
        "/usr/share/man/man8/nodehealth.8.gz",
        "/usr/share/man/man8/nodehealth-prolog.8.gz",
        "/usr/share/nodehealth/scenarios/healthy-8x-h100.toml",
        "/usr/share/nodehealth/deploy/slurm/slurm.conf.example",
        f"/{SITE}/nodehealth-vendor.pth",
        f"/{SITE}/nodehealth/_vendor/pynvml.py",
        f"/{SITE}/nodehealth/_vendor/hostlist.py",
        f"/{SITE}/nodehealth/_vendor/hostlist.COPYING",
        f"/{SITE}/nodehealth/cli.py",
        f"/{SITE}/nodehealth/data/xid_catalog.toml",
    }
    assert expected - files == set()
    assert not [f for f in files if "libnvidia-ml" in f or "nodehealth_sim" in f or "/sim/" in f]  # nodehealth-sim's
    assert deb_field(deb, "Architecture") == "all"
    assert not [f for f in files if f.endswith(".pyc")]  # compiled at install by dh_python3's postinst
    assert not [f for f in files if f.startswith("/usr/local") or "/build/pkg" in f]


@pytest.fixture(scope="module")
def sim_deb(deb: Path) -> Path:
    """nodehealth-sim's .deb, built beside the product's by the same scripts/build-deb.sh."""
    (pkg,) = deb.parent.glob("nodehealth-sim_*.deb")
    return pkg


@pytest.mark.real
@needs_deb
def test_the_simulator_is_its_own_deb(sim_deb: Path) -> None:
    files = deb_files(sim_deb)
    libs = {f"/{SITE}/nodehealth_sim/fakenvml/build/{b}/libnvidia-ml.so.1" for b in BRANCHES}
    assert libs | {"/usr/bin/nodehealth-sim", f"/{SITE}/nodehealth_sim/validation/replay.py"} <= files
    assert sorted(f for f in files if "libnvidia-ml" in f) == sorted(libs)
    assert not [f for f in files if f.startswith(f"/{SITE}/nodehealth/")]
    assert f"nodehealth (= {VERSION})" in deb_field(sim_deb, "Depends")
    assert deb_field(sim_deb, "Version") == VERSION


@pytest.mark.real
def tmpfiles_lines(text: str) -> list[list[str]]:
    """The entries of a tmpfiles.d(5) file: type, path, mode, user, group, age (comments dropped)."""
    return [line.split() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


STATE_DIRS = ("/run/nodehealth", "/var/lib/nodehealth")  # [paths] state_dir and persistent_dir by default


def test_the_state_dir_is_root_s_alone_in_every_package() -> None:
    """tmpfiles.d (the .deb and the RPM install the same file) and the RPM's own %dir say 0700 root:root,
    for the run dir and the persistent dir alike; the unit's RuntimeDirectoryMode and StateDirectoryMode
    are tests/test_systemd.py's (REQUIRED)."""
    from nodehealth.config.lean import documented
    from nodehealth.config.schema import Paths

    # What the packages make is the default (the production one: the suite moves it into its sandbox).
    assert (documented(Paths().state_dir), documented(Paths().persistent_dir)) == STATE_DIRS
    entries = tmpfiles_lines((ROOT / "packaging" / "debian" / "nodehealth.tmpfiles").read_text())
    assert [e[:5] for e in entries] == [["d", d, "0700", "root", "root"] for d in STATE_DIRS]
    assert [e[5] for e in entries] == ["-", "-"]  # never aged: a drain record lives until it is resolved
    spec = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text()
    for d in STATE_DIRS:
        assert f"%dir %attr(0700,root,root) {d}" in spec
        assert re.search(rf"install -d -m 0700 %\{{buildroot\}}{d}\n", spec)
        assert not re.search(rf"{d}.*07[0-7][1-7]|07[0-7][1-7].*{d}", spec)
    check = (ROOT / "scripts" / "deb-check.sh").read_text()
    assert '"$(stat -c %a /run/nodehealth)" = 700' in check
    assert '"$(stat -c \'%a %U:%G\' /var/lib/nodehealth)" = "700 root:root"' in check
    assert re.search(r"for p in [^;]*/var/lib/nodehealth", check)  # and the purge removes it


def test_the_persistent_dir_is_removed_on_purge_only() -> None:
    """The .deb's postrm removes both state dirs on purge (and only then: a remove keeps the drain
    records); the RPM keeps /var/lib on erase, as RPM keeps state, and removes the tmpfs one."""
    postrm = (ROOT / "packaging" / "debian" / "nodehealth.postrm").read_text()
    (block,) = re.findall(r'if \[ "\$1" = "purge" \]; then\n(.*?)\nfi', postrm, re.S)
    assert block.split() == ["rm", "-rf", *STATE_DIRS]
    assert postrm.count("/var/lib/nodehealth") == 2  # the comment and the purge
    spec = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text()
    postun = spec.split("%postun", 1)[1].split("%files", 1)[0]
    assert "rm -rf /run/nodehealth" in postun and "/var/lib/nodehealth" not in postun


@needs_deb
def test_deb_control_files(deb: Path, tmp_path: Path) -> None:
    run("dpkg-deb", "-e", str(deb), str(tmp_path / "ctl"), check=True)
    ctl = tmp_path / "ctl"
    assert (ctl / "conffiles").read_text().split() == ["/etc/nodehealth/nodehealth.toml"]
    assert not (ctl / "shlibs").exists() and not (ctl / "triggers").exists()
    postinst = (ctl / "postinst").read_text()
    assert "py3compile -p nodehealth" in postinst  # bytecode at install
    assert "systemd-tmpfiles" in postinst  # the state dir, 0700 root (test_the_state_dir_is_root_s_alone...)
    # Never started; enabled again on upgrade only where an administrator had enabled it.
    assert "deb-systemd-invoke" not in postinst
    assert re.search(r"was-enabled 'nodehealth.service'; then\s+#[^\n]*\n\s+deb-systemd-helper enable", postinst)
    assert postinst.count("deb-systemd-helper enable") == 1
    assert "py3clean -p nodehealth" in (ctl / "prerm").read_text()
    postrm = (ctl / "postrm").read_text()
    assert "rm -rf /run/nodehealth /var/lib/nodehealth" in postrm and "deb-systemd-helper purge" in postrm


@pytest.mark.real
@needs_deb
@pytest.mark.skipif(shutil.which("lintian") is None, reason="lintian missing (make system-deps)")
def test_deb_lintian_clean(deb: Path) -> None:
    res = run(
        "lintian",
        "--fail-on",
        "error,warning",
        "--suppress-tags-from-file",
        str(ROOT / "packaging" / "debian" / "lintian-explained"),
        str(deb),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not [line for line in res.stdout.splitlines() if line[:2] in ("E:", "W:")], res.stdout


@pytest.fixture(scope="module")
def unpacked(deb: Path, sim_deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both packages unpacked into one root (nodehealth with nodehealth-sim)."""
    root = tmp_path_factory.mktemp("unpacked")
    run("dpkg", "-x", str(deb), str(root), check=True)
    run("dpkg", "-x", str(sim_deb), str(root), check=True)
    return root


@pytest.fixture(scope="module")
def unpacked_product(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The product's package alone, as on a production node."""
    root = tmp_path_factory.mktemp("unpacked-product")
    run("dpkg", "-x", str(deb), str(root), check=True)
    return root


def run_unpacked(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """The package's nodehealth from the unpacked tree, under Debian's Python with its dist-packages: the
    site dir is added as site.py adds an installed one (the vendor .pth included)."""
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[1:]; "
        "from nodehealth.cli import main; sys.exit(main())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NODEHEALTH_", "VIRTUAL_ENV"))}
    return run(SYSTEM_PYTHON, "-I", "-c", code, str(root / SITE), *argv, env=env, cwd=root)


@pytest.mark.real
@needs_deb
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="no /usr/bin/python3")
def test_unpacked_deb_runs_a_shipped_scenario(unpacked: Path) -> None:
    assert VERSION in run_unpacked(unpacked, "--version").stdout
    scenarios = unpacked / "usr/share/nodehealth/scenarios"
    ok = run_unpacked(unpacked, "check", "--simulate", str(scenarios / "healthy-8x-h100.toml"), "-q")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run_unpacked(unpacked, "check", "--simulate", str(scenarios / "row-remap-pending.toml"), "-q")
    assert bad.returncode == 1 and "gpu_remapped_rows" in bad.stdout, bad.stdout + bad.stderr
    mods = run(
        SYSTEM_PYTHON,
        "-I",
        "-c",
        "import site, sys; site.addsitedir(sys.argv[1]); import pynvml, hostlist; "
        "print(pynvml.__file__); print(hostlist.__file__)",
        str(unpacked / SITE),
    ).stdout
    assert mods.count(str(unpacked / SITE / "nodehealth" / "_vendor")) == 2, mods


@pytest.mark.real
@needs_deb
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="no /usr/bin/python3")
def test_unpacked_product_without_the_simulator_says_what_to_install(unpacked_product: Path) -> None:
    scenario = unpacked_product / "usr/share/nodehealth/scenarios/healthy-8x-h100.toml"
    res = run_unpacked(unpacked_product, "check", "--simulate", str(scenario), "-q")
    assert res.returncode == 2 and "pip install nodehealth-sim" in res.stderr, res.stdout + res.stderr


def rpm_q(pkg: Path, *query: str) -> list[str]:
    res = run("rpm", "-qp", *query, str(pkg))
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


@pytest.mark.real
@needs_rpm
def test_rpm_file_list(rpm: Path) -> None:
    files = set(rpm_q(rpm, "-l"))
    site = "/usr/lib/python3.9/site-packages"
    expected = {f"/usr/bin/{s}" for s in SCRIPTS} | {
        "/usr/lib/systemd/system/nodehealth.service",
        "/etc/nodehealth/nodehealth.toml",
        "/run/nodehealth",
        "/usr/lib/tmpfiles.d/nodehealth.conf",
        f"{site}/nodehealth/cli.py",
        f"{site}/nodehealth-vendor.pth",
        f"{site}/nodehealth/_vendor/pynvml.py",
        f"{site}/nodehealth/_vendor/hostlist.py",
        f"{site}/nodehealth/_vendor/tomli/__init__.py",
        f"{site}/nodehealth-{VERSION}.dist-info/entry_points.txt",
        "/usr/share/nodehealth/scenarios/healthy-8x-h100.toml",
    }
    assert expected - files == set()
    assert not [f for f in files if "libnvidia-ml" in f or "nodehealth_sim" in f or "/sim/" in f]
    assert any(m.startswith("/usr/share/man/man8/nodehealth-prolog.8") for m in files)
    pyc = [f for f in files if f.endswith(".pyc")]
    assert f"{site}/nodehealth/faces/__pycache__/prolog.cpython-39.pyc" in pyc or any(".cpython-3" in f for f in pyc)
    assert len(pyc) >= len([f for f in files if f.startswith(f"{site}/nodehealth/") and f.endswith(".py")])
    assert rpm_q(rpm, "-c") == ["/etc/nodehealth/nodehealth.toml"]
    assert "/etc/nodehealth/nodehealth.toml" in rpm_q(rpm, "--configfiles")


@pytest.mark.real
@needs_rpm
def test_rpm_requires_and_provides(rpm: Path) -> None:
    requires = {r.split()[0] for r in rpm_q(rpm, "--requires")}
    assert {"python3", "python3-psutil", "python3-systemd", "/usr/bin/python3"} <= requires
    assert "python3-prometheus_client" not in requires
    assert not [r for r in requires if r.startswith("/root") or "pyenv" in r or "nvml" in r.lower()], requires
    provides = rpm_q(rpm, "--provides")
    assert not [p for p in provides if "libnvidia-ml" in p], provides  # the simulated driver stays private
    assert "bundled(python3dist(nvidia-ml-py)) = 13.615.71" in provides


@pytest.mark.real
@needs_rpm
def test_rpm_scriptlets_never_enable_the_unit(rpm: Path) -> None:
    scripts = "\n".join(rpm_q(rpm, "--scripts"))
    assert "systemd-tmpfiles --create nodehealth.conf" in scripts
    assert "disable --now nodehealth.service" in scripts and "rm -rf /run/nodehealth" in scripts
    assert "systemctl enable" not in scripts and "systemctl start" not in scripts


def test_vendor_pins_satisfy_pyproject() -> None:
    pins = dict(re.findall(r"^([A-Z]+)_PIN=(\S+)$", (ROOT / "packaging" / "vendor.sh").read_text(), re.M))
    pyproject = (ROOT / "pyproject.toml").read_text()

    def version(pin: str) -> tuple[int, ...]:
        return tuple(int(x) for x in pin.split("==")[1].split("."))

    for key, dist in (("NVML", "nvidia-ml-py"), ("HOSTLIST", "python-hostlist"), ("TOMLI", "tomli")):
        floor = re.search(rf'"{dist}>=([\d.]+)', pyproject).group(1)  # type: ignore[union-attr]
        assert version(pins[key]) >= tuple(int(x) for x in floor.split(".")), (dist, pins[key], floor)
    spec = (ROOT / "packaging" / "rpm" / "nodehealth.spec").read_text()
    for key, dist in (("NVML", "nvidia-ml-py"), ("HOSTLIST", "python-hostlist"), ("TOMLI", "tomli")):
        assert f"bundled(python3dist({dist})) = {pins[key].split('==')[1]}" in spec
    assert f"Version:        {VERSION}" in spec
    assert (ROOT / "packaging" / "debian" / "changelog").read_text().startswith(f"nodehealth ({VERSION})")


def test_the_ansible_role_makes_both_state_dirs_root_s_alone() -> None:
    """The role makes the configured state_dir and persistent_dir (defaults: the packages'), 0700 root, and a
    config that names only state_dir gets that one directory for both, as the loader reads it."""
    tasks = (ROOT / "deploy" / "ansible" / "roles" / "nodehealth" / "tasks" / "main.yml").read_text()
    (task,) = [t for t in tasks.split("\n- name: ") if t.startswith("State directories")]
    assert 'mode: "0700"' in task and "owner: root" in task and "group: root" in task
    assert "nodehealth_paths.get('state_dir', '/run/nodehealth')" in task
    assert "nodehealth_paths.get('persistent_dir', nodehealth_paths.get('state_dir', '/var/lib/nodehealth'))" in task
    assert tasks.index("State directories") < tasks.index("- name: Configuration")
