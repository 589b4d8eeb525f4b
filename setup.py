"""Maps the top-level folders app/, backend/, tools/ to mkcode.app, mkcode.backend, mkcode.tools, and
ships csrc/ (the megakernel's CUDA sources) as mkcode/csrc.

pyproject.toml holds the metadata; this file only computes the package list so that new
subpackages need no edit here. What the wheel holds besides Python modules, and only that:
- mkcode/csrc/: the kernel sources `mkcode kernels build` compiles (backend/megakernel/abi.py finds
  them two folders above itself: csrc/ in a checkout, mkcode/csrc/ in an installed wheel). The lab
  probes (csrc/probes/) stay out.
- the chat template (backend/chat/*.jinja) and the demo model's checkpoint (backend/demo/checkpoint/:
  weights, tokenizer, configs, SHA256SUMS, VERSION, REPORT.md).
Lab tooling stays out: devtools/ is not a package here, and no shell script is package data
(MANIFEST.in keeps the sdist to the same files).
"""

from setuptools import find_packages, setup

KERNEL_SOURCES = ["*.cu", "*.cuh", "*.h", "*.hpp"]  # the suffixes backend/megakernel/build.py reads

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
)
