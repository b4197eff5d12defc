"""Code tests share and that the executor's ranks import by name (``tests.support.mutations``):
a package, so that a rank forked from the forkserver finds it on the repository root, which
``python -m pytest`` (and the editable install's PYTHONPATH) put on ``sys.path``."""
