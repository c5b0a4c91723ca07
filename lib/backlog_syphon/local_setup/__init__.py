"""A local Spark's set-up (``make setup``), and how a local session finds what it built: Delta's JARs
fetched with Maven (``delta_jars``), and the class archive of Spark's JVM (``class_archive`` builds it,
``jvm_options`` finds it). Clusters, Databricks, spark-submit and Spark Connect bring their own."""
