"""The project's one exception for bad user input (files, config values)."""


class InputError(ValueError):
    """Bad input: the message is one line naming the file and, where relevant, line or key.

    The CLI prints it as ``error: <message>`` on stderr and exits with code 2.
    """
