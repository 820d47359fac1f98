"""``streamtts serve``: WebSocket streaming, OpenAI-compatible HTTP, a browser page.

Layout: ``protocol`` (messages), ``session`` (sans-I/O session logic),
``voices`` (voice cache), ``metrics`` (Prometheus text), ``app`` (the ASGI
app: thin I/O on top), ``cli`` (the ``serve`` command). See docs/protocol.md.
"""
