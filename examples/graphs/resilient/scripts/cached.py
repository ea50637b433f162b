"""The cached copy of the page."""
import json

print(json.dumps({"page": "Order: three red bicycles"}))
