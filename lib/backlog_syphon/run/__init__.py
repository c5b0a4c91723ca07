"""Running the syphon: wiring a run and a dry run, the fence, progress, reports, the Spark session, notebooks."""
