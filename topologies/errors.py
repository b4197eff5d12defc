"""The error every layer raises for bad input, so the CLI can tell it from a bug.

``InputError`` is a ValueError (pydantic's ValidationError is one too): callers that catch
ValueError keep working. Its message is one sentence saying what is wrong and how to fix it, in
the library's terms (field names, not CLI flags); the CLI maps fields to its options.
"""


class InputError(ValueError):
    """Bad input: a value, file or combination the library cannot use."""
