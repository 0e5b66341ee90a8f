"""Files written whole or not at all.

Every file checkmate writes (plans, the disk caches, `--out` files, tables and figures) goes through `replacing`:
the content is written to a temporary file beside the target, flushed to disk, and renamed over the target in one
step. A process killed while writing (a signal, a full disk, an error in the writer) leaves the previous file as it
was, never a truncated one.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def replacing(path: str | os.PathLike[str], *, binary: bool = False) -> Iterator[IO[Any]]:
    """A file to write `path`'s new content to (text in UTF-8, or bytes with `binary`); `path` is replaced by it when
    the block ends, and left as it was when the block raises.

    The new file gets the mode of the file it replaces, or the usual mode of a new file (0o666 less the umask).

    Example:
        >>> with replacing("plan.json") as file:
        ...     file.write(plan.to_json())
    """
    target = Path(path)
    if target.is_symlink():
        target = target.resolve()
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
    try:
        if target.exists():
            os.chmod(descriptor, stat.S_IMODE(target.stat().st_mode))
        with open(descriptor, "wb" if binary else "w", encoding=None if binary else "utf-8") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_file(path: str | os.PathLike[str], content: str | bytes) -> None:
    """Replace the file at `path` with `content` (a string is written as UTF-8), whole or not at all."""
    with replacing(path, binary=isinstance(content, bytes)) as file:
        file.write(content)


def write_figure(figure: Any, path: str | os.PathLike[str], **options: Any) -> None:
    """Save a matplotlib figure to `path` (its format from the suffix), whole or not at all; `options` go to
    `figure.savefig` (such as `dpi`)."""
    with replacing(path, binary=True) as file:
        figure.savefig(file, format=Path(path).suffix.removeprefix(".") or None, **options)
