"""The one exception type for user errors.

Bugs keep their traceback; a :class:`WanTrtError` is something the user can fix
(a flag, a file, a shape), so the CLI prints its message and exits 1.
"""


class WanTrtError(Exception):
    """A user error: says what was expected, what was received and how to fix it."""
