"""platform.ground: each test is an attack on a name in a shared directory, and what holds against it."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from nodehealth.platform import ground

NOBODY = 65534


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o1777)
    return d


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.mkdir(mode=0o700)
    (v / "secret").write_bytes(b"root's own words\n")
    (v / "secret").chmod(0o600)
    return v


def _fd_dir(shared: Path) -> int:
    return os.open(shared, os.O_RDONLY | os.O_DIRECTORY)


# --- directories -------------------------------------------------------------------------------


def test_make_own_dir_is_fresh_private_and_ours_whatever_the_umask(shared: Path) -> None:
    old = os.umask(0o077)
    try:
        fd, name = ground.make_own_dir(str(shared), ".x-", 0o750)
    finally:
        os.umask(old)
    try:
        st = os.lstat(shared / name)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o750 and st.st_uid == os.geteuid()
        assert name.startswith(".x-") and len(name) == 3 + 2 * ground.TOKEN_BYTES
        assert os.fstat(fd).st_ino == st.st_ino
        fd2, name2 = ground.make_own_dir(str(shared), ".x-")
        os.close(fd2)
        assert name2 != name
    finally:
        os.close(fd)


def test_open_own_dir_refuses_a_symlink_to_a_victim_dir_naming_its_owner(shared: Path, victim: Path) -> None:
    link = shared / "exchange"
    link.symlink_to(victim)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(ground.Foreign, match=r"is a symbolic link, not a directory, owned by uid 65534"):
        ground.open_own_dir(str(link))
    assert (victim / "secret").read_bytes() == b"root's own words\n"


def test_open_own_dir_refuses_another_users_dir_and_a_dir_others_can_write(shared: Path) -> None:
    planted = shared / "planted"
    planted.mkdir()
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(ground.Foreign, match=r"owned by uid 65534 \(nobody\), not by uid 0"):
        ground.open_own_dir(str(planted))
    open_ = shared / "open"
    open_.mkdir()
    open_.chmod(0o777)
    with pytest.raises(ground.Foreign, match=r"writable by group or others \(mode 0777\)"):
        ground.open_own_dir(str(open_))
    fd = ground.open_own_dir(str(shared / ".."))  # tmp_path: ours, 0700
    os.close(fd)


def test_a_dir_swapped_for_a_link_after_it_was_opened_is_not_followed(shared: Path, victim: Path) -> None:
    mine = shared / "mine"
    mine.mkdir(mode=0o700)
    fd = ground.open_own_dir(str(mine))
    try:
        os.rename(mine, shared / "moved")  # between the check and the use
        (shared / "mine").symlink_to(victim)
        ground.create_new(fd, "secret", b"ours\n")
        ground.unlink_own(fd, "secret")
        ground.create_new(fd, "secret", b"ours again\n")
    finally:
        os.close(fd)
    assert (victim / "secret").read_bytes() == b"root's own words\n"
    assert (shared / "moved" / "secret").read_bytes() == b"ours again\n"


def test_remove_own_dir_leaves_a_name_that_now_holds_someone_elses_dir(shared: Path) -> None:
    pfd = _fd_dir(shared)
    fd, name = ground.make_own_dir(str(shared), ".x-")
    try:
        os.rename(shared / name, shared / "ours-moved")
        (shared / name).mkdir()
        os.chown(shared / name, NOBODY, NOBODY)
        assert ground.remove_own_dir(pfd, name, fd) is False
        assert (shared / name).is_dir()
        os.rmdir(shared / name)
        os.rename(shared / "ours-moved", shared / name)
        assert ground.remove_own_dir(pfd, name, fd) is True
        assert not (shared / name).exists()
    finally:
        os.close(fd)
        os.close(pfd)


# --- files ------------------------------------------------------------------------------------


def test_create_new_never_writes_through_a_planted_symlink(shared: Path, victim: Path) -> None:
    fd = _fd_dir(shared)
    try:
        (shared / "report.md").symlink_to(victim / "secret")
        with pytest.raises(FileExistsError):
            ground.create_new(fd, "report.md", b"overwritten\n")
        (shared / "dangling").symlink_to(victim / "new-file")
        with pytest.raises(FileExistsError):
            ground.create_new(fd, "dangling", b"created through the link\n")
    finally:
        os.close(fd)
    assert (victim / "secret").read_bytes() == b"root's own words\n"
    assert not (victim / "new-file").exists()


def test_create_new_sets_the_mode_whatever_the_umask(tmp_path: Path) -> None:
    fd = _fd_dir(tmp_path)
    old = os.umask(0)
    try:
        ground.create_new(fd, "f", b"x", 0o600)
    finally:
        os.umask(old)
        os.close(fd)
    assert stat.S_IMODE(os.lstat(tmp_path / "f").st_mode) == 0o600


def test_replace_own_replaces_the_link_itself_not_its_target(tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "calls.jsonl").symlink_to(victim / "secret")
    fd = ground.open_own_dir(str(out))
    try:
        ground.replace_own(fd, "calls.jsonl", b"new\n")
        ground.replace_own(fd, "calls.jsonl", b"newer\n", tmp=".tmp-r0")
    finally:
        os.close(fd)
    assert (victim / "secret").read_bytes() == b"root's own words\n"
    assert not (out / "calls.jsonl").is_symlink() and (out / "calls.jsonl").read_bytes() == b"newer\n"
    assert sorted(p.name for p in out.iterdir()) == ["calls.jsonl"]


def test_open_regular_refuses_a_symlink_to_a_victim_file(shared: Path, victim: Path) -> None:
    (shared / "r1.json").symlink_to(victim / "secret")
    with pytest.raises(ground.Foreign, match="is a symbolic link, not a regular file"):
        ground.read_regular(str(shared / "r1.json"), 1 << 16)


def test_open_regular_refuses_a_hard_link_to_a_victim_file(shared: Path, victim: Path) -> None:
    os.link(victim / "secret", shared / "r1.json")
    with pytest.raises(ground.Foreign, match=r"has 2 names \(a hard link, owned by uid 0"):
        ground.read_regular(str(shared / "r1.json"), 1 << 16, owner=os.geteuid())
    fd = _fd_dir(shared)
    try:
        ground.unlink_own(fd, "r1.json")  # removing the name leaves the victim's file
    finally:
        os.close(fd)
    assert (victim / "secret").read_bytes() == b"root's own words\n"


def test_open_regular_never_blocks_on_a_fifo_or_a_device(shared: Path) -> None:
    os.mkfifo(shared / "r1.json")
    got: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            ground.read_regular(str(shared / "r1.json"), 1 << 16)
        except BaseException as exc:  # noqa: BLE001 - what the reader ended with is the result
            got.append(exc)
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    if not done.wait(120):  # no writer ever comes: a blocking open() would wait for ever
        fd = os.open(shared / "r1.json", os.O_WRONLY | os.O_NONBLOCK)  # release the reader before failing
        os.close(fd)
        pytest.fail("open_regular blocked on a FIFO")
    assert len(got) == 1 and isinstance(got[0], ground.Foreign) and "is a FIFO, not a regular file" in str(got[0])
    with pytest.raises(ground.Foreign, match="is a character device"):
        ground.open_regular("/dev/zero")


def test_open_regular_checks_the_owner_and_who_may_write_on_the_descriptor(shared: Path) -> None:
    f = shared / "pointer"
    f.write_bytes(b"x")
    f.chmod(0o600)
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(ground.Foreign, match=r"owned by uid 65534 \(nobody\), not by uid 0 \(root\)"):
        ground.read_regular(str(f), 10, owner=0)
    assert ground.read_regular(str(f), 10, owner=NOBODY) == b"x"
    assert ground.read_regular(str(f), 10) == b"x"  # no owner asked: only the type and the links
    os.chown(f, 0, 0)
    f.chmod(0o622)
    with pytest.raises(ground.Foreign, match=r"writable by group or others \(mode 0622\)"):
        ground.read_regular(str(f), 10, owner=0)


def test_read_regular_caps_the_size(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 65537)
    with pytest.raises(ground.Foreign, match="larger than 65536 bytes"):
        ground.read_regular(str(tmp_path / "big"), 65536)
    assert len(ground.read_regular(str(tmp_path / "big"), 65537)) == 65537


def test_names_are_single_components(tmp_path: Path) -> None:
    fd = _fd_dir(tmp_path)
    try:
        for bad in ("../escape", "a/b", "..", ".", ""):
            with pytest.raises(ValueError):
                ground.create_new(fd, bad, b"x")
            with pytest.raises(ValueError):
                ground.unlink_own(fd, bad)
    finally:
        os.close(fd)
    assert not (tmp_path.parent / "escape").exists()


def test_foreign_is_an_oserror_with_its_message(tmp_path: Path) -> None:
    exc = ground.Foreign("x is taken by uid 7", 7)
    assert isinstance(exc, OSError) and str(exc) == "x is taken by uid 7" and exc.owner == 7
    assert ground.who(0) == "uid 0 (root)" and ground.who(4_000_000_000).startswith("uid 4000000000")


def test_publish_new_replaces_no_name_of_any_kind_and_leaves_no_temp(shared: Path, victim: Path) -> None:
    (shared / "link").symlink_to(victim / "secret")
    (shared / "dir").mkdir()
    os.mkfifo(shared / "fifo")
    fd = _fd_dir(shared)
    try:
        for name in ("link", "dir", "fifo"):
            with pytest.raises(FileExistsError):
                ground.publish_new(fd, name, b"pointer\n")
        ident = ground.publish_new(fd, "fresh", b"pointer\n")
    finally:
        os.close(fd)
    assert (victim / "secret").read_bytes() == b"root's own words\n"
    assert sorted(p.name for p in shared.iterdir()) == ["dir", "fifo", "fresh", "link"]
    st = os.lstat(shared / "fresh")
    assert (st.st_ino, st.st_nlink) == (ident.st_ino, 1) and (shared / "fresh").read_bytes() == b"pointer\n"


def test_unlink_if_same_leaves_a_name_that_now_holds_another_file(shared: Path) -> None:
    fd = _fd_dir(shared)
    try:
        ident = ground.publish_new(fd, "pointer", b"ours\n")
        os.rename(shared / "pointer", shared / "ours-moved")
        (shared / "pointer").write_bytes(b"theirs\n")
        assert ground.unlink_if_same(fd, "pointer", ident) is False
        assert (shared / "pointer").read_bytes() == b"theirs\n"
        assert ground.unlink_if_same(fd, "ours-moved", ident) is True
        assert not (shared / "ours-moved").exists()
    finally:
        os.close(fd)
