"""What a `ringlet` process loads before it serves (issue 51: every start costs CPU, the crash tests start many).

A protocol package that only some requests need is imported by the first of them, not at start-up; the app's
routes and OpenAPI document stay what they were. `bench/startup.py` measures a start's CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringlet.server.protocols.agui.inputs import documented_input

STARTED = """
import json, sys
from ringlet.server import ServerSettings, create_app
app = create_app(ServerSettings(auth_mode="none", db_url=sys.argv[1]))
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"ag_ui"})
doc = app.openapi()
bodies = [doc["paths"][p]["post"].get("requestBody") for p in ("/ag-ui/{agent}", "/ag-ui/{agent}/")]
print(json.dumps({"at_start": loaded, "after_openapi": "ag_ui" in sys.modules, "bodies": bodies}))
"""


@pytest.mark.slow
def test_ag_ui_is_loaded_by_its_first_use_and_still_documented(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", STARTED, f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"],
                         capture_output=True, text=True, check=True, timeout=120)
    seen = json.loads(out.stdout)
    assert seen["at_start"] == []  # an app made, its routes in place: no AG-UI package yet
    assert seen["after_openapi"] is True
    for body in seen["bodies"]:  # both operations (with and without the trailing slash) document RunAgentInput
        assert body is not None
        assert body["required"] is True
        schema = body["content"]["application/json"]["schema"]
        assert schema["required"] == documented_input()["required"]
        assert schema["properties"]["threadId"]["pattern"] == documented_input()["properties"]["threadId"]["pattern"]
        assert not _nulls(schema)  # encoded as FastAPI encodes the rest: no field set to null (`"default": null`)


def _nulls(node: object) -> list[object]:
    if isinstance(node, dict):
        return [k for k, v in node.items() if v is None] + [n for v in node.values() for n in _nulls(v)]
    return [n for v in node for n in _nulls(v)] if isinstance(node, list) else []
