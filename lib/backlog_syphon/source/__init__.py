"""The streaming source `servicebus-backlog`: its Spark data source, its options and its pure window planner."""
