"""The tests of scripts/ load each script as a module: they are programs, not a package."""
import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module, registered in sys.modules as `<name>_script` (the DSL and pickling
    look a module up by name)."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
