"""The one exception type for user errors, and the file-system errors that are the user's to fix.

Bugs keep their traceback; a :class:`WanTrtError` is something the user can fix
(a flag, a file, a shape), so the CLI prints its message and exits 1.
"""
import errno


class WanTrtError(Exception):
    """A user error: says what was expected, what was received and how to fix it."""


# What the file system says about a user's path (full disk, no permission, a file where a folder
# should be ...): the user's to fix, so reported in one line, not as a bug.
USER_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EFBIG,
                         errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG,
                         errno.ENOTEMPTY, errno.EXDEV})
