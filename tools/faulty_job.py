"""The job with a test's faults: ``jobs/syphon.py``'s command line, run with the hooks the ``SYPHON_FAULT_*``
variables of this process's environment describe (``tools.fault_plan``, ``tools.fault_hooks``).

    python tools/faulty_job.py --config conf/<env>.yaml [--set section.key=value ...]

The integration tests' ``start_job`` runs it instead of ``jobs/syphon.py`` when they set those variables; the
library itself reads none of them and ships no fault code. Over Spark Connect the hooks travel with the sink to
the server, whose Python workers must import ``tools`` from this repository's root too.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    # Spark's Python workers (local mode: started by this process's JVM, with its environment) unpickle the
    # hooks by their module's name: they import ``tools`` from the root, and the library next to it.
    paths = [str(ROOT / "lib"), str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    sys.path[0:1] = paths  # instead of this file's folder

    from backlog_syphon.cli import main as job_main
    from tools.fault_hooks import FaultHooks
    from tools.fault_plan import FaultPlan

    return job_main(hooks=FaultHooks(FaultPlan.from_environment(os.environ)))


if __name__ == "__main__":
    sys.exit(main())
