"""The one error a user can cause: ``InputError``, a one-line message naming the field and the fix.

It lives here, at the bottom of the import graph, so that the machine layer
(``topologies``) can reject a bad machine file without importing the twin
above it. ``twin.errors.TwinError`` is this very class under its old name:
everything that raises or catches TwinError, the CLI's one-line error
handling included, handles machine-file errors unchanged.
"""


class InputError(Exception):
    """A user error: the message is one line, names the field and the fix."""
