"""User-facing errors.

Everything a user can get wrong (a plan that does not divide, an unknown
machine, a malformed IR file) raises TwinError with a one-line message that
names the field and says what to change. The CLI prints the message and exits
with code 2; nothing else in the code base catches it.
"""


class TwinError(Exception):
    """A user error: the message is one line, names the field and the fix."""
