"""Items are the comma-separated parts of the prompt."""
import json
import os

state = json.loads(os.environ["GRAPH_STATE"])
print(json.dumps({"items": [p.strip() for p in state["initial_prompt"].split(",") if p.strip()]}))
