#!/usr/bin/env bash
# A keyword rule: tickets that mention money are billing tickets, and urgent.
if grep -qiE 'invoice|refund|charge' <<<"$GRAPH_STATE"; then
  echo '{"rule": "billing", "score": 2}'
else
  echo '{"rule": "general", "score": 0}'
fi
