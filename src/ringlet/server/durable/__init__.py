"""Durable execution on DBOS (PostgreSQL): runs as workflows any worker executes, and a dead worker's runs
going on elsewhere (`engine`); DBOS hosted in this process (`dbos`, shared with firing); other processes'
events, live in this one's streams (`feed`); sub-agents as durable runs of their own (`children`); what a run
executed again withdraws (`attempts`), and what a run closed by recovery still lacks (`reconcile`)."""
