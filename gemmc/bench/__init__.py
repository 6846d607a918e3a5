"""The benchmark harness: gemmc against cuBLAS, and the recorded schedule-sweep dataset."""
from .dataset import load_dataset, write_dataset  # noqa: F401
from .suites import Shape, get_suite, load_shapes, parse_shapes  # noqa: F401
