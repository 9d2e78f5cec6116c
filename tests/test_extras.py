"""The service image installs ``[project.dependencies]`` only (Dockerfile):
torch is the ``plugin`` extra and matplotlib the ``experiments`` extra. Every
process the image runs must import without them: each service, the gateway,
the executor (both backends: the real one launches jobs, it trains nothing)
and the ``hops`` command, which loads the experiments only when one runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHELLS = (
    "services.estimator.__main__", "services.monitor.__main__", "services.placer.__main__",
    "services.profiler.__main__", "services.scheduler.__main__",
    "gateway.__main__", "gateway.app",
    "executor.__main__", "executor.emulated", "executor.real",
    "cli.main", "cli.up.up",
)
# A name set to None in sys.modules makes `import name` raise ImportError.
BLOCK = "import sys\nfor name in ('torch', 'matplotlib'):\n    sys.modules[name] = None\n"


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_every_shell_imports_without_torch_and_matplotlib() -> None:
    done = _python(f"""
        import importlib
        for module in {SHELLS!r}:
            importlib.import_module(module)
        assert 'experiments' not in sys.modules, 'the CLI loaded the experiments'
        print('ok')
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_block_bites() -> None:
    # The plugin needs torch: under the same block its import fails, so the
    # test above would catch a shell that reached torch.
    done = _python("import hops.plugin.run\n")
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr or "ImportError" in done.stderr, done.stderr
