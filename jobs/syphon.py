"""Entry point for spark-submit, Databricks Python file tasks and plain ``python``.

    spark-submit jobs/syphon.py --config conf/<env>.yaml [--set section.key=value ...]
"""

import os
import sys

try:
    from backlog_syphon.cli import main
except ImportError:  # run from a clone without installing: use the library next to this file
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from backlog_syphon.cli import main

if __name__ == "__main__":
    sys.exit(main())
