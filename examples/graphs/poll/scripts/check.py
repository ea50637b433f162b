"""One poll: count it, and come back here (_next) until the target is reached."""
import json
import os

state = json.loads(os.environ["GRAPH_STATE"])
count = state["count"] + 1
target = int(os.environ["LLM_AGENT_VAR_TARGET"])
print(json.dumps({"count": count, "_next": "done" if count >= target else "check"}))
