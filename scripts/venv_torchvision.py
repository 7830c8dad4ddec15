"""`import torchvision` in dlop's development venv, beside a CPU build of torch.

PyPI has no CPU build of torchvision, and its CUDA build dies on import next
to torch's CPU build (dlop._torchvision_compat says why). scripts/setup-python.sh
installs this file into the venv's site-packages with a .pth line that
imports it: the first ``import torchvision`` of any script then goes through
dlop._torchvision_compat.import_torchvision(), which declares the two missing
operator schemas only when the plain import fails. Nothing is imported before
a script asks for torchvision, and by then torch has loaded dlop anyway.
"""

import importlib.util
import sys


class _FirstImport:
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        from dlop._torchvision_compat import import_torchvision

        import_torchvision()
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return sys.modules["torchvision"]

    def exec_module(self, module):
        pass


if "torchvision" not in sys.modules:
    sys.meta_path.insert(0, _FirstImport())
