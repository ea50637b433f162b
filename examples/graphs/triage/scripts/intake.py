"""Normalise the ticket: trim it and collapse whitespace."""
import json
import os

state = json.loads(os.environ["GRAPH_STATE"])
print(json.dumps({"ticket": " ".join(state["initial_prompt"].split())}))
