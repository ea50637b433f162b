"""What starts runs by itself, as DBOS workflows: cron triggers and webhook fires (`triggers`, with their
routes), agents' schedules (`schedules`), and how a fire waits for its turn and starts its run (`fires`)."""
