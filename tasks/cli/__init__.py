"""The ``swapless`` command line (typer).

- ``main``: ``worker``, ``submit``, ``result``, ``models``, ``serve``, ``status``, and the entry point;
- ``bulk``: ``bulk``, ``demo``, ``demo-models``, and local mode for ``submit``;
- ``local``: local mode, an embedded Redis and one real worker for one command;
- ``common``: the error line and the options the commands share.

``python -m swapless`` runs it as the ``swapless`` script does.
"""
