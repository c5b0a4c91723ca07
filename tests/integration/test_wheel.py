"""The wheel installs from binary packages only (no compiler), and the job imports.

python-qpid-proton has never published a Linux wheel, so it must not be a runtime dependency: the
syphon decodes and encodes AMQP with its own pure-Python codec. This builds the wheel, installs it
with ``--only-binary :all:`` into a fresh virtualenv in which no C compiler can be found, and
imports the job there. pyspark is what a cluster or Databricks runtime brings (and pyspark has no
wheel either), so the runtime's pyspark, py4j and pyarrow are made visible to that virtualenv the
way a runtime's site-packages are, and nothing else of the development environment is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT

RUNTIME_PACKAGES = ("pyspark", "py4j", "pyarrow", "numpy", "pandas", "dateutil", "pytz", "tzdata", "six.py")
JOB_MODULES = ("backlog_syphon", "backlog_syphon.cli", "backlog_syphon.run.syphon", "backlog_syphon.run.dry_run",
               "backlog_syphon.source.data_source", "backlog_syphon.sink.foreach_batch",
               "backlog_syphon.servicebus.purge", "backlog_syphon.servicebus.preflight",
               "backlog_syphon.restore.restored_message")


def _run(command, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.timeout(900)
def test_the_wheel_installs_without_a_compiler_and_the_job_imports(tmp_path):
    # Built from what a clone holds, as CI and a bundle deploy build it: a working copy's build/ from an earlier
    # build keeps modules since removed, and setuptools would put them in the wheel again.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "lib" / "backlog_syphon", source / "lib" / "backlog_syphon",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist"),
          str(source)])
    [wheel] = (tmp_path / "dist").glob("backlog_syphon-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.startswith("backlog_syphon-")} == {"backlog_syphon"}
    lib = ROOT / "lib"
    sources = {path.relative_to(lib).as_posix() for path in (lib / "backlog_syphon").rglob("*.py")}
    assert sources <= set(names), f"modules missing from the wheel: {sorted(sources - set(names))}"
    # The fault harness (``tools/fault_plan.py``, ``fault_hooks.py``, ``faulty_job.py``) is the tests' alone.
    assert not [name for name in names if "fault" in name.rsplit("/", 1)[-1]], names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    runtime_requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                        if line.startswith("Requires-Dist:") and "extra ==" not in line]
    # websocket-client is what the SDK's amqp-websockets transport needs (a pure-Python wheel).
    assert sorted(runtime_requires) == ["azure-servicebus==7.15.0", "pyyaml==6.0.3", "websocket-client==1.9.2"]

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    no_compiler = tmp_path / "bin"  # a PATH with python and nothing else: no cc, gcc, or ld
    no_compiler.mkdir()
    (no_compiler / "python").symlink_to(python)
    env = {"PATH": str(no_compiler), "HOME": os.environ.get("HOME", str(tmp_path)), "CC": "false", "CXX": "false",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([str(python), "-m", "pip", "install", "--quiet", "--only-binary", ":all:", str(wheel)], env=env)

    # What a Spark runtime provides, and only that.
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for name in RUNTIME_PACKAGES:
        if (site / name).exists():
            (runtime / name).symlink_to(site / name)
    venv_site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          env=env).stdout.strip())
    (venv_site / "spark_runtime.pth").write_text(f"{runtime}\n")

    check = (
        "import importlib, importlib.util\n"
        "assert importlib.util.find_spec('proton') is None, 'python-qpid-proton is installed'\n"
        "assert importlib.util.find_spec('servicebus_emulator') is None, 'the emulator came with the wheel'\n"
        f"for name in {JOB_MODULES!r}: importlib.import_module(name)\n"
        "from backlog_syphon.restore.amqp.values import Char\n"
        "from backlog_syphon.restore.amqp.message import DecodedMessage\n"
        "from backlog_syphon.restore.amqp.message_decoding import decode_message\n"
        "raw = DecodedMessage(application_properties={'c': Char('x')}, body=(b'hello',)).encode()\n"
        "assert decode_message(raw).application_properties == {'c': Char('x')}\n"
        "from backlog_syphon.cli import build_parser\n"
        "build_parser().parse_args(['--config', 'x.yaml'])\n"
        "print('ok')\n"
    )
    result = _run([str(python), "-c", check], env=env, cwd=tmp_path)
    assert result.stdout.strip() == "ok"
