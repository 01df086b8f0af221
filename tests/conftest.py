"""Shared test fixtures. Every kernel test runs on each available device: CPU always, CUDA
when a GPU is present (the CUDA parameter is then added, never skipped on CPU machines)."""
import os

import pytest
import torch

import dsv4_ops  # noqa: F401  (registers torch.ops.dsv4)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    # An indexed CUDA device, so that `tensor.device == device` holds for tensors made on it.
    return torch.device("cuda", 0) if request.param == "cuda" else torch.device("cpu")


@pytest.fixture
def debug_mode():
    """dsv4_ops's debug mode (the data-dependent checks of dsv4_ops.validate) for one test."""
    dsv4_ops.set_debug(True)
    yield
    dsv4_ops.set_debug(False)


def pytest_report_header(config):
    lib = dsv4_ops.ops._library
    built = ", ".join(f"{k} {v}" for k, v in lib.BUILD_RECORD.items() if v)
    return f"dsv4_ops devices: {DEVICES}; library: {lib.LIBRARY_PATH} ({built})"


# Hypothesis: a fixed, CI-friendly budget unless overridden (DSV4_HYPOTHESIS_EXAMPLES).
try:
    from hypothesis import settings

    settings.register_profile("dsv4", max_examples=int(os.environ.get("DSV4_HYPOTHESIS_EXAMPLES", "25")),
                              deadline=None, derandomize=True)
    settings.load_profile("dsv4")
except ImportError:  # hypothesis is a test dependency; the property tests import it themselves
    pass
