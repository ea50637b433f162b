#!/usr/bin/env bash
# The size of one item (the map's `as` key is in the state).
python3 -c 'import json, os; s = json.loads(os.environ["GRAPH_STATE"]); print(json.dumps({"size": len(s["item"])}))'
