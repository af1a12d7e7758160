"""Stack launchers: they alone start, supervise and stop the system under test."""
