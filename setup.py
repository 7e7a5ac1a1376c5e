from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent

setup(
    name="sglang-hostsync-plugin",
    version="0.1.0",
    description=("Out-of-tree SGLang plugin that removes per-step host<->device syncs and host allocations "
                 "from speculative decoding under spec-v2 overlap, one switchable slot per optimization"),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    # SGLang's license; the full text is LICENSE (in the sdist and the wheel's metadata).
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Environment :: GPU :: NVIDIA CUDA",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=[*find_packages(include=["sglang_hostsync_plugin", "sglang_hostsync_plugin.*"]),
              "sglang_hostsync_plugin._csrc"],
    # csrc/ ships inside the package; its kernels are built on first use.
    package_dir={"sglang_hostsync_plugin._csrc": "csrc"},
    package_data={"sglang_hostsync_plugin._csrc": ["*.cu", "*.md"]},
    python_requires=">=3.10",
    # sglang is deliberately not a requirement: its full tree is ~11 GB of GPU
    # packages. The supported release (0.5.23) is checked at runtime.
    install_requires=["pluggy>=1.5", "numpy"],
    entry_points={
        "sglang.srt.plugins": ["hostsync = sglang_hostsync_plugin:register"],
        "console_scripts": ["sglang-hostsync = sglang_hostsync_plugin.doctor:main"],
    },
)
