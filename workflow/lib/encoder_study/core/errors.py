"""One base class for errors whose message is meant for the user.

A `UserError` names the file, the place and the fix; `encoder-study` prints its message alone and
exits with status 2. Every other exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input, a refused file or a missing prerequisite: the message says what to do."""
