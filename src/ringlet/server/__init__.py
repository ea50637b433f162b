"""The HTTP server: the native API with SSE streams, the OpenAI-compatible API and triggers, as an ASGI
app over one `Store` (`server-contract.md`).

    app = create_app(ServerSettings(auth_mode="none"), agents=[my_agent])   # any ASGI server runs it
    serve(ServerSettings(port=8000))                                          # or `ringlet serve`
"""

from ringlet.server.app import create_app, serve
from ringlet.server.http.settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "serve"]
