"""User-facing errors.

Everything a user can get wrong (a plan that does not divide, an unknown
machine, a malformed IR file) raises TwinError with a one-line message that
names the field and says what to change. The CLI prints the message and exits
with code 2; nothing else in the code base catches it.

TwinError is ``topologies.errors.InputError`` under the name the twin uses:
the machine layer sits below the twin and raises the same class, so a bad
machine file reaches the CLI's one-line handling like any other user error.
"""

from topologies.errors import InputError as TwinError

__all__ = ["TwinError"]
