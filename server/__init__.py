"""inferpath.server: OTLP/HTTP receiver, request assembler, read API and background loops.

Entry points: :func:`inferpath.server.runtime.serve_in_thread`,
:func:`inferpath.server.runtime.serve_forever`, :func:`inferpath.server.app.create_app`.
Nothing is imported here so that ``import inferpath.server.derive`` stays light.
"""
