"""The module paths that moved when python/dlop was split by concern keep working for one release: an old path
imports the module at its new path (the same object), warns with a DeprecationWarning naming the new path, and
`python -m OLD` still runs. dlop's own code and its entry points use only the new paths."""

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What users' scripts, manifests and pickles name, and where it lives now.
MOVED = {
    "dlop._backend": "dlop.c10d.backend",
    "dlop._device_backend": "dlop.c10d.device",
    "dlop._shared_device": "dlop.c10d.shared_device",
    "dlop.run_loaders": "dlop.data.run_loaders",
    "dlop.run": "dlop.fleet.run",
    "dlop.local_offloaders": "dlop.fleet.local",
    "dlop.offloader_launcher": "dlop.fleet.launcher",
    "dlop._slurm": "dlop.fleet.slurm",
    "dlop.slurm_template": "dlop.fleet.slurm_template",
    "dlop.offloader_stats": "dlop.fleet.stats",
    "dlop.data.discovery": "dlop.fleet.discovery",
    "dlop.data.autoscale": "dlop.fleet.scaling.policy",
    "dlop.scaling": "dlop.fleet.scaling",
    "dlop.scaling.actuator": "dlop.fleet.scaling.actuator",
    "dlop.scaling.controller": "dlop.fleet.scaling.controller",
    "dlop.scaling.figures": "dlop.fleet.scaling.figures",
    "dlop.scaling.kubernetes": "dlop.fleet.scaling.kubernetes",
    "dlop.scaling.launch": "dlop.fleet.scaling.launch",
    "dlop.scaling.local": "dlop.fleet.scaling.local",
    "dlop.scaling.slurm": "dlop.fleet.scaling.slurm",
}
# The module dlop.fleet was, now dlop.fleet.dns: its names, read from dlop.fleet.
FLEET_NAMES = ("split_host_port", "join_host_port", "resolve", "answers", "Candidates", "wait_for_any", "Watcher")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (nothing imported yet, so every import is a first import)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_each_old_path_is_the_new_module_and_warns_with_the_new_name():
    _python("""
        import importlib, sys, warnings

        moved = dict(a.split("=") for a in sys.argv[1:])
        for old, new in moved.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                exec(f"import {old}", {})  # an import statement, as users write it
            module = sys.modules[old]
            assert module is importlib.import_module(new), (old, module)
            assert sys.modules[new].__spec__.name == new, f"importing {old} renamed {new}"
            said = [str(w.message) for w in caught if w.category is DeprecationWarning]
            assert any(f"{old} moved to {new}" in s for s in said), (old, said)
            assert all(w.filename == "<string>" for w in caught if "moved to" in str(w.message)), \\
                [(w.filename, str(w.message)) for w in caught]  # the warning names the importing line
        """, *(f"{old}={new}" for old, new in MOVED.items()))


def test_old_fleet_names_are_the_dns_modules_objects_with_a_warning():
    _python("""
        import sys, warnings

        import dlop.fleet
        from dlop.fleet import dns

        for name in sys.argv[1:]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = getattr(dlop.fleet, name)
            assert value is getattr(dns, name), name
            assert [str(w.message) for w in caught] == [f"dlop.fleet.{name} moved to dlop.fleet.dns.{name}; "
                                                        "the old path goes in the next release"]
        try:
            dlop.fleet.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("dlop.fleet.no_such_name resolved")
        """, *FLEET_NAMES)


def test_python_m_an_old_path_runs_the_moved_command():
    old = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "dlop.slurm_template"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    new = subprocess.run([sys.executable, "-m", "dlop.fleet.slurm_template"], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert old.stdout == new.stdout and "#SBATCH" in new.stdout
    assert "python -m dlop.slurm_template moved to python -m dlop.fleet.slurm_template" in old.stderr


def test_dlop_itself_and_its_entry_points_use_only_new_paths():
    """Importing every module of the product warns about no moved path, and the entry points torch and the
    shell load name modules that did not move."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = [*scripts["scripts"].values(), *(t for group in scripts["entry-points"].values() for t in group.values())]
    modules = sorted({t.partition(":")[0] for t in targets})
    product = sorted(".".join(p.relative_to(ROOT / "python").with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "python" / "dlop").rglob("*.py") if "_run_site" not in p.parts)
    assert "dlop.c10d.backend" in modules, modules
    _python("""
        import importlib, sys, warnings

        warnings.filterwarnings("error", message=".* moved to ", category=DeprecationWarning)
        for name in sys.argv[1:]:
            importlib.import_module(name)
        """, *modules, *product)
