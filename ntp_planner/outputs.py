"""Every file ntp writes goes through here: one policy for where it may write, and how.

Refused before any work (``check_output`` / ``check_output_folder``, InputError: one sentence,
exit 2): a path that is a symbolic link, a device, a FIFO, a socket or a folder (ntp would
replace it with a regular file), the same file as one of the command's inputs (compared by
device and inode, so ``../x/plan.json``, a hard link or a link to the input count too), a name
longer than the file system takes, a folder that does not exist or is a file.

Written so that a reader, or a kill at any instant, finds the old content or the new, never half:
a file goes to a temp file beside it, renamed over it (``write_atomic``). A set of files (an
export, simulate's plots, a profile and its cluster file) is written whole first and moved into
place only when every file is complete (``write_folder``, ``write_files``). Temp names are
``.ntp-tmp.<pid>.<random>``: each write removes those of a writer that is no longer alive.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from topologies.errors import InputError

TMP_PREFIX = ".ntp-tmp."
_TMP_NAME = re.compile(r"^\.ntp-tmp\.(\d+)\.")
NAME_MAX = 255  # bytes of one file name on Linux, macOS and Windows file systems
# What a path may be instead of a regular file, and why ntp does not write there.
NOT_A_FILE = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
)
Content = str | bytes | Callable[[Path], None]  # text, bytes, or a function writing the file at a path


STDOUT = "-"  # the output path that means standard output (``ntp plan ... -o -``)
stdout_claimed = False
"""Set when a command's output file goes to standard output: its table (or --json) then goes to
stderr (``ntp_planner.cli.output.show``), so the file on stdout stays whole."""


def check_output(path, option: str, inputs: Iterable = (), example: str = "plan.json") -> Path:
    """``path`` as a Path if ntp may write a file there, else InputError naming ``option`` and the
    path as given. ``inputs`` are the command's input paths (or names that may be paths). ``-``
    is standard output (one file per command: a second one is refused)."""
    global stdout_claimed
    if str(path) == STDOUT:
        if stdout_claimed:
            raise InputError(f"{option} -: standard output already takes another of the command's files; give a path")
        stdout_claimed = True
        return Path(STDOUT)
    path = Path(path)
    label = f"{option} {path}" if option else str(path)
    _check_target(path, label, example)
    _check_folder(_folder(path), label)
    _check_not_input(path, label, inputs)
    return path


def check_output_folder(folder, option: str, names: Iterable[str], inputs: Iterable = ()) -> Path:
    """``folder`` as a Path if ntp may write the files ``names`` into it (creating it and its
    missing parents), else InputError naming ``option``."""
    if str(folder) == STDOUT:
        raise InputError(
            f"{option} -: this command writes a folder of files, which standard output cannot hold; give a folder"
        )
    folder = Path(folder)
    label = f"{option} {folder}"
    _check_name(folder, label)
    st = _lstat(folder)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = _kind(st) or "a file"
        raise InputError(f"{label} is {kind}, not a folder; give a folder path")
    if st is None:
        _check_folder(_existing_ancestor(folder), label)
        return folder
    for name in names:
        check_output(folder / name, option, inputs)
    return folder


def write_atomic(path, content: Content) -> None:
    """Write ``content`` to ``path``: a temp file beside it, renamed over it."""
    write_files({Path(path): content})


def write_files(files: dict[Path, Content], executable: Iterable[str] = ()) -> None:
    """Write every file to a temp file beside its target, then rename them all into place: a
    failure or a kill before the renames leaves every old file as it was (and temp files that the
    next write removes); the renames themselves follow one another with nothing in between."""
    staged: list[tuple[str, Path]] = []
    to_stdout = [c for p, c in files.items() if str(p) == STDOUT]
    files = {p: c for p, c in files.items() if str(p) != STDOUT}
    try:
        for path, content in files.items():
            path = Path(path)
            _check_target(path, str(path), "plan.json")
            folder = _folder(path)
            _check_folder(folder, str(path))
            remove_stale(folder)
            tmp = _mkstemp(folder, path)
            staged.append((tmp, path))
            _write(Path(tmp), content, path.name in set(executable), path)
        for tmp, path in staged:
            os.replace(tmp, path)
        for content in to_stdout:
            _write_stdout(content)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise


def _write_stdout(content: Content) -> None:
    import sys

    if callable(content):  # a file written by a function (a plot): through a temp file
        with tempfile.TemporaryDirectory(prefix=_tmp_prefix()) as tmp:
            content(Path(tmp) / "out")
            content = (Path(tmp) / "out").read_bytes()
    with stream_errors():
        if isinstance(content, bytes):
            sys.stdout.buffer.write(content)
        else:
            sys.stdout.write(content if content.endswith("\n") else content + "\n")
        sys.stdout.flush()


@contextmanager
def stream_errors(name: str = "output") -> Iterator[None]:
    """A write to standard ``name`` (output or error) that fails (``> /dev/full``, a full disk, a
    file-size limit) is said in one sentence, exit 2, not as a bug. A reader that stopped reading
    (``| head``) is left to Python's own handling."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise InputError(
            f"cannot write to standard {name}: {_reason(exc)}; send it to a file or device with room"
        ) from None


