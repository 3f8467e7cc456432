"""What a run records and concludes: the records' schema, the recorder and its sinks, the run summary, the
overload test, and statistics over sweep points."""
