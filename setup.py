"""Maps the top-level folders app/, backend/, tools/ to mkcode.app, mkcode.backend, mkcode.tools, and
ships csrc/ (the megakernel's CUDA sources) as mkcode/csrc.

pyproject.toml holds the metadata; this file only computes the package list so that new
subpackages need no edit here. What the wheel holds besides Python modules, and only that:
- mkcode/csrc/: the kernel sources `mkcode kernels build` compiles (backend/megakernel/abi.py finds
  them two folders above itself: csrc/ in a checkout, mkcode/csrc/ in an installed wheel). The lab
  probes (csrc/probes/) stay out.
- the chat template (backend/chat/*.jinja) and the demo model's checkpoint (backend/demo/checkpoint/:
  weights, tokenizer, configs, SHA256SUMS, VERSION, REPORT.md).
Lab tooling stays out: devtools/ is not a package here, no shell script is package data, and the
megakernel's lab modules, which stay beside the kernel's host code in a checkout until they move to
devtools/, are left out of the built package (LAB_MODULES; nothing the product runs imports them:
tests/packaging checks the wheel's imports). MANIFEST.in keeps the sdist to the same files.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The megakernel's emulator, GPU check harness, timeline reader and SASS issue-slot study.
LAB_MODULES = {
    ("mkcode.backend.megakernel", name)
    for name in ("emulator", "emulator_ops", "gpu_check", "timeline", "sass_issue")
}

KERNEL_SOURCES = ["*.cu", "*.cuh", "*.h", "*.hpp"]  # the suffixes backend/megakernel/build.py reads


class BuildPyWithoutLabModules(build_py):
    """build_py that leaves LAB_MODULES out of the built package (wheel and sdist alike)."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) not in LAB_MODULES]


package_dir = {"mkcode.csrc": "csrc"}
packages = ["mkcode.csrc"]
for folder in ("app", "backend", "tools"):
    name = f"mkcode.{folder}"
    packages.append(name)
    package_dir[name] = folder
    for sub in find_packages(folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "mkcode.csrc": KERNEL_SOURCES,
        "mkcode.backend.chat": ["*.jinja"],
        "mkcode.backend.demo": ["checkpoint/*"],
    },
    exclude_package_data={"": ["*.sh"], "mkcode.csrc": ["probes/*"]},
    cmdclass={"build_py": BuildPyWithoutLabModules},
)
