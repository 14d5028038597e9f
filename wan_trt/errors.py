"""The one exception type for user errors, and the file-system errors that are the user's to fix.

Bugs keep their traceback; a :class:`WanTrtError` is something the user can fix
(a flag, a file, a shape), so the CLI prints its message and exits 1.
"""
import errno
import traceback


class WanTrtError(Exception):
    """A user error: says what was expected, what was received and how to fix it."""


def failure_text(exc: BaseException) -> str:
    """What a report keeps of work that raised (a bench row, say) while the rest went on: a user error's message;
    anything else (a backend that broke) with its traceback, at most its last 8000 characters."""
    if isinstance(exc, WanTrtError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}\n{''.join(traceback.format_exception(exc))}"[-8000:]


# What the file system says about a user's path (full disk, no permission, a file where a folder
# should be ...): the user's to fix, so reported in one line, not as a bug.
USER_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                         errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG,
                         errno.ENOTEMPTY, errno.EXDEV})
