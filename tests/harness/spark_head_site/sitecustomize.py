"""On PYTHONPATH only while test_spark runs (tests/harness/spark_head.py): Ray on Spark's head
start in this process without its fixed 20 s wait, once ray.util.spark.cluster_init is imported."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_rayflow_tests_spark_head", Path(__file__).parents[1] / "spark_head.py"
)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.install_import_hook()
