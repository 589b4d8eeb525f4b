"""Maps the top-level folders app/, backend/, tools/ to mkcode.app, mkcode.backend, mkcode.tools.

pyproject.toml holds the metadata; this file only computes the package list so that new
subpackages need no edit here.
"""

from setuptools import find_packages, setup

package_dir = {}
packages = []
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
    # The chat templates, and the demo model's checkpoint (weights, tokenizer, SHA256SUMS, REPORT.md).
    package_data={"mkcode.backend": ["**/*.jinja"], "mkcode.backend.demo": ["checkpoint/*"]},
)
