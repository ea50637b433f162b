#!/usr/bin/env bash
# Records its pid (so a test can see it was killed), then takes far longer than the run may.
if [ -n "$SLOW_PID_FILE" ]; then echo $$ > "$SLOW_PID_FILE"; fi
exec sleep 30
