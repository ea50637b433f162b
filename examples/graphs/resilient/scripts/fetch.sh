#!/usr/bin/env bash
# Fetching is down in this example: fail, so the graph takes its fallback.
echo "upstream unavailable" >&2
exit 3