def write_folder(
    folder, files: dict[str, Content], executable: Iterable[str] = (), replaces: Iterable[str] = ()
) -> None:
    """Write the set ``files`` (name -> content) into ``folder``, all or nothing. The set is
    written whole into a temp folder first. A folder that does not exist yet, or holds only
    files of this set and ``replaces`` (the other names an earlier set of the kind may hold), is
    then swapped with it in one rename (Linux ``renameat2`` exchange), so a reader or a kill sees
    the old set or the new one, never a mix, and no file of the older set stays behind. A folder
    holding other files too gets the new files renamed in one by one, after all are written, and
    then loses the files of ``replaces`` the new set lacks (an older export's nonuniform_tp.json
    must not sit beside a launch script that no longer reads it)."""
    folder = Path(folder)
    parent = _folder(folder)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make folder {parent}: {_reason(exc)}; pick another") from None
    remove_stale(parent)
    if folder.is_dir():
        remove_stale(folder)
    if not _swappable(folder, {*files, *replaces}):
        write_files({folder / name: content for name, content in files.items()}, executable)
        _remove_files(folder, set(replaces) - set(files))
        return
    try:
        stage = Path(tempfile.mkdtemp(prefix=_tmp_prefix(), dir=parent))
    except OSError as exc:
        raise InputError(f"cannot write {folder}: {_reason(exc)} in {parent}; pick a writable folder") from None
    try:
        for name, content in files.items():
            _write(stage / name, content, name in set(executable), folder / name)
        if not folder.exists():
            os.chmod(stage, 0o777 & ~_umask())
            os.rename(stage, folder)  # the whole set appears at once
            return
        os.chmod(stage, stat.S_IMODE(folder.stat().st_mode))
        if not _exchange(stage, folder):
            for name in files:
                os.replace(stage / name, folder / name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # after a swap: the old set


def remove_stale(folder) -> None:
    """Remove the temp files and folders in ``folder`` left by an ntp process that has died."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _TMP_NAME.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)


def _remove_files(folder: Path, names: Iterable[str]) -> None:
    """Remove the regular files ``names`` of ``folder`` (what an earlier set held); a folder, a
    link or a device of that name is someone else's and stays."""
    for name in names:
        st = _lstat(folder / name)
        if st is not None and stat.S_ISREG(st.st_mode):
            (folder / name).unlink(missing_ok=True)


# ---- the checks ---------------------------------------------------------------------------------
def _check_target(path: Path, label: str, example: str) -> None:
    _check_name(path, label)
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {label}: it is a folder; give a file name, e.g. {path / example}")
    kind = _kind(st)
    if kind is not None:
        raise InputError(
            f"cannot write {label}: it is {kind}, which ntp would replace with a regular file; "
            "give the path of a regular file or a new name"
        )


def _check_name(path: Path, label: str) -> None:
    size = len(os.fsencode(path.name))
    if size > NAME_MAX:
        raise InputError(
            f"cannot write {label}: its name is {size} bytes, over the {NAME_MAX} a file name may have; "
            "give a shorter name"
        )


def _check_folder(folder: Path, label: str) -> None:
    """The folder to write into must be a writable folder; name the first part that is not."""
    if not folder.is_dir():
        existing = _existing_ancestor(folder)
        if existing.is_dir():
            raise InputError(f"cannot write {label}: folder {folder} does not exist; create it or pick another")
        raise InputError(f"cannot write {label}: {existing} is a file, not a folder; pick another path")
    try:  # a real file, not os.access: root passes that even where nothing can be made (/proc, read-only mounts)
        fd, probe = tempfile.mkstemp(prefix=_tmp_prefix(), dir=folder)
    except OSError as exc:
        reason = _reason(exc)
        raise InputError(
            f"cannot write {label}: no file can be made in folder {folder} ({reason}); pick another"
        ) from None
    os.close(fd)
    os.unlink(probe)


def _check_not_input(path: Path, label: str, inputs: Iterable) -> None:
    for given in inputs:
        if given is None or not os.path.exists(path) or not os.path.exists(given):
            continue
        if os.path.samefile(path, given):
            raise InputError(
                f"cannot write {label}: it is the command's input {given}, which the output would overwrite; "
                "give the output another name"
            )


# ---- helpers ------------------------------------------------------------------------------------
def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def _existing_ancestor(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if os.path.lexists(p)), Path("."))


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a name too long for the whole path, a part that is a file
        if isinstance(exc, NotADirectoryError):
            return None
        raise InputError(f"cannot write {path}: {_reason(exc)}; pick another path") from None


def _kind(st: os.stat_result) -> str | None:
    return next((kind for test, kind in NOT_A_FILE if test(st.st_mode)), None)


def _reason(exc: OSError) -> str:
    return (exc.strerror or type(exc).__name__).lower()


def _tmp_prefix() -> str:
    return f"{TMP_PREFIX}{os.getpid()}."


def _mkstemp(folder: Path, path: Path) -> str:
    try:
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(), dir=folder)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {_reason(exc)} in {folder}; pick a writable folder") from None
    os.close(fd)
    return tmp


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write(tmp: Path, content: Content, executable: bool, target: Path) -> None:
    """Write ``content`` at ``tmp`` with a plain open()'s mode (mkstemp makes 0600), plus x bits.
    A write the file system refuses (full, over a quota or ``ulimit -f``, an I/O error) is an
    InputError naming ``target``: the callers remove the temp file, ``target`` keeps its old content."""
    try:
        if callable(content):
            content(tmp)
        elif isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            with open(tmp, "w") as f:
                f.write(content)
        os.chmod(tmp, (0o777 if executable else 0o666) & ~_umask())
    except OSError as exc:
        raise InputError(f"cannot write {target}: {_reason(exc)}; make room there or pick another folder") from None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _swappable(folder: Path, names: set[str]) -> bool:
    """True when the whole folder may be replaced: it does not exist yet, or holds nothing but
    ``names`` (an earlier set of the same kind)."""
    if folder.is_symlink():  # swapping would replace the link (check_output_folder refuses one anyway)
        return False
    if not folder.exists():
        return True
    if os.path.samefile(folder, ".") or os.path.ismount(folder):
        return False
    return set(os.listdir(folder)) <= names


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 with RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
