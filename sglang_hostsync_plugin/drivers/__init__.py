"""Stock-vs-plugin drivers: each owned slot's SGLang code path on real SGLang 0.5.23
objects (built without their model-loading ``__init__`` where needed). The tests and
``python -m sglang_hostsync_plugin.bench`` share them. Importing a driver imports SGLang."""
