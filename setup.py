from setuptools import find_packages, setup

setup(
    name="sglang-hostsync-plugin",
    version="0.1.0",
    description="SGLang plugin: no per-step host syncs in speculative decoding (spec-v2 overlap)",
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
